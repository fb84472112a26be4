"""What `orchestrate replay` writes: a table per strategy, a table per replay, and a figure of the
best dev accuracy so far against simulated wall time and against trial-epochs spent.

Columns of the strategy table (``replay``):

"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from matplotlib import ticker
from matplotlib.figure import Figure

from results.figures import new_figure
from results.render import format_hyperparameters
from results.schema import arrow_table, describe, table_columns
from results.selection import TrialRecord, best_configuration

COLUMNS = table_columns("replay")
RUN_COLUMNS = table_columns("replay_runs")

__doc__ += describe(COLUMNS) + "\n\nColumns of the per-replay table (``replay_runs``):\n\n" + describe(RUN_COLUMNS)

NOT_RECORDED = "not recorded"
GRID_POINTS = 400  # where each repeat's step curve is read to take the spread over repeats


@dataclass(frozen=True)
class ReplayedTrial:
    """A trial that ended in a replay, as the selection rule sees it (its recorded run, with the
    best dev accuracy of the epochs it got)."""

    record: TrialRecord
    stopped_early: bool  # the scheduler stopped it before its last recorded epoch
    past_record: bool  # it would have gone on, but the recorded sweep's scheduler had cut it


@dataclass
class ReplayRun:
    strategy: str
    repeat: int
    epochs: list[tuple[float, float]] = field(default_factory=list)  # (simulated s, dev) in order
    trials: list[ReplayedTrial] = field(default_factory=list)  # in the order they ended
    missing: list[str] = field(default_factory=list)  # proposals the record lacks
    cut: int = 0  # trials running when the budget ran out

    def selection(self) -> list[TrialRecord]:
        return best_configuration([t.record for t in self.trials])

    def best_so_far(self) -> np.ndarray:
        return np.maximum.accumulate([dev for _, dev in self.epochs]) if self.epochs else np.array([])


TestLookup = Callable[[list[str]], float | None]  # seed run ids -> recorded mean test accuracy


def run_rows(runs: Sequence[ReplayRun], names: Sequence[str], sweep_config_key: str | None,
             test_of: TestLookup) -> list[dict]:
    """One row per replay; ``names`` are the searched hyperparameters shown for a selection."""
    tests: dict[str, float | None] = {}
    rows = []
    for run in runs:
        chosen = run.selection()
        key = chosen[0].config_key if chosen else None
        if key is not None and key not in tests:
            tests[key] = test_of(sorted(t.run_id for t in chosen))
        rows.append({
            "strategy": run.strategy,
            "repeat": run.repeat,
            "trials": len(run.trials),
            "missing": len(run.missing),
            "stopped_early": sum(t.stopped_early for t in run.trials),
            "cut": run.cut,
            "trial_epochs": len(run.epochs),
            "simulated_s": run.epochs[-1][0] if run.epochs else 0.0,
            "best_dev_accuracy": max((dev for _, dev in run.epochs), default=None),
            "selection": describe_selection(chosen[0], names) if chosen else None,
            "selected_run_id": max(chosen, key=lambda t: t.best_dev_accuracy).run_id if chosen else None,
            "selected_dev_accuracy": (math.fsum(t.best_dev_accuracy for t in chosen) / len(chosen)
                                      if chosen else None),
            "same_as_sweep": key is not None and key == sweep_config_key,
            "test_accuracy": tests.get(key),
            "past_record": sum(t.past_record for t in run.trials),
        })
    return rows


def describe_selection(trial: TrialRecord, names: Sequence[str]) -> str:
    return format_hyperparameters({n: trial.params.get(n) for n in names if n != "seed"})


def runs_table(rows: list[dict], **metadata: object) -> pa.Table:
    names = [c.name for c in RUN_COLUMNS]
    return arrow_table([{n: row[n] for n in names} for row in rows], RUN_COLUMNS, "replay_runs", **metadata)


def strategy_table(rows: list[dict], **metadata: object) -> pa.Table:
    by_strategy: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_strategy[row["strategy"]].append(row)
    summary = []
    for strategy, group in by_strategy.items():
        best = [r["best_dev_accuracy"] for r in group if r["best_dev_accuracy"] is not None]
        selected = [r["selected_dev_accuracy"] for r in group if r["selected_dev_accuracy"] is not None]
        tests = [r["test_accuracy"] for r in group if r["test_accuracy"] is not None]
        common = Counter(r["selection"] for r in group if r["selection"]).most_common(1)
        summary.append({
            "strategy": strategy,
            "repeats": len(group),
            **{name: statistics.fmean(r[name] for r in group)
               for name in ("trials", "missing", "stopped_early", "trial_epochs")},
            "past_record": sum(r["past_record"] for r in group),
            "simulated_hours": statistics.fmean(r["simulated_s"] for r in group) / 3600,
            "best_dev_accuracy_median": statistics.median(best) if best else None,
            "best_dev_accuracy_min": min(best, default=None),
            "best_dev_accuracy_max": max(best, default=None),
            "selected_dev_accuracy": statistics.fmean(selected) if selected else None,
            "selection": common[0][0] if common else None,
            "selection_repeats": common[0][1] if common else 0,
            "same_as_sweep": sum(r["same_as_sweep"] for r in group),
            "test_accuracy": statistics.fmean(tests) if tests else None,
            "test_recorded_repeats": len(tests),
        })
    return arrow_table(summary, COLUMNS, "replay", **metadata)


def strategy_view(table: pa.Table):
    """The strategy table as a reader reads it: accuracies in percent, the test column saying
    `not recorded` where no selection has a recorded test accuracy."""
    frame = table.to_pandas()

    def percent(value) -> str:
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2%}"

    return frame.assign(
        best_dev=[f"{percent(m)} ({percent(lo)}-{percent(hi)})" for m, lo, hi in zip(
            frame["best_dev_accuracy_median"], frame["best_dev_accuracy_min"],
            frame["best_dev_accuracy_max"], strict=True)],
        selected_dev=frame["selected_dev_accuracy"].map(percent),
        test=[percent(t) + f" ({n}/{r} repeats)" if n else NOT_RECORDED for t, n, r in zip(
            frame["test_accuracy"], frame["test_recorded_repeats"], frame["repeats"], strict=True)],
        selection=[f"{s} ({n}/{r})" if s else "-" for s, n, r in zip(
            frame["selection"], frame["selection_repeats"], frame["repeats"], strict=True)],
        simulated=frame["simulated_hours"].map(lambda h: f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"),
    )[["strategy", "repeats", "trials", "missing", "trial_epochs", "simulated", "best_dev",
       "selected_dev", "selection", "same_as_sweep", "test"]].rename(columns={
        "trial_epochs": "trial-epochs", "best_dev": "best dev (median, min-max)",
        "selected_dev": "selected dev", "same_as_sweep": "= sweep's", "test": "test of selection",
    })


def plot_replay(runs: Sequence[ReplayRun], title: str) -> Figure:
    """Best dev accuracy so far per strategy, against simulated wall time (left) and trial-epochs
    spent (right): the median over repeats, shaded between the 25th and 75th percentile. Colour
    is the sampler, line style the scheduler, and line width falls with each sampler drawn."""
    by_strategy: dict[str, list[ReplayRun]] = defaultdict(list)
    for run in runs:
        if run.epochs:
            by_strategy[run.strategy].append(run)
    longest = max((run.epochs[-1][0] for run in runs if run.epochs), default=1.0)
    scale, unit = (3600.0, "hours") if longest >= 3600 else (60.0, "minutes")
    samplers = list(dict.fromkeys(s.split("+")[0] for s in by_strategy))
    colours = {s: f"C{i}" for i, s in enumerate(samplers)}
    styles = dict(zip(("fifo", "asha", "median"), ("-", "--", ":"), strict=True))
    figure = new_figure(12, 5.5)
    time_axes, epoch_axes = figure.subplots(1, 2, sharey=True)
    for strategy, group in by_strategy.items():  # in the order replayed: the table's
        sampler, scheduler = strategy.split("+")
        # Samplers drawn later are drawn thinner: where two follow the same curve (small spaces,
        # which every sampler covers), both colours stay visible.
        width = 1.0 + 0.7 * (len(samplers) - 1 - samplers.index(sampler))
        style = {"color": colours[sampler], "linestyle": styles.get(scheduler, "-")}
        for axes, position, per in ((time_axes, _times, scale), (epoch_axes, _epoch_counts, 1.0)):
            grid, low, median, high = _spread(group, position)
            axes.plot(grid / per, median * 100, label=strategy, linewidth=width, **style)
            axes.fill_between(grid / per, low * 100, high * 100, color=style["color"], alpha=0.08)
    time_axes.set_xlabel(f"simulated wall time ({unit})")
    epoch_axes.set_xlabel("trial-epochs spent")
    time_axes.set_ylabel("best dev accuracy so far")
    for axes in (time_axes, epoch_axes):
        axes.yaxis.set_major_formatter(ticker.PercentFormatter(decimals=1))
        axes.grid(alpha=0.3)
    repeats = max((len(g) for g in by_strategy.values()), default=0)
    figure.suptitle(f"{title}: median over {repeats} repeats, shaded 25th-75th percentile",
                    fontsize="medium")
    handles, labels = epoch_axes.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right center", fontsize="small")
    return figure


def _times(run: ReplayRun) -> np.ndarray:
    return np.array([time for time, _ in run.epochs])


def _epoch_counts(run: ReplayRun) -> np.ndarray:
    return np.arange(1, len(run.epochs) + 1, dtype=np.float64)


def _spread(group: list[ReplayRun], position) -> tuple[np.ndarray, ...]:
    """Each repeat's best-so-far step curve read on a common grid (its final value after its last
    epoch), and the 25th, 50th and 75th percentile over repeats, from where every repeat has
    received an epoch (NaN before: a median over the repeats that started would not rise
    monotonically)."""
    end = max(position(run)[-1] for run in group)
    grid = np.linspace(0.0, end, GRID_POINTS)
    curves = []
    for run in group:
        x, best = position(run), run.best_so_far()
        index = np.searchsorted(x, grid, side="right") - 1
        curves.append(np.where(index >= 0, best[np.maximum(index, 0)], np.nan))
    stacked = np.vstack(curves)
    known = ~np.any(np.isnan(stacked), axis=0)
    low, median, high = np.full((3, len(grid)), np.nan)
    low[known], median[known], high[known] = np.percentile(stacked[:, known], [25, 50, 75], axis=0)
    return grid, low, median, high
