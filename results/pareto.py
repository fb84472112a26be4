"""Pareto fronts of an experiment's trials (`orchestrate results --pareto`, the report).

A trial is on the front when no other trial of the experiment is at least as good in every
objective and better in one. The objectives are the sweep's ``search.objectives`` (parent tag
nli.objectives); a sweep that searched one metric is drawn over DEFAULT_OBJECTIVES. Each
objective is the trial's final value as recorded (run_schema.OBJECTIVE_METRICS: dev accuracy is
``best_dev_accuracy``). The trials are those the selection counts (results.selection.seed_runs:
FINISHED, one per configuration and seed) that recorded every objective.

The front shows trade-offs; it does not choose what is tested: the sweep tests the configuration
of results.selection.SELECTION_RULE, marked on the figure. The paper's own configuration is marked
too: a trial that trains it (results.published.runs_paper_configuration), and, when the figure's
x axis is a parameter count, the size the paper publishes for the model (a line, not a point: the
paper's accuracy was measured under its own protocol and data, not this sweep's).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from matplotlib import ticker
from matplotlib.figure import Figure

from results.figures import new_figure
from results.published import model_rows, runs_paper_configuration
from results.results_errors import ResultsError, ResultsWarning
from results.run_reader import TrialRun
from results.run_schema import OBJECTIVE_METRICS, TAG_OBJECTIVES
from results.schema import arrow_table, describe, table_columns
from results.selection import seed_runs

DEFAULT_OBJECTIVES = (("dev_accuracy", "max"), ("theta_m", "min"))
COLUMNS = table_columns("pareto")
PARAMETER_COUNTS = ("theta_m", "theta_wm")
LABELS = {
    "dev_accuracy": "dev accuracy (%, best epoch)",
    "theta_m": "|θ|M (parameters without embeddings)",
    "theta_wm": "|θ|W+M (parameters with embeddings)",
    "trial_time_s": "trial wall time (s)",
}

__doc__ += "\nColumns of the front's table (one row per trial):\n\n" + describe(COLUMNS)


@dataclass(frozen=True)
class Front:
    experiment: str
    objectives: tuple[tuple[str, str], ...]
    table: pa.Table  # COLUMNS, one row per trial
    references: tuple[tuple[str, float], ...]  # (published row, its parameter count)

    @property
    def rows(self) -> list[dict]:
        return self.table.to_pylist()


def sweep_objectives(parent_tags: Sequence[dict[str, str]], experiment: str) -> tuple[tuple[str, str], ...]:
    """The objectives of an experiment's sweeps (their nli.objectives tags); DEFAULT_OBJECTIVES
    when none has one. ResultsError when its sweeps searched different objectives."""
    found = {tags[TAG_OBJECTIVES] for tags in parent_tags if TAG_OBJECTIVES in tags}
    if len(found) > 1:
        raise ResultsError(
            f"{experiment}: its sweeps searched different objectives ({', '.join(sorted(found))}); "
            "draw the front of one sweep's experiment at a time"
        )
    if not found:
        return DEFAULT_OBJECTIVES
    return tuple((name, direction) for name, direction in json.loads(found.pop()))


def non_dominated(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """A boolean per row of ``values`` (trials x objectives): whether no other row is at least
    as good in every objective and better in one."""
    signed = values * np.array([-1.0 if d == "max" else 1.0 for d in directions])  # all minimised
    at_least = (signed[:, None, :] <= signed[None, :, :]).all(axis=2)  # [i, j]: i as good as j
    better = (signed[:, None, :] < signed[None, :, :]).any(axis=2)
    return ~(at_least & better).any(axis=0)


def pareto_front(
    trials: Sequence[TrialRun], experiment: str, objectives: tuple[tuple[str, str], ...]
) -> Front:
    """The front of ``experiment``'s trials over ``objectives``. ResultsError when fewer than
    one trial recorded them all."""
    by_run = {t.record.run_id: t for t in trials if t.experiment == experiment}
    names = [name for name, _ in objectives]
    counted, missing = [], []
    for record in seed_runs([t.record for t in by_run.values()]):
        trial = by_run[record.run_id]
        has_all = all(OBJECTIVE_METRICS[n] in trial.metrics for n in names)
        (counted if has_all else missing).append(trial)
    if missing:
        warnings.warn(
            f"{experiment}: {len(missing)} finished trial(s) lack one of the objectives "
            f"{', '.join(names)} and are left off the front", ResultsWarning, stacklevel=2,
        )
    if not counted:
        raise ResultsError(f"{experiment}: no finished trial recorded every objective ({', '.join(names)})")
    values = np.array([[t.metrics[OBJECTIVE_METRICS[n]] for n in names] for t in counted], dtype=float)
    front = non_dominated(values, [d for _, d in objectives])
    rows = [
        {
            "experiment": experiment,
            "run_id": t.record.run_id,
            "run_name": t.run_name,
            "model_config": t.record.model_config,
            "seed": t.record.seed,
            "objectives": ",".join(f"{n}:{d}" for n, d in objectives),
            **{n: t.metrics.get(metric) for n, metric in OBJECTIVE_METRICS.items()},
            "on_front": bool(on_front),
            "selected": t.tagged_selected,
            "paper_configuration": _paper_configuration(t.record.params),
        }
        for t, on_front in zip(counted, front, strict=True)
    ]
    table = arrow_table(rows, COLUMNS, "pareto")
    return Front(experiment, tuple(objectives), table, _published_sizes(counted[0].record.params))


def _paper_configuration(params) -> str | None:
    rows = [f"{paper} {row.table}: {row.row}" for paper, row in model_rows(params)
            if runs_paper_configuration(paper, row, params)]
    return "; ".join(dict.fromkeys(rows)) or None


def _published_sizes(params) -> tuple[tuple[str, float], ...]:
    """(label, |θ|M) of the published rows of the trials' model and variant."""
    sizes = {}
    for paper, row in model_rows(params):
        if "theta_m" in row.values:
            sizes.setdefault(row.values["theta_m"], f"{paper} {row.table} ({row.dataset}): {row.row}")
    return tuple((label, value) for value, label in sizes.items())


