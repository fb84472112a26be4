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

import io
import math
from collections import defaultdict
from collections.abc import Sequence

import pyarrow as pa
from matplotlib import ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from results.schema import Column, arrow_table, describe
from results.selection import eligible
from results.tracking import TrialRun

COLUMNS: tuple[Column, ...] = (
    Column("experiment", pa.string(), "MLflow experiment"),
    Column("model_config", pa.string(), "nli.model_config tag"),
    Column("n", pa.int64(), "number of trials drawn, 1..n_draws"),
    Column("expected_best_dev_accuracy", pa.float64(), "E[max of n draws of best_dev_accuracy]"),
    Column("std", pa.float64(), "standard deviation of that maximum"),
    Column("n_draws", pa.int64(), "N: FINISHED trial runs of the model configuration"),
)

__doc__ += describe(COLUMNS)


def expected_max_curve(values: Sequence[float]) -> list[tuple[float, float]]:
    """(E[max_n], std[max_n]) for n = 1..len(values)."""
    ordered = sorted(values)
    total = len(ordered)
    curve = []
    for n in range(1, total + 1):
        weights = [(i / total) ** n - ((i - 1) / total) ** n for i in range(1, total + 1)]
        mean = math.fsum(w * v for w, v in zip(weights, ordered, strict=True))
        second = math.fsum(w * v * v for w, v in zip(weights, ordered, strict=True))
        curve.append((mean, math.sqrt(max(second - mean * mean, 0.0))))  # clamp rounding below 0
    return curve


def evp_table(trials: Sequence[TrialRun]) -> pa.Table:
    draws: dict[tuple[str, str], list[float]] = defaultdict(list)
    for trial in trials:
        if eligible(trial.record):
            draws[trial.experiment, trial.record.model_config].append(
                trial.record.best_dev_accuracy
            )
    rows = [
        {
            "experiment": experiment,
            "model_config": model_config,
            "n": n,
            "expected_best_dev_accuracy": mean,
            "std": std,
            "n_draws": len(values),
        }
        for (experiment, model_config), values in sorted(draws.items())
        for n, (mean, std) in enumerate(expected_max_curve(values), start=1)
    ]
    return arrow_table(rows, COLUMNS, "evp")


def plot_evp(table: pa.Table) -> bytes:
    """PNG of one curve per model configuration with a ±1 std band."""
    frame = table.to_pandas()
    several_experiments = frame["experiment"].nunique() > 1
    # A bare Figure on the Agg canvas: no pyplot global state and no display backend, which the
    # machines running sweeps do not have.
    figure = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for (experiment, model_config), curve in frame.groupby(["experiment", "model_config"]):
        label = f"{experiment}: {model_config}" if several_experiments else model_config
        mean, std = curve["expected_best_dev_accuracy"], curve["std"]
        axes.plot(curve["n"], mean, marker=".", label=label)
        axes.fill_between(curve["n"], mean - std, mean + std, alpha=0.2)
    axes.set_xscale("log")  # as in Dodge et al.: budgets span orders of magnitude
    axes.xaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
    axes.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))  # 20, not 2x10^1
    axes.xaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_xlabel("hyperparameter trials n")
    axes.set_ylabel("expected best dev accuracy")
    axes.set_title("Expected validation performance (Dodge et al., 2019)")
    figure.legend(loc="outside lower center", fontsize="small")  # labels are long
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()
