"""Published results of the four reproduced papers, as data (their comparison with the results
table: results/published.py).

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

``PROTOCOLS`` holds every setting each paper states about how it trained; ``REPRODUCTIONS`` the
known public reproductions of a row (results/published.py compares both with our rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from results.formats import PAPER_NAMES
from results.params import parse_param


def vectors_stem(name: str) -> str:
    """A vectors file's name without its archive or text suffix.

    Args:
        name: the file's name, e.g. glove.840B.300d.zip (-> glove.840B.300d).
    """
    for suffix in (".zip", ".txt", ".vec", ".bin"):
        name = name.removesuffix(suffix)
    return name


def show_setting(value: object) -> str:
    """A setting as the comparison prints it.

    Args:
        value: ours (a param's text, parsed first: '4439' -> 4,439) or the paper's.
    """
    if isinstance(value, OneOf | Present | VectorsFile | AtLeast):
        return str(value)
    value = parse_param(value)  # tag values are text: '4439' -> 4,439, 'False' -> false
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "None"
    return f"{value:,}" if isinstance(value, int) else str(value)


@dataclass(frozen=True)
class PublishedRow:
    table: str  # e.g. "Table 1"
    row: str  # the row as the paper labels it
    dataset: str
    match: Mapping[str, object]  # params that identify the row among ours
    values: Mapping[str, float]  # metric -> published value (accuracies in percent)
    note: str = ""
    setup: Mapping[str, object] = field(default_factory=dict)  # settings stated for this row alone
    runnable: bool = True  # false: the published system has parts this code does not run


@dataclass(frozen=True)
class OneOf:
    """A setting the paper searched over: any of its values is the paper's (it tuned on dev)."""

    values: tuple[object, ...]

    def __str__(self) -> str:
        return "one of " + ", ".join(show_setting(v) for v in self.values)


@dataclass(frozen=True)
class VectorsFile:
    """Word vectors by what the file holds, not only its name: the published file (compared
    without its extension), its word count and dimension. A run's also has its SHA-256 (None for
    the papers' files: their hashes are not recorded here, so words and dimension identify them)."""

    name: str
    words: int | None
    dim: int | None
    sha256: str | None = None

    def __str__(self) -> str:
        if self.words is None:
            return f"{self.name}: {self.dim}-d, word count and content hash not recorded"
        held = f"{self.name}: {self.words:,} words, {self.dim}-d"
        return held + (f", sha256 {self.sha256[:12]}" if self.sha256 else "")

    def same_file(self, ours: object) -> bool:
        return (
            isinstance(ours, VectorsFile)
            and vectors_stem(ours.name) == self.name
            and (ours.words, ours.dim) == (self.words, self.dim)
        )


@dataclass(frozen=True)
class AtLeast:
    """A share every paper's setup reaches without stating it (its vectors' coverage of the
    vocabulary): any share from ``floor`` up is the paper's."""

    floor: float
    why: str

    def __str__(self) -> str:
        return f"at least {self.floor:.0%}: {self.why}"


@dataclass(frozen=True)
class Present:
    """A part the paper uses without a value to compare (a delimiter token): any value but
    None is the paper's."""

    what: str

    def __str__(self) -> str:
        return self.what


NOT_COMPARED = object()  # in a row's setup: a paper-wide setting that does not apply to the row


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


def _parikh(label, variant, lr, train, test, theta_m, neutral, entailment, contradiction):
    match = {"model": "decomposable", "variant": variant, "hidden_size": 200}
    setup = {"lr": lr}  # §5.1: "0.05-vanilla, 0.025-intra-attention"
    table1 = {"train_accuracy": train, "test_accuracy": test, "theta_m": theta_m}
    table2 = {
        "dev_accuracy.neutral": neutral,
        "dev_accuracy.entailment": entailment,
        "dev_accuracy.contradiction": contradiction,
    }
    return (
        PublishedRow("Table 1", label, "snli", match, table1, setup=setup),
        PublishedRow(
            "Table 2",
            label,
            "snli",
            match,
            table2,
            "dev-set breakdown (dev_accuracy.<label> of the selected runs)",
            setup,
        ),
    )


# fmt: off
PARIKH2016 = tuple(published for row in (
    # label, variant, lr (§5.1), Table 1: train, test, |θ|M; Table 2 (dev): N, E, C
    ("Our approach (vanilla)", "vanilla", 0.05, 89.5, 86.3, 382e3, 83.6, 91.3, 85.8),
    ("Our approach with intra-sentence attention", "intra", 0.025, 90.5, 86.8, 582e3, 83.7, 92.1, 86.7),
) for published in _parikh(*row))
# fmt: on


# Table 2 (TE): lr and ℓ2 per ABCNN row; filter width 3 for every TE row. BCNN has no Table 2 row.
TABLE2_TE = {
    ("abcnn1", 1): (0.08, 0.0006),
    ("abcnn1", 2): (0.085, 0.0006),
    ("abcnn2", 1): (0.09, 0.00065),
    ("abcnn2", 2): (0.085, 0.0007),
    ("abcnn3", 1): (0.09, 0.0007),
    ("abcnn3", 2): (0.09, 0.0007),
}


def _yin(table, label, variant, num_blocks, accuracy, note) -> PublishedRow:
    match = {"model": "abcnn", "variant": variant, "num_blocks": num_blocks}
    setup = {}
    if (variant, num_blocks) in TABLE2_TE:
        lr, l2 = TABLE2_TE[variant, num_blocks]
        setup = {"lr": lr, "l2": l2, "filter_width": 3}
    if num_blocks == 1:
        setup["layerwise"] = NOT_COMPARED  # one block: layerwise training is a no-op
    return PublishedRow(
        table, label, "sick", match, {"test_accuracy": accuracy}, note, setup, note != _FEATURES
    )


_FEATURES = (
    "uses 24 linguistic features and an SVM/LR on the scores (§5.4), which we do not compute: "
    "not like-for-like with the networks alone; compare with footnote 9"
)
_NO_FEATURES = (
    "the like-for-like target: no linguistic features; the NONOVER copy of §5.4 is kept (we run "
    "it: model.args.nonover), the SVM/LR on the scores is not said to be dropped (we do not run it)"
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
    # "scale" is our reading of the repeated r_p, r_h (docs/fidelity.md): the literal "repeat"
    # makes inter-attention uniform; inter_only has no intra-attention to read.
    setup = {"intra_output": None if variant == "inter_only" else "scale"}
    return PublishedRow(table, label, dataset, match, values, setup=setup)


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
# Every setting each paper states, in the names of a run's protocol fingerprint
# (run_schema.PROTOCOL_FIELDS), of its logged params (model and training hyperparameters) and of
# what our_setup derives (steps_trained, vectors_tuned); only what the paper states is listed, and
# all of it is compared. Vector files are compared by name without their extension
# (glove.840B.300d.zip = glove.840B.300d.txt), word count and dimension (the published files:
# GloVe 840B's 2,196,017 lines, word2vec GoogleNews's header "3000000 300"). The dev and test
# sets are the official splits in full (data/README of shared data: SNLI 9,842 / 9,824 after
# dropping '-' labels, SICK TRIAL / TEST 495 / 4,906, SciTail 1,304 / 2,126).
_SNLI_TRAIN = {
    "corpus": "snli",
    "train_file": "snli_1.0_train.jsonl",
    "train_size": 549_367,
    "dev_size": 9_842,
    "test_size": 9_824,
}
# No paper states its coverage; each used a general English vector set, which covers nearly all
# of a corpus's words (GloVe 6B 50d: 99.2% of SICK's vocabulary, 99.3% of the SNLI train
# sample's, measured here). Below half, the file is not such a set, whatever its name.
_COVERAGE = {
    "vector_coverage": AtLeast(
        0.5, "the papers' general English vectors cover nearly all of a corpus's words"
    )
}
_GLOVE_840B = {"vectors": VectorsFile("glove.840B.300d", 2_196_017, 300), **_COVERAGE}
_WORD2VEC = {"vectors": VectorsFile("GoogleNews-vectors-negative300", 3_000_000, 300), **_COVERAGE}
_CAM = {  # §IV "Hyperparameters": GloVe "to initialize the word embeddings" (so tuned)
    **_GLOVE_840B,
    "vectors_policy": "train_oov",  # OOV U(-0.05, 0.05)
    "vectors_tuned": True,
    "optimizer": "adam",
    "lr": 0.001,
    "batch_size": OneOf((32, 256, 512)),
    "l2": OneOf((1e-4, 1e-5)),
}
PROTOCOLS: dict[tuple[str, str], Mapping[str, object]] = {
    ("rocktaschel2016", "snli"): {  # §2.2.1 delimiter; §3 grid, ADAM; §4 word2vec not tuned
        **_SNLI_TRAIN,
        **_WORD2VEC,
        "vectors_policy": "train_oov",  # footnote 1: OOV words of train random, tuned
        "vectors_tuned": False,
        "optimizer": "adam",
        "lr": OneOf((1e-4, 3e-4, 1e-3)),
        "dropout": OneOf((0.0, 0.1, 0.2)),
        "l2": OneOf((0.0, 1e-4, 3e-4, 1e-3)),
        "delimiter_id": Present("a delimiter token read before the hypothesis"),
    },
    ("parikh2016", "snli"): {  # §5.1
        **_SNLI_TRAIN,
        **_GLOVE_840B,
        "vectors_policy": "hashed_oov",
        "vectors_tuned": False,
        "optimizer": "adagrad",
        "steps_trained": 50_000_000,  # "All settings were run for 50 million steps"
        "patience": None,  # the best-dev model of the whole run is kept: no early stopping
        "batch_size": 4,
        "init": "gaussian_0.01",
        "projection_dim": 200,
        "dropout": 0.2,
    },
    ("yin2016", "sick"): {  # §5.1, §5.1.2, Table 2 (50 kernels), §5.4
        "corpus": "sick",
        "train_file": "SICK.txt",
        "train_size": 4_439,
        "dev_size": 495,
        "test_size": 4_906,
        **_WORD2VEC,
        "vectors_policy": "single_unk",
        "vectors_tuned": False,
        "optimizer": "adagrad",
        "hidden_size": 50,
        "layerwise": True,
        "refit_on_train_dev": True,
        "nonover": True,  # §5.4: "we run two copies of each network, one for ORIG, one for NONOVER"
    },
    ("gajbhiye2018", "snli"): {
        **_SNLI_TRAIN,
        **_CAM,
        "dropout": 0.4,  # "only to the input of BiLSTM layer for SNLI"
        "dropout_at": "bilstm_input",
    },
    ("gajbhiye2018", "scitail"): {
        "corpus": "scitail",
        "train_file": "scitail_1.0_train.tsv",
        "train_size": 23_596,
        "dev_size": 1_304,
        "test_size": 2_126,
        **_CAM,
        "dropout": 0.3,  # "to each feed forward connection ... for SciTail"
        "dropout_at": "feed_forward",
    },
}

# Known public reproductions of a published row (accuracy on the same test set), keyed by
# (paper, model params that identify the row); papers listed in NO_REPRODUCTION have none known.
REPRODUCTIONS: tuple[tuple[str, Mapping[str, object], str], ...] = (
    # dmlc/gluon-nlp scripts/natural_language_inference/index.rst; its intra-sentence attention
    # (decomposable_attention.py) has no distance bias, as that page says.
    ("parikh2016", {"variant": "vanilla"}, "GluonNLP 85.0"),
    ("parikh2016", {"variant": "intra"}, "GluonNLP 85.5 (without eq. 7's distance bias)"),
    (  # its README at commit 09bea44 (an older README reported 82.31)
        "rocktaschel2016",
        {"variant": "word_by_word", "two_way": False},
        "junfenglx/reasoning_attention (Lasagne) 83.29 after 41 epochs",
    ),
)
NO_REPRODUCTION = {
    "gajbhiye2018": "none known",
    "yin2016": "none known on SICK",
}


PAPERS: dict[str, tuple[PublishedRow, ...]] = {
    "rocktaschel2016": ROCKTASCHEL2016,
    "parikh2016": PARIKH2016,
    "yin2016": YIN2016,
    "gajbhiye2018": GAJBHIYE2018,
}
assert tuple(PAPERS) == PAPER_NAMES, "results.formats.PAPER_NAMES lists these papers for the CLI"
