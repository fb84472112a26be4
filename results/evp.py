"""Expected validation performance (Dodge et al., 2019, "Show your work").

For each model configuration, the N trial runs' best_dev_accuracy values are treated as draws
from the search's empirical distribution. The expected best dev accuracy after n trials (n iid
draws with replacement) is, over the sorted values v_(1) <= ... <= v_(N),

    E[max_n] = sum_i v_(i) * ((i/N)^n - ((i-1)/N)^n)

and its spread is the standard deviation sqrt(E[max_n^2] - E[max_n]^2) under the same weights.
Every FINISHED trial run with a best_dev_accuracy is one draw (each seed of a configuration
counts, as each costs one training run), as in the selection rule.

Columns of the EVP table:

"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from results.figures import new_figure
from results.run_reader import TrialRun
from results.run_schema import METRIC_TRIAL_TIME
from results.schema import arrow_table, describe, table_columns
from results.selection import eligible

COLUMNS = table_columns("evp")

__doc__ += describe(COLUMNS)

BUDGETS = ("trials", "hours")  # the x-axis of an EVP plot


def expected_max_curve(values: Sequence[float]) -> list[tuple[float, float]]:
    """(E[max_n], std[max_n]) for n = 1..len(values). One numpy pass of length N per n: a
    10,000-trial sweep's curve takes seconds, where a Python loop over the N^2 weights took
    minutes (benchmarks/README.md, "scale_analysis")."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    total = len(ordered)
    quantiles = np.arange(total + 1, dtype=np.float64) / total  # i/N for i = 0..N
    curve = []
    for n in range(1, total + 1):
        weights = np.diff(quantiles**n)  # (i/N)^n - ((i-1)/N)^n
        mean = float(weights @ ordered)
        second = float(weights @ (ordered * ordered))
        curve.append((mean, math.sqrt(max(second - mean * mean, 0.0))))  # clamp rounding below 0
    return curve


def evp_table(trials: Sequence[TrialRun]) -> pa.Table:
    draws: dict[tuple[str, str], list[TrialRun]] = defaultdict(list)
    for trial in trials:
        if eligible(trial.record):
            draws[trial.experiment, trial.record.model_config].append(trial)
    rows = []
    for (experiment, model_config), group in sorted(draws.items()):
        times = [t.metrics[METRIC_TRIAL_TIME] for t in group if METRIC_TRIAL_TIME in t.metrics]
        hours_per_trial = math.fsum(times) / len(times) / 3600 if times else None
        values = [t.record.best_dev_accuracy for t in group]
        curve = expected_max_curve(values)
        rows += [
            {
                "experiment": experiment,
                "corpus": next((t.corpus for t in group if t.corpus), None),
                "model_config": model_config,
                "n": n,
                "expected_best_dev_accuracy": mean,
                "std": std,
                "n_draws": len(group),
                "min_observed_dev_accuracy": min(values),
                "max_observed_dev_accuracy": max(values),
                "budget_hours": None if hours_per_trial is None else n * hours_per_trial,
            }
            for n, (mean, std) in enumerate(curve, start=1)
        ]
    return arrow_table(rows, COLUMNS, "evp")


def budget_ticks(low: float, high: float, integers: bool) -> list[float]:
    """Tick positions on a log axis from ``low`` to ``high``, every one to be labelled: the 1-2-5
    sequence (1, 2, 3, 4, ... for at most 10 trials) and both ends."""
    if integers and high <= 10:
        return list(range(max(int(low), 1), int(high) + 1))
    ticks = [
        m * 10.0**e
        for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
        for m in (1, 2, 5)
        if low <= m * 10.0**e <= high
    ]
    ends = [low, high]
    # An end beside a 1-2-5 tick (within 15% on the log axis) would overprint its label.
    return sorted(set(ticks) | {e for e in ends if all(abs(math.log(e / t)) > 0.15 for t in ticks)})


def _tick_label(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.2g}"  # 20, 0.15: no 2x10^1


def plot_evp(table: pa.Table, budget: str = "trials") -> Figure:
    """One curve per model configuration over the budget in trials or wall-clock time (minutes
    when the whole budget is under an hour, else hours), with a ±1 std band clipped to the range
    the maximum can take (the draws' lowest and highest value); dev accuracy in percent, as in
    the tables."""
    frame = table.to_pandas()
    x_column = "n" if budget == "trials" else "budget_hours"
    frame = frame[frame[x_column].notna()]
    scale, unit = 1.0, "hours"
    if budget != "trials" and len(frame) and frame[x_column].max() < 1:
        scale, unit = 60.0, "minutes"
    several_experiments = frame["experiment"].nunique() > 1
    figure = new_figure(8, 5.5)
    axes = figure.subplots()
    for (experiment, model_config), curve in frame.groupby(["experiment", "model_config"]):
        label = f"{experiment}: {model_config}" if several_experiments else model_config
        mean, std = curve["expected_best_dev_accuracy"] * 100, curve["std"] * 100
        low = np.maximum(mean - std, curve["min_observed_dev_accuracy"] * 100)
        high = np.minimum(mean + std, curve["max_observed_dev_accuracy"] * 100)
        x = curve[x_column] * scale
        (line,) = axes.plot(x, mean, marker=".", label=label)
        axes.fill_between(x, low, high, alpha=0.2, color=line.get_color())
    axes.set_xscale("log")  # as in Dodge et al.: budgets span orders of magnitude
    if len(frame):
        ticks = budget_ticks(frame[x_column].min() * scale, frame[x_column].max() * scale,
                             budget == "trials")
        axes.xaxis.set_major_locator(ticker.FixedLocator(ticks))
        axes.xaxis.set_major_formatter(ticker.FixedFormatter([_tick_label(t) for t in ticks]))
        axes.xaxis.set_minor_locator(ticker.NullLocator())
    axes.yaxis.set_major_formatter(ticker.PercentFormatter(decimals=1))
    axes.grid(alpha=0.3)
    axes.set_xlabel(
        "hyperparameter trials n (log scale)" if budget == "trials"
        else f"wall-clock budget ({unit} of training, log scale)"
    )
    axes.set_ylabel("expected best dev accuracy")
    corpora = ", ".join(sorted(c for c in frame["corpus"].dropna().unique())) or "corpus unknown"
    most = frame[x_column].max() * scale if len(frame) else 0
    spent = f"up to {int(most)} trials" if budget == "trials" else f"up to {most:.2g} {unit}"
    axes.set_title(f"Expected validation performance on {corpora}, budget {spent}\n"
                   "(Dodge et al., 2019)", fontsize="medium")
    handles, _ = axes.get_legend_handles_labels()
    band = Patch(color="grey", alpha=0.3,
                 label="shaded: ±1 std of the expected maximum, within the observed range")
    figure.legend(handles=[*handles, band], loc="outside lower center", fontsize="small")
    return figure
