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
from matplotlib.lines import Line2D

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
            "selected_dev_accuracy_mean": statistics.fmean(selected) if selected else None,
            "selection": common[0][0] if common else None,
            "selection_repeats": common[0][1] if common else 0,
            "same_as_sweep": sum(r["same_as_sweep"] for r in group),
            "test_accuracy_mean": statistics.fmean(tests) if tests else None,
            "test_recorded_repeats": len(tests),
        })
    return arrow_table(summary, COLUMNS, "replay", **metadata)


def strategy_view(table: pa.Table):
    """The strategy table as a reader reads it: accuracies in percent, the test column saying
    `not recorded` where no selection has a recorded test accuracy, and each header naming the
    statistic over repeats it shows (a mean, or the median and range)."""
    frame = table.to_pandas()

    def percent(value) -> str:
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2%}"

    return frame.assign(
        best_dev=[f"{percent(m)} ({percent(lo)}-{percent(hi)})" for m, lo, hi in zip(
            frame["best_dev_accuracy_median"], frame["best_dev_accuracy_min"],
            frame["best_dev_accuracy_max"], strict=True)],
        selected_dev=frame["selected_dev_accuracy_mean"].map(percent),
        test=[percent(t) + f" ({n}/{r} repeats)" if n else NOT_RECORDED for t, n, r in zip(
            frame["test_accuracy_mean"], frame["test_recorded_repeats"], frame["repeats"], strict=True)],
        selection=[f"{s} ({n}/{r})" if s else "-" for s, n, r in zip(
            frame["selection"], frame["selection_repeats"], frame["repeats"], strict=True)],
        simulated=frame["simulated_hours"].map(lambda h: f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"),
    )[["strategy", "repeats", "trials", "missing", "trial_epochs", "simulated", "best_dev",
       "selected_dev", "selection", "same_as_sweep", "test"]].rename(columns={
        "trials": "trials (mean)", "missing": "missing (mean)",
        "trial_epochs": "trial-epochs (mean)", "simulated": "simulated (mean)",
        "best_dev": "best dev (median, min-max)", "selected_dev": "selected dev (mean)",
        "selection": "selection (most often)", "same_as_sweep": "= sweep's (repeats)",
        "test": "test of selection (mean)",
    })


def plot_replay(runs: Sequence[ReplayRun], title: str) -> Figure:
    """Best dev accuracy so far, small multiples: one column per sampler, against simulated wall
    time (top row) and trial-epochs spent (bottom row), each panel holding that sampler's
    schedulers only (at most three lines), all on one y scale. Each line is the median over
    repeats, shaded between the 25th and 75th percentile."""
    by_sampler: dict[str, dict[str, list[ReplayRun]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run.epochs:
            sampler, scheduler = run.strategy.split("+")
            by_sampler[sampler][scheduler].append(run)
    longest = max((run.epochs[-1][0] for run in runs if run.epochs), default=1.0)
    scale, unit = (3600.0, "hours") if longest >= 3600 else (60.0, "minutes")
    schedulers = list(dict.fromkeys(s for group in by_sampler.values() for s in group))
    colours = {s: f"C{i}" for i, s in enumerate(schedulers)}
    # Schedulers often follow one curve (on small spaces every one finds the same best): each
    # later one is drawn narrower and dashed over the earlier ones, so all stay visible.
    styles = {s: {"color": colours[s], "linewidth": 3.0 - 0.9 * i, "linestyle": ("-", "--", ":")[i % 3]}
              for i, s in enumerate(schedulers)}
    columns = max(1, len(by_sampler))
    figure = new_figure(3.2 * columns + 1.5, 6.5)
    axes = figure.subplots(2, columns, sharey=True, squeeze=False)
    for column, (sampler, groups) in enumerate(by_sampler.items()):  # in the order replayed
        time_axes, epoch_axes = axes[0, column], axes[1, column]
        time_axes.set_title(sampler, fontsize="medium")
        for scheduler, group in groups.items():
            for panel, position, per in ((time_axes, _times, scale), (epoch_axes, _epoch_counts, 1.0)):
                grid, low, median, high = _spread(group, position)
                panel.plot(grid / per, median * 100, label=scheduler, **styles[scheduler])
                panel.fill_between(grid / per, low * 100, high * 100, color=colours[scheduler],
                                   alpha=0.15)
        time_axes.set_xlabel(f"simulated wall time ({unit})", fontsize="small")
        epoch_axes.set_xlabel("trial-epochs spent", fontsize="small")
    for row in range(2):
        axes[row, 0].set_ylabel("best dev accuracy so far")
    for panel in axes.flat:
        panel.yaxis.set_major_formatter(ticker.PercentFormatter(decimals=1))
        panel.grid(alpha=0.3)
        panel.tick_params(labelsize="small")
    repeats = max((len(g) for groups in by_sampler.values() for g in groups.values()), default=0)
    figure.suptitle(f"{title}: median over {repeats} repeats, shaded 25th-75th percentile; "
                    "one column per sampler", fontsize="medium")
    handles = [Line2D([], [], label=s, **styles[s]) for s in schedulers]
    figure.legend(handles=handles, title="scheduler", loc="outside right center", fontsize="small")
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
