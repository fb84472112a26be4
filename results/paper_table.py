"""``orchestrate results --paper P``: our rows beside the paper's, as the paper prints them.

One row per published result with a test accuracy and each of our rows that matches it (or none):
the paper's label, |θ|M, train / dev / test accuracy (mean ± std over the selected configuration's
seeds, and how many), the epochs and optimizer steps that produced the test accuracy (a refit's on
train + dev where the sweep refits, not the selection run's), the published test accuracy, the
difference, the known public reproductions of that row, and every way our run's protocol differs
from everything the paper states (``results.published_rows.PROTOCOLS`` and the row's own settings). A
row with any difference is marked not comparable: its Δ measures the protocol as much as the
model. A published system this code does not run (Yin et al.'s feature-based Table 6 rows) gets
no Δ at all. A published row none of ours matches says why (the dataset, model, variant or size
that did not run).

Our train accuracy is the running accuracy over the training batches (run_schema), the papers'
an evaluation; the column says so.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pyarrow as pa

from results.published import (
    matches_row,
    our_setup,
    our_value,
    protocol_differences,
    reproductions,
    same_corpus,
    theta_m_at_paper_setup,
    why_unmatched,
)
from results.published_rows import PAPERS
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
            setup = None if row is None else _setup(row)
            differences = None if row is None else protocol_differences(paper, published, setup)
            test = ours.get("test_accuracy")
            delta = None if test is None or not published.runnable else test - theirs["test_accuracy"]
            rows.append(
                {
                    "table": published.table,
                    "row": published.row,
                    "dataset": published.dataset,
                    "experiment": None if row is None else row["experiment"],
                    "model_config": None if row is None else row["model_config"],
                    "theta_m": _int(ours.get("theta_m")),
                    "published_theta_m": _int(theirs.get("theta_m")),
                    "paper_setup_theta_m": (
                        None
                        if row is None or "theta_m" in theirs
                        else theta_m_at_paper_setup(
                            paper, published, json.loads(row["hyperparameters"])
                        )
                    ),
                    "train_running": ours.get("train_accuracy"),
                    "published_train": theirs.get("train_accuracy"),
                    "dev": ours.get("dev_accuracy"),
                    "dev_std": None if row is None else _percent(row.get("dev_accuracy_std")),
                    "published_dev": theirs.get("dev_accuracy"),
                    "test": test,
                    "test_std": None if row is None else _percent(row.get("test_accuracy_std")),
                    "seeds": None if row is None else _int(row.get("n_seeds")),
                    "epochs_trained": None if row is None else _test_epochs(row),
                    "refit": None if row is None else _refit(row),
                    "steps_trained": None if setup is None else _int(setup.get("steps_trained")),
                    "published_test": theirs["test_accuracy"],
                    "delta": delta,
                    "reproductions": reproductions(paper, published),
                    "comparable": None if differences is None else not differences,
                    "differences": None if differences is None else json.dumps(differences),
                    "unmatched_because": why_unmatched(published, results) if row is None else None,
                    "note": published.note,
                }
            )
    return arrow_table(rows, COLUMNS, "paper", paper=paper)


def _ours(row: pd.Series) -> dict[str, float | None]:
    metrics = ("train_accuracy", "dev_accuracy", "test_accuracy", "theta_m")
    return {metric: our_value(row, metric) for metric in metrics}


def _setup(row: pd.Series) -> dict[str, object] | None:
    text = row.get("protocol")
    fingerprint = json.loads(text) if isinstance(text, str) else None
    params = json.loads(row["hyperparameters"])
    return our_setup(fingerprint, params, _test_epochs(row), _refit(row))


def _refit(row: pd.Series) -> bool:
    return _float(row.get("refit_epochs")) is not None


def _test_epochs(row: pd.Series) -> float | None:
    """The epochs whose weights were tested: the refit's where there is one."""
    refit = _float(row.get("refit_epochs"))
    return refit if refit is not None else _float(row.get("epochs_trained"))


def _float(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _int(value: object) -> int | None:
    value = _float(value)
    return None if value is None or math.isnan(value) else int(round(value))


def _percent(value: object) -> float | None:
    value = _float(value)
    return None if value is None else 100 * value


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


def _spread(value: float, std: float, seeds: float, say_seeds: bool = True) -> str:
    """'73.71 ± 0.63 (3 seeds)', '73.71 (1 seed)' (without `say_seeds`: '73.71 ± 0.63', '73.71');
    empty when not run."""
    if pd.isna(value):
        return ""
    if pd.isna(seeds):
        return f"{value:.2f}"
    count = f" ({int(seeds)} seed{'s' if seeds != 1 else ''})" if say_seeds else ""
    if seeds == 1 or pd.isna(std):
        return f"{value:.2f}{count}"
    return f"{value:.2f} ± {std:.2f}{count}"


def format_epochs(epochs: float) -> str:
    """An epoch count, or a mean of them over seeds, to a tenth: '13', '22.7'."""
    return f"{epochs:.1f}".removesuffix(".0")


def _budget(epochs: float, steps: float, refit: object, seeds: float) -> str:
    """'13 refit (2,015)'; over several seeds their mean: '22.7 refit (3,513), mean'."""
    if pd.isna(epochs):
        return ""
    shown = format_epochs(epochs) + (" refit" if refit is True else "")
    shown = shown if pd.isna(steps) else f"{shown} ({int(steps):,})"
    return f"{shown}, mean" if not pd.isna(seeds) and seeds > 1 else shown


def _delta(delta: float, test: float) -> str | None:
    if pd.isna(test):
        return None
    # No Δ against a published system that cannot be run here (its differences say why).
    return "n/a (not runnable)" if pd.isna(delta) else f"{delta:+.2f}"


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
            "paper |θ|M": [
                format_count(printed, exact=False)
                if not pd.isna(printed)
                else "" if pd.isna(computed) else f"{format_count(computed, exact=False)} (computed)"
                for printed, computed in zip(
                    frame["published_theta_m"], frame["paper_setup_theta_m"], strict=True
                )
            ],
            "train (running)": frame["train_running"],
            "paper train": frame["published_train"],
            "dev": [_spread(d, s, n, say_seeds=False) for d, s, n in zip(frame["dev"], frame["dev_std"], frame["seeds"], strict=True)],
            "paper dev": frame["published_dev"],
            "test": [_spread(t, s, n) for t, s, n in zip(frame["test"], frame["test_std"], frame["seeds"], strict=True)],
            "paper test": frame["published_test"],
            "Δ": [_delta(d, t) for d, t in zip(frame["delta"], frame["test"], strict=True)],
            "epochs (steps) of test": [
                _budget(e, s, r, n)
                for e, s, r, n in zip(
                    frame["epochs_trained"], frame["steps_trained"], frame["refit"], frame["seeds"], strict=True
                )
            ],
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
        compared = frame["comparable"].notna().any()
        lines.append("- none" if compared else "- none compared: no row of ours matches a published row")
    unmatched = frame[frame["unmatched_because"].notna()]
    if len(unmatched):
        lines += ["", "Published rows no row of ours matches:"]
        lines += [f"- {r.row} ({r.table}): {r.unmatched_because}" for r in unmatched.itertuples()]
    notes = sorted({n for n in frame["note"] if isinstance(n, str) and n})
    if notes:
        lines += ["", "Notes:", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"
