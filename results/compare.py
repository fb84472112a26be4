"""McNemar's test between two rows of the results table on their test predictions.

A row is named by its model configuration (``rocktaschel/attention hidden_size=100``) when that is
unique among the table's rows, else as ``EXPERIMENT:MODEL_CONFIG``. Each row is represented by
its ``selected_run_id`` (the selected configuration's best seed on dev) and that run's
predictions artifact; the two files must cover the same test examples with the same gold labels
and class names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from results.predictions import read_predictions
from results.results_errors import ResultsError
from results.stats import McNemarResult, mcnemar


def row_name(row: pd.Series) -> str:
    return f"{row['experiment']}:{row['model_config']}"


def resolve_row(results: pd.DataFrame, name: str) -> pd.Series:
    hits = [row for _, row in results.iterrows() if name in (row["model_config"], row_name(row))]
    if len(hits) != 1:
        problem = "is ambiguous" if hits else "names no row"
        rows = "; ".join(row_name(row) for _, row in results.iterrows())
        raise ResultsError(f"{name!r} {problem}; rows (EXPERIMENT:MODEL_CONFIG): {rows}")
    return hits[0]


@dataclass(frozen=True)
class PairedComparison:
    first: str  # row names
    second: str
    examples: int
    test: McNemarResult


def compare_predictions(
    first: str, first_path: Path, second: str, second_path: Path
) -> PairedComparison:
    a, b = read_predictions(first_path), read_predictions(second_path)
    if set(a.index) != set(b.index):
        raise ResultsError(f"{first} and {second} were scored on different test examples")
    b = b.loc[a.index]
    if not ((a["label"] == b["label"]).all() and (a["label_name"] == b["label_name"]).all()):
        raise ResultsError(
            f"{first} and {second} disagree on gold labels or class names: not the same test data"
        )
    a_right = a["prediction"] == a["label"]
    b_right = b["prediction"] == b["label"]
    test = mcnemar(int((a_right & ~b_right).sum()), int((~a_right & b_right).sum()))
    return PairedComparison(first, second, len(a), test)


def describe_comparison(result: PairedComparison) -> str:
    test = result.test
    statistic = "" if test.statistic is None else f", chi2 = {test.statistic:.4f}"
    return (
        f"McNemar test, {result.first} vs {result.second} on {result.examples} test examples\n"
        f"  only {result.first} correct: {test.only_a_correct}\n"
        f"  only {result.second} correct: {test.only_b_correct}\n"
        f"  {test.method}{statistic}, p = {test.p_value:.4g}\n"
    )
