"""The named corpora: which reader reads them and where each split's file lies in a data dir.

The paths are those of the official archives unpacked into the data dir (``download_corpus``
does that), which is also the layout of ``../shared/data`` on the development machines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nli_models.data.readers import (
    NLI_LABELS,
    RTE_LABELS,
    SCITAIL_LABELS,
    read_multinli,
    read_rte,
    read_scitail,
    read_sick,
    read_snli,
)
from nli_models.data.records import NLISplit


@dataclass(frozen=True)
class CorpusSpec:
    name: str
    reader: Callable[[Path, str], NLISplit]  # (file, split name) -> split
    files: dict[str, str]  # split name -> path relative to the data dir
    labels: tuple[str, ...]


CORPORA: dict[str, CorpusSpec] = {
    spec.name: spec
    for spec in (
        CorpusSpec(
            "snli",
            read_snli,
            {split: f"snli_1.0/snli_1.0_{split}.jsonl" for split in ("train", "dev", "test")},
            NLI_LABELS,
        ),
        # MultiNLI's test labels are hidden (Kaggle); as is usual, dev_matched serves as the dev
        # split and dev_mismatched as the test split.
        CorpusSpec(
            "multinli",
            read_multinli,
            {
                "train": "multinli_1.0/multinli_1.0_train.jsonl",
                "dev": "multinli_1.0/multinli_1.0_dev_matched.jsonl",
                "test": "multinli_1.0/multinli_1.0_dev_mismatched.jsonl",
            },
            NLI_LABELS,
        ),
        # One file; read_sick picks the SemEval_set of the split (TRAIN / TRIAL / TEST).
        CorpusSpec(
            "sick", read_sick, dict.fromkeys(("train", "dev", "test"), "sick/SICK.txt"), NLI_LABELS
        ),
        CorpusSpec(
            "scitail",
            read_scitail,
            {
                split: f"SciTailV1.1/tsv_format/scitail_1.0_{split}.tsv"
                for split in ("train", "dev", "test")
            },
            SCITAIL_LABELS,
        ),
        # GLUE RTE is not downloaded by this project (GLUE's own test split has no labels); the
        # files are expected under rte/ in the data dir.
        CorpusSpec(
            "rte",
            read_rte,
            {split: f"rte/{split}.tsv" for split in ("train", "dev", "test")},
            RTE_LABELS,
        ),
    )
}