def _shown(name: str, values: Sequence[float]) -> list[float]:
    return [100 * v for v in values] if name == "dev_accuracy" else list(values)


def plot_front(front: Front) -> Figure:
    """The front over the first objective (y) against each other one (x), one panel each."""
    (y_name, _), *others = front.objectives
    figure = new_figure(6.4 * len(others), 4.6)
    rows = front.rows
    for axes, (x_name, x_direction) in zip(figure.subplots(1, len(others), squeeze=False)[0], others, strict=True):
        x = _shown(x_name, [r[x_name] for r in rows])
        y = _shown(y_name, [r[y_name] for r in rows])
        on = [r["on_front"] for r in rows]
        off_points = [(a, b) for a, b, f in zip(x, y, on, strict=True) if not f]
        if off_points:
            axes.scatter(*zip(*off_points, strict=True), s=28, color="0.65", label="dominated trial", zorder=2)
        front_points = sorted((a, b) for a, b, f in zip(x, y, on, strict=True) if f)
        axes.scatter(*zip(*front_points, strict=True), s=40, color="tab:blue",
                     label=f"on the front ({len(front_points)} of {len(rows)})", zorder=3)
        if len(front.objectives) == 2:  # the staircase is the front only with two objectives
            stairs = front_points if x_direction == "min" else front_points[::-1]
            axes.step(*zip(*stairs, strict=True), where="post", color="tab:blue", linewidth=1, zorder=2)
        selected = [(a, b) for a, b, r in zip(x, y, rows, strict=True) if r["selected"]]
        if selected:
            axes.scatter(*zip(*selected, strict=True), s=150, facecolors="none", edgecolors="black",
                         linewidths=1.5, label="selected on dev, tested", zorder=4)
        paper = [(a, b) for a, b, r in zip(x, y, rows, strict=True) if r["paper_configuration"]]
        if paper:
            axes.scatter(*zip(*paper, strict=True), s=160, marker="*", color="tab:red",
                         label="the paper's configuration", zorder=5)
        if x_name == "theta_m":
            for label, value in front.references:
                axes.axvline(value, color="tab:red", linestyle="--", linewidth=1,
                             label=f"published |θ|M {value / 1e3:.0f}K: {label}")
        if x_name in PARAMETER_COUNTS:
            spread = [v for v in [*x, *(v for _, v in front.references)] if v > 0]
            if spread and max(spread) / min(spread) > 5:
                axes.set_xscale("log")
                axes.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            axes.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v / 1e3:g}K"))
            axes.xaxis.set_minor_formatter(ticker.NullFormatter())
        axes.set_xlabel(f"{LABELS[x_name]}, {_better(x_direction)}")
        axes.set_ylabel(f"{LABELS[y_name]}, {_better(front.objectives[0][1])}")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7, loc="best")
    title = front.experiment.replace("$", r"\$")  # a name is text, not mathtext
    figure.suptitle(f"{title}: Pareto front over "
                    + ", ".join(f"{n} ({d})" for n, d in front.objectives), fontsize=10)
    return figure


def _better(direction: str) -> str:
    return "higher is better" if direction == "max" else "lower is better"


def describe_front(front: Front) -> str:
    """The front as text: one line per trial on it, best first objective first."""
    names = [n for n, _ in front.objectives]
    rows = [r for r in front.rows if r["on_front"]]
    first, direction = front.objectives[0]
    rows.sort(key=lambda r: -r[first] if direction == "max" else r[first])
    lines = [f"Pareto front of {front.experiment} over "
             + ", ".join(f"{n} ({d})" for n, d in front.objectives)
             + f": {len(rows)} of {front.table.num_rows} trials"]
    for r in rows:
        shown = ", ".join(f"{n} {_value(n, r[n])}" for n in names)
        marks = [m for m, on in (("selected", r["selected"]),
                                 (f"paper: {r['paper_configuration']}", r["paper_configuration"])) if on]
        lines.append(f"  {r['run_name']} [{r['model_config']}]: {shown}"
                     + (f"  ({'; '.join(marks)})" if marks else ""))
    return "\n".join(lines) + "\n"


def _value(name: str, value: float) -> str:
    if name == "dev_accuracy":
        return f"{100 * value:.2f}%"
    if name in PARAMETER_COUNTS:
        return f"{value:,.0f}"
    return f"{value:.1f}s" if not math.isnan(value) else "?"
