"""``orchestrate results --paper P``: our rows beside the paper's, as the paper prints them.

One row per published result with a test accuracy and each of our rows that matches it (or none):
the paper's label, |θ|M, train / dev / test accuracy, the published test accuracy, the
difference, the known public reproductions of that row, and every way our run's protocol differs
from the paper's (``results.published.PROTOCOLS``). A row with any difference is marked not
comparable: its Δ measures the protocol as much as the model.

Our train accuracy is the running accuracy over the training batches (run_schema), the papers'
an evaluation; the column says so.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pyarrow as pa

from results.published import (
    PAPERS,
    matches_row,
    our_value,
    protocol_differences,
    reproductions,
    same_corpus,
)
from results.render import render
from results.schema import arrow_table, describe, table_columns

COLUMNS = table_columns("paper")

__doc__ += "\nColumns:\n\n" + describe(COLUMNS)


def paper_table(results: pd.DataFrame, paper: str) -> pa.Table:
    rows = []
    for published in PAPERS[paper]:
        if "test_accuracy" not in published.values:
            continue  # per-class breakdowns stay in the long comparison table
        theirs = published.values
        matching = [
            row
            for _, row in results.iterrows()
            if matches_row(published.match, json.loads(row["hyperparameters"]))
            and same_corpus(row, published.dataset)
        ]
        for row in matching or [None]:
            ours = {} if row is None else _ours(row)
            differences = (
                None
                if row is None
                else protocol_differences(paper, published.dataset, _fingerprint(row))
            )
            test = ours.get("test_accuracy")
            rows.append(
                {
                    "table": published.table,
                    "row": published.row,
                    "dataset": published.dataset,
                    "experiment": None if row is None else row["experiment"],
                    "model_config": None if row is None else row["model_config"],
                    "theta_m": _int(ours.get("theta_m")),
                    "published_theta_m": _int(theirs.get("theta_m")),
                    "train_running": ours.get("train_accuracy"),
                    "published_train": theirs.get("train_accuracy"),
                    "dev": ours.get("dev_accuracy"),
                    "published_dev": theirs.get("dev_accuracy"),
                    "test": test,
                    "published_test": theirs["test_accuracy"],
                    "delta": None if test is None else test - theirs["test_accuracy"],
                    "reproductions": reproductions(paper, published),
                    "comparable": None if differences is None else not differences,
                    "differences": None if differences is None else json.dumps(differences),
                    "note": published.note,
                }
            )
    return arrow_table(rows, COLUMNS, "paper", paper=paper)


def _ours(row: pd.Series) -> dict[str, float | None]:
    metrics = ("train_accuracy", "dev_accuracy", "test_accuracy", "theta_m")
    return {metric: our_value(row, metric) for metric in metrics}


def _fingerprint(row: pd.Series) -> dict[str, str] | None:
    text = row.get("protocol")
    return json.loads(text) if isinstance(text, str) else None


def _int(value: float | None) -> int | None:
    return None if value is None or math.isnan(value) else int(round(value))


def format_count(value: object, exact: bool) -> str:
    """Parameter counts: exact as an integer (252,103), else as a paper prints them (252K, 3.8M)."""
    if value is None or pd.isna(value):
        return ""
    value = int(value)
    if exact or value < 1000:
        return f"{value:,}"
    if value < 1_000_000:
        return f"{value / 1000:.0f}K"
    return f"{value / 1_000_000:.1f}M"


def describe_paper_table(table: pa.Table, fmt: str = "md") -> str:
    """The wide table (rendered in ``fmt``) and, under it, each row's protocol differences."""
    frame = table.to_pandas()
    view = pd.DataFrame(
        {
            "model": [
                r if pd.isna(e) else f"{r} ({e})"
                for r, e in zip(frame["row"], frame["experiment"], strict=True)
            ],
            "|θ|M": [format_count(v, exact=True) for v in frame["theta_m"]],
            "paper |θ|M": [format_count(v, exact=False) for v in frame["published_theta_m"]],
            "train (running)": frame["train_running"],
            "paper train": frame["published_train"],
            "dev": frame["dev"],
            "paper dev": frame["published_dev"],
            "test": frame["test"],
            "paper test": frame["published_test"],
            "Δ": [None if pd.isna(d) else f"{d:+.2f}" for d in frame["delta"]],
            "reproductions": frame["reproductions"],
            "protocol": [
                "not run" if pd.isna(c) else "comparable" if c else "NOT COMPARABLE"
                for c in frame["comparable"]
            ],
        }
    )
    lines = [render(view, fmt).rstrip("\n"), "", "Protocol differences from the paper:"]
    for _, row in frame.iterrows():
        if isinstance(row["differences"], str) and json.loads(row["differences"]):
            lines.append(f"- {row['row']} [{row['model_config']}] ({row['experiment']}):")
            lines += [f"    {item}" for item in json.loads(row["differences"])]
    if len(lines) == 3:
        lines.append("- none")
    notes = sorted({n for n in frame["note"] if isinstance(n, str) and n})
    if notes:
        lines += ["", "Notes:", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"
