"""The test-predictions artifact (``predictions/test_predictions.parquet``) of a selected run.

Columns: ``index`` (position of the example in the test split), ``label`` (gold class id),
``prediction`` (predicted class id), all integers, and ``label_name`` (the gold class's name).
The name travels per row rather than as a label list in the schema metadata because that is what
the sweep writes (``orchestrator.sweep.protocol._predictions_table``); it is enough to check that two
files share one class encoding: aligned on ``index``, their (label, label_name) pairs must agree.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from results.results_errors import ResultsError

COLUMNS = ("index", "label", "prediction", "label_name")


def read_predictions(path: str | Path) -> pd.DataFrame:
    """The predictions indexed by ``index``; ResultsError if it is not a predictions file."""
    table = pq.read_table(path)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ResultsError(
            f"{path}: not a predictions file, missing column(s) {', '.join(missing)}"
        )
    frame = table.select(list(COLUMNS)).to_pandas().set_index("index")
    if not frame.index.is_unique:
        raise ResultsError(f"{path}: duplicate example indices")
    return frame


def majority_class(frame: pd.DataFrame) -> tuple[str, float]:
    """The most frequent gold class of a predictions file and its share of the examples: the
    accuracy of always predicting it (the majority-class baseline, taken on the test split
    itself because the run records hold no training label counts). On a tie no class is the
    majority: the name lists the tied classes, "a / b tied" (the share is the same for each)."""
    counts = frame["label_name"].value_counts()
    tied = sorted(str(name) for name in counts[counts == counts.max()].index)
    name = tied[0] if len(tied) == 1 else " / ".join(tied) + " tied"
    return name, float(counts.max() / len(frame))
