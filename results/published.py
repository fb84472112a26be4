"""Published results of the four reproduced papers, and their comparison with the results table.

Numbers are transcribed from the text extractions in ``shared/papers/`` (file and table named on
each row). Accuracies are percentages as printed; parameter counts are the printed rounded
values (3.9M -> 3_900_000). Only rows a registered model can reproduce are listed (baselines such
as Bowman et al.'s LSTM are not).

* rocktaschel2016 (rocktaschel2016_reasoning_about_entailment.md), Table 1, SNLI: k, |θ|W+M, |θ|M,
  train, dev and test accuracy.
* parikh2016 (parikh2016_decomposable_attention.md), Table 1, SNLI: train and test accuracy and
  parameters excluding embeddings (|θ|M); Table 2: per-class accuracy on the SNLI *dev* set,
  compared with ``dev_accuracy.<label>``, which the sweep logs on the selected runs.
  Hidden size 200 is the network size of §5.1.
* yin2016 (yin2016_abcnn.md), Table 6, SICK accuracy; one-conv / two-conv are num_blocks 1 / 2.
  In the extraction each model name sits on its *second* line (e.g. "BCNN two-conv 85.0" follows
  "one-conv 84.8"), the order of the published table. These systems add 24 linguistic features
  and an SVM/LR on top; footnote 9 gives ABCNN-3 two-conv without the features, listed too.
* gajbhiye2018 (gajbhiye2018_cam.md), Table II (SNLI train/test), Table III (SciTail test) and
  Table IV (ablation, SciTail and SNLI test). Hidden size is 300 on SNLI and 100 on SciTail (§IV),
  which is what tells the two datasets' rows apart.

Matching: a published row's ``match`` names params; one of our rows matches when each of those
params, as logged for its selected configuration, equals the published value (numbers
numerically, booleans case-insensitively; see ``results.params.same_value``) and its corpus (tag
nli.corpus) is the published row's dataset.

Protocols: ``PROTOCOLS`` holds what each paper states about how it trained (training file and
size, vectors, optimiser, budget, initialisation, batch size, layerwise training, refit), in the
fields of a run's protocol fingerprint; ``protocol_differences`` lists where a run departs from
it. ``REPRODUCTIONS`` holds known public reproductions of a row (results.paper_table shows both).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from results.formats import PAPER_NAMES
from results.params import same_value
from results.run_schema import CLASS_ACCURACY_PREFIX, DEV_CLASS_ACCURACY_PREFIX
from results.schema import arrow_table, describe, table_columns

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `orchestrate --help` must not load pandas
    import pyarrow as pa

ACCURACY = ("train_accuracy", "dev_accuracy", "test_accuracy")
# Our train accuracy is a running average over training batches (run_schema), the papers' an
# evaluation: compared all the same, with the difference listed.
OUR_COLUMN = {"train_accuracy": "train_accuracy_running"}
PARAMETER_COUNTS = ("theta_wm", "theta_m")


@dataclass(frozen=True)
class PublishedRow:
    table: str  # e.g. "Table 1"
    row: str  # the row as the paper labels it
    dataset: str
    match: Mapping[str, object]  # params that identify the row among ours
    values: Mapping[str, float]  # metric -> published value (accuracies in percent)
    note: str = ""


def _rocktaschel(label, variant, k, arch, theta_wm, theta_m, train, dev, test) -> PublishedRow:
    return PublishedRow(
        "Table 1",
        label,
        "snli",
        {"model": "rocktaschel", "variant": variant, "hidden_size": k, **arch},
        {
            "theta_wm": theta_wm,
            "theta_m": theta_m,
            "train_accuracy": train,
            "dev_accuracy": dev,
            "test_accuracy": test,
        },
    )


# fmt: off
ROCKTASCHEL2016 = tuple(_rocktaschel(*row) for row in (
    # label, variant, k, architecture params, |θ|W+M, |θ|M, train, dev, test
    ("Conditional encoding, shared, k=100", "conditional", 100, {"shared_encoder": True}, 3.8e6, 111e3, 83.7, 81.9, 80.9),
    ("Conditional encoding, shared, k=159", "conditional", 159, {"shared_encoder": True}, 3.9e6, 252e3, 84.4, 83.0, 81.4),
    ("Conditional encoding, k=116", "conditional", 116, {"shared_encoder": False}, 3.9e6, 252e3, 83.5, 82.1, 80.9),
    ("Attention, k=100", "attention", 100, {"two_way": False}, 3.9e6, 242e3, 85.4, 83.2, 82.3),
    ("Attention, two-way, k=100", "attention", 100, {"two_way": True}, 3.9e6, 242e3, 86.5, 83.0, 82.4),
    ("Word-by-word attention, k=100", "word_by_word", 100, {"two_way": False}, 3.9e6, 252e3, 85.3, 83.7, 83.5),
    ("Word-by-word attention, two-way, k=100", "word_by_word", 100, {"two_way": True}, 3.9e6, 252e3, 86.6, 83.6, 83.2),
))
# fmt: on


def _parikh(label, variant, train, test, theta_m, neutral, entailment, contradiction):
    match = {"model": "decomposable", "variant": variant, "hidden_size": 200}
    table1 = {"train_accuracy": train, "test_accuracy": test, "theta_m": theta_m}
    table2 = {
        "dev_accuracy.neutral": neutral,
        "dev_accuracy.entailment": entailment,
        "dev_accuracy.contradiction": contradiction,
    }
    return (
        PublishedRow("Table 1", label, "snli", match, table1),
        PublishedRow(
            "Table 2",
            label,
            "snli",
            match,
            table2,
            "dev-set breakdown (dev_accuracy.<label> of the selected runs)",
        ),
    )


# fmt: off
PARIKH2016 = tuple(published for row in (
    # label, variant, Table 1: train, test, |θ|M; Table 2 (dev): N, E, C
    ("Our approach (vanilla)", "vanilla", 89.5, 86.3, 382e3, 83.6, 91.3, 85.8),
    ("Our approach with intra-sentence attention", "intra", 90.5, 86.8, 582e3, 83.7, 92.1, 86.7),
) for published in _parikh(*row))
# fmt: on


def _yin(table, label, variant, num_blocks, accuracy, note) -> PublishedRow:
    match = {"model": "abcnn", "variant": variant, "num_blocks": num_blocks}
    return PublishedRow(table, label, "sick", match, {"test_accuracy": accuracy}, note)


_FEATURES = (
    "uses 24 linguistic features, a NONOVER copy of the network and an SVM/LR on the scores "
    "(§5.4): not like-for-like with the neural network alone; compare with footnote 9"
)
_NO_FEATURES = (
    "the like-for-like target: no linguistic features (the NONOVER copy and SVM/LR of §5.4 "
    "are not said to be dropped)"
)

# fmt: off
YIN2016 = tuple(_yin(*row) for row in (
    # table, label, variant, num_blocks, SICK test accuracy, note
    ("Table 6", "BCNN one-conv", "bcnn", 1, 84.8, _FEATURES),
    ("Table 6", "BCNN two-conv", "bcnn", 2, 85.0, _FEATURES),
    ("Table 6", "ABCNN-1 one-conv", "abcnn1", 1, 85.6, _FEATURES),
    ("Table 6", "ABCNN-1 two-conv", "abcnn1", 2, 85.8, _FEATURES),
    ("Table 6", "ABCNN-2 one-conv", "abcnn2", 1, 85.7, _FEATURES),
    ("Table 6", "ABCNN-2 two-conv", "abcnn2", 2, 85.8, _FEATURES),
    ("Table 6", "ABCNN-3 one-conv", "abcnn3", 1, 86.0, _FEATURES),
    ("Table 6", "ABCNN-3 two-conv", "abcnn3", 2, 86.2, _FEATURES),
    ("Table 6, footnote 9", "ABCNN-3 two-conv, no linguistic features", "abcnn3", 2, 84.6, _NO_FEATURES),
))
# fmt: on


def _cam(table, label, variant, dataset, values) -> PublishedRow:
    hidden_size = {"snli": 300, "scitail": 100}[dataset]
    match = {"model": "cam", "variant": variant, "hidden_size": hidden_size}
    return PublishedRow(table, label, dataset, match, values)


# fmt: off
GAJBHIYE2018 = tuple(_cam(*row) for row in (
    # table, label, variant, dataset, published values
    ("Table II", "300D CAM (Our Approach)", "full", "snli", {"train_accuracy": 90.5, "test_accuracy": 86.1}),
    ("Table III", "CAM (our approach)", "full", "scitail", {"test_accuracy": 77.2}),
    ("Table IV", "Combined Attention (SciTail)", "full", "scitail", {"test_accuracy": 77.23}),
    ("Table IV", "Intra-attention-only (SciTail)", "intra_only", "scitail", {"test_accuracy": 75.49}),
    ("Table IV", "Inter-attention-only (SciTail)", "inter_only", "scitail", {"test_accuracy": 76.06}),
    ("Table IV", "Combined Attention (SNLI)", "full", "snli", {"test_accuracy": 86.14}),
    ("Table IV", "Intra-attention-only (SNLI)", "intra_only", "snli", {"test_accuracy": 80.27}),
    ("Table IV", "Inter-attention-only (SNLI)", "inter_only", "snli", {"test_accuracy": 85.04}),
))
# fmt: on

# -- the papers' protocols ------------------------------------------------------------------
# What each paper trained on and how, in the terms of a run's protocol fingerprint
# (run_schema.PROTOCOL_FIELDS); only what the paper states is listed, and only that is compared.
# Vector files are compared without their extension (glove.840B.300d.zip = glove.840B.300d.txt).
_SNLI_TRAIN = {"corpus": "snli", "train_file": "snli_1.0_train.jsonl", "train_size": 549_367}
PROTOCOLS: dict[tuple[str, str], Mapping[str, object]] = {
    ("rocktaschel2016", "snli"): {  # §3: word2vec fixed, OOV tuned; ADAM
        **_SNLI_TRAIN,
        "vectors": "GoogleNews-vectors-negative300",
        "vectors_dim": 300,
        "vectors_policy": "train_oov",
        "optimizer": "adam",
    },
    ("parikh2016", "snli"): {  # §5.1
        **_SNLI_TRAIN,
        "vectors": "glove.840B.300d",
        "vectors_dim": 300,
        "vectors_policy": "hashed_oov",
        "optimizer": "adagrad",
        "max_steps": 50_000_000,
        "batch_size": 4,
        "init": "gaussian_0.01",
    },
    ("yin2016", "sick"): {  # §5.1, §5.1.2, §5.4
        "corpus": "sick",
        "train_file": "SICK.txt",
        "train_size": 4_439,
        "vectors": "GoogleNews-vectors-negative300",
        "vectors_dim": 300,
        "vectors_policy": "single_unk",
        "optimizer": "adagrad",
        "layerwise": True,
        "refit_on_train_dev": True,
    },
    ("gajbhiye2018", "snli"): {  # §IV, Table I
        **_SNLI_TRAIN,
        "vectors": "glove.840B.300d",
        "vectors_dim": 300,
        "vectors_policy": "train_oov",
        "optimizer": "adam",
        "lr": 0.001,
    },
    ("gajbhiye2018", "scitail"): {
        "corpus": "scitail",
        "train_file": "scitail_1.0_train.tsv",
        "train_size": 23_596,
        "vectors": "glove.840B.300d",
        "vectors_dim": 300,
        "vectors_policy": "train_oov",
        "optimizer": "adam",
        "lr": 0.001,
    },
}

# Known public reproductions of a published row (accuracy on the same test set), keyed by
# (paper, model params that identify the row); papers listed in NO_REPRODUCTION have none known.
REPRODUCTIONS: tuple[tuple[str, Mapping[str, object], str], ...] = (
    ("parikh2016", {"variant": "vanilla"}, "GluonNLP 85.0"),
    ("parikh2016", {"variant": "intra"}, "GluonNLP 85.5"),
    (
        "rocktaschel2016",
        {"variant": "word_by_word", "two_way": False},
        "junfenglx/reasoning_attention (Lasagne) 82.3",
    ),
)
NO_REPRODUCTION = {
    "gajbhiye2018": "none known",
    "yin2016": "none known on SICK",
}


def reproductions(paper: str, published: PublishedRow) -> str:
    found = [
        text
        for key, match, text in REPRODUCTIONS
        if key == paper and all(published.match.get(k) == v for k, v in match.items())
    ]
    return "; ".join(found) or NO_REPRODUCTION.get(paper, "none listed")


def protocol_differences(
    paper: str, dataset: str, fingerprint: Mapping[str, str] | None
) -> list[str]:
    """Every way a run's protocol fingerprint (tag values, as text) differs from what the paper
    states; a run without a fingerprint differs in being unknown."""
    if fingerprint is None:
        return ["protocol not recorded (the run predates protocol fingerprints)"]
    differences = []
    for field, theirs in PROTOCOLS.get((paper, dataset), {}).items():
        ours = fingerprint.get(field)
        if not _same_protocol_value(field, ours, theirs):
            differences.append(f"{field} {_show(ours)} (paper {_show(theirs)})")
    return differences


def _same_protocol_value(field: str, ours: str | None, theirs: object) -> bool:
    if ours is None:
        return False
    if field == "vectors":
        return _stem(ours) == theirs
    return same_value(theirs, ours)


def _stem(name: str) -> str:
    for suffix in (".zip", ".txt", ".vec", ".bin"):
        name = name.removesuffix(suffix)
    return name


def _show(value: object) -> str:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return value
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:,}" if isinstance(value, int) else str(value)


PAPERS: dict[str, tuple[PublishedRow, ...]] = {
    "rocktaschel2016": ROCKTASCHEL2016,
    "parikh2016": PARIKH2016,
    "yin2016": YIN2016,
    "gajbhiye2018": GAJBHIYE2018,
}
assert tuple(PAPERS) == PAPER_NAMES, "results.formats.PAPER_NAMES lists these papers for the CLI"

COLUMNS = table_columns("comparison")

__doc__ += "\nComparison table columns (one row per published value and matching row of ours):\n\n"
__doc__ += describe(COLUMNS)


def comparison_table(
    results: pd.DataFrame, paper: str, incomplete: Mapping[str, str] | None = None
) -> pa.Table:
    """Every published value of ``paper`` beside each of our rows (the results table) that
    matches it, or beside nulls when none does: published rows are never dropped.
    ``incomplete`` (experiment -> why) marks, in the note, our rows from unfinished sweeps."""
    incomplete = incomplete or {}
    ours = [(row, json.loads(row["hyperparameters"])) for _, row in results.iterrows()]
    rows = []
    for published in PAPERS[paper]:
        matching = [
            row
            for row, params in ours
            if matches_row(published.match, params) and same_corpus(row, published.dataset)
        ]
        for metric, value in published.values.items():
            for row in matching or [None]:
                mine = None if row is None else our_value(row, metric)
                rows.append(
                    {
                        "paper": paper,
                        "table": published.table,
                        "row": published.row,
                        "dataset": published.dataset,
                        "metric": metric,
                        "published": value,
                        "experiment": None if row is None else row["experiment"],
                        "model_config": None if row is None else row["model_config"],
                        "ours": mine,
                        "difference": None if mine is None else mine - value,
                        "note": _note(published.note, row, incomplete),
                    }
                )
    return arrow_table(rows, COLUMNS, "comparison", paper=paper)


def _note(note: str | None, row: pd.Series | None, incomplete: Mapping[str, str]) -> str | None:
    if row is None or row["experiment"] not in incomplete:
        return note
    mark = f"INCOMPLETE: {incomplete[row['experiment']]}"
    return f"{note}; {mark}" if note else mark


def same_corpus(row: pd.Series, dataset: str) -> bool:
    import pandas as pd

    corpus = row.get("corpus")
    return corpus is None or pd.isna(corpus) or corpus == dataset  # untagged rows still match


def matches_row(match: Mapping[str, object], params: Mapping[str, object]) -> bool:
    return all(key in params and same_value(value, params[key]) for key, value in match.items())


def our_value(row: pd.Series, metric: str) -> float | None:
    """Our value of ``metric`` in the published unit (percent for accuracies); None if unknown."""
    import pandas as pd

    if metric in ACCURACY:
        value = 100 * row[OUR_COLUMN.get(metric, metric)]
    elif metric in PARAMETER_COUNTS:
        value = row[metric]
    else:
        for prefix, column in (
            (CLASS_ACCURACY_PREFIX, "test_accuracy_per_class"),
            (DEV_CLASS_ACCURACY_PREFIX, "dev_accuracy_per_class"),
        ):
            if metric.startswith(prefix) and isinstance(row[column], str):
                per_class = json.loads(row[column])
                value = 100 * per_class.get(metric.removeprefix(prefix), math.nan)
                break
        else:
            return None
    return None if pd.isna(value) else float(value)
