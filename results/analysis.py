"""Per-sweep analysis: which hyperparameters mattered, how dev accuracy varies over them, and how
the best trials learned.

* Hyperparameter importance: Optuna's fANOVA and PED-ANOVA evaluators
  (``optuna.importance``) over an in-memory study rebuilt from the experiment's FINISHED trial
  runs (params as logged, best_dev_accuracy as the objective). Only the params that differ
  between the trials count (the searched ones); the seed never does. fANOVA's cost grows faster
  than the trials (17 s for 1,000, 106 s for 3,000 on 2 cores: Optuna marginalises each of its 64
  trees in Python), so beyond FANOVA_MAX_TRIALS it sees a seeded random sample of that many
  trials; PED-ANOVA always sees all. ``n_trials`` says how many each one saw.
* Parallel coordinates: one line per finished trial across the searched hyperparameters and
  best dev accuracy, coloured by it.
* Learning curves: dev accuracy per epoch of the top-k trials by best dev accuracy.
* Expected validation performance over trials (``results.evp``).

`orchestrate results --analysis DIR` writes them per experiment under DIR/EXPERIMENT/ and logs
them to the parent run of the experiment's best trial under analysis/; `orchestrate report`
embeds them.

Columns of the importance table:

"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import optuna
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from results.evp import evp_table, plot_evp
from results.figures import figure_files, new_figure
from results.params import parse_param, short_value
from results.run_reader import TrialRun
from results.schema import arrow_table, describe, table_columns
from results.selection import eligible
from results.table import searched_params

COLUMNS = table_columns("importance")

__doc__ += describe(COLUMNS)

EVALUATORS = {
    "fanova": lambda: optuna.importance.FanovaImportanceEvaluator(seed=0),
    "ped_anova": lambda: optuna.importance.PedAnovaImportanceEvaluator(),
}
FANOVA_MAX_TRIALS = 500  # about 5 s of fANOVA on 2 cores, whatever the sweep's size
TOP_K = 5


def finished(trials: Sequence[TrialRun]) -> list[TrialRun]:
    return [t for t in trials if eligible(t.record)]


def _values(trials: Sequence[TrialRun], name: str) -> list[object]:
    return [parse_param(t.record.params[name]) if name in t.record.params else None for t in trials]


def _is_numeric(values: Sequence[object]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _log_scale(values: Sequence[float]) -> bool:
    """Drawn on a log scale (learning rates, ℓ2): all positive, spanning two orders of magnitude or
    more, with the median at most a fifth of the top. A log-uniform draw's median sits near the
    geometric middle, orders below its top; a uniform one's (dropout 0-0.5, whose smallest of
    thousands of draws is close to 0) sits near half of it."""
    low, high = min(values), max(values)
    return low > 0 and high / low >= 100 and float(np.median(values)) <= 0.2 * high


def _distribution(values: Sequence[object]):
    if _is_numeric(values):
        low, high = float(min(values)), float(max(values))
        return optuna.distributions.FloatDistribution(low, high, log=_log_scale(values))
    return optuna.distributions.CategoricalDistribution(sorted({str(v) for v in values}))


def _study(trials: Sequence[TrialRun], distributions: dict) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for trial in trials:
        params = {}
        for name, distribution in distributions.items():
            value = parse_param(trial.record.params.get(name, "None"))
            numeric = isinstance(distribution, optuna.distributions.FloatDistribution)
            params[name] = float(value) if numeric else str(value)
        study.add_trial(
            optuna.trial.create_trial(
                params=params, distributions=distributions, value=trial.record.best_dev_accuracy
            )
        )
    return study


def evaluated_trials(done: Sequence[TrialRun], evaluator: str) -> list[TrialRun]:
    """The trials ``evaluator`` sees: all, or for fANOVA beyond FANOVA_MAX_TRIALS a random
    sample of that many (seeded, drawn from the trials in run-id order: the same store gives the
    same sample)."""
    if evaluator != "fanova" or len(done) <= FANOVA_MAX_TRIALS:
        return list(done)
    ordered = sorted(done, key=lambda t: t.record.run_id)
    return random.Random(0).sample(ordered, FANOVA_MAX_TRIALS)


def importance_gap(done: Sequence[TrialRun], names: Sequence[str]) -> str | None:
    """Why importance cannot be computed over one experiment's finished trials, or None. fANOVA
    raises on the last case ("zero total variance in all trees")."""
    if len(done) < 2:
        return f"fewer than two finished trials ({len(done)})"
    if not names:
        return "no hyperparameter took two values"
    if len({t.record.best_dev_accuracy for t in done}) == 1:
        return f"all {len(done)} finished trials have the same best dev accuracy"
    return None


def importance_with_notes(trials: Sequence[TrialRun]) -> tuple[pa.Table, dict[str, str]]:
    """Importance of each searched hyperparameter per experiment, and per experiment where it
    could not be computed, why (one line; `importance not computed: WHY`)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" lines
    rows, notes = [], {}
    for experiment in sorted({t.experiment for t in trials}):
        done = finished([t for t in trials if t.experiment == experiment])
        names = searched_params([t.record.params for t in done])
        gap = importance_gap(done, names)
        if gap:
            notes[experiment] = gap
            continue
        # The ranges of all the trials, also where fANOVA sees a sample.
        distributions = {name: _distribution(_values(done, name)) for name in names}
        for evaluator, make in EVALUATORS.items():
            seen = evaluated_trials(done, evaluator)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # Optuna's ExperimentalWarning for PED-ANOVA
                    importances = optuna.importance.get_param_importances(
                        _study(seen, distributions), evaluator=make()
                    )
            except (RuntimeError, ValueError, ZeroDivisionError) as exc:  # e.g. a tie in a sample
                notes[experiment] = f"{evaluator}: {exc}"
                continue
            rows += [
                {
                    "experiment": experiment,
                    "param": name,
                    "evaluator": evaluator,
                    "importance": float(value),
                    "n_trials": len(seen),
                }
                for name, value in importances.items()
            ]
    return arrow_table(rows, COLUMNS, "importance"), notes


def importance_table(trials: Sequence[TrialRun]) -> pa.Table:
    """importance_with_notes without the notes (empty where it cannot be computed)."""
    return importance_with_notes(trials)[0]


def plot_importance(table: pa.Table, experiment: str) -> Figure | None:
    """Importance bars of one experiment's hyperparameters per evaluator; None without any."""
    frame = table.to_pandas()
    frame = frame[frame["experiment"] == experiment]
    if frame.empty:
        return None
    figure = new_figure(7, 0.5 * max(frame["param"].nunique(), 2) + 2.2)
    axes = figure.subplots()
    params = sorted(frame["param"].unique())
    height = 0.8 / max(frame["evaluator"].nunique(), 1)
    total = int(frame["n_trials"].max())
    for i, (evaluator, group) in enumerate(frame.groupby("evaluator")):
        values = group.set_index("param")["importance"].reindex(params).fillna(0)
        seen = int(group["n_trials"].iloc[0])
        label = evaluator if seen == total else f"{evaluator} (a random {seen:,} of them)"
        axes.barh(np.arange(len(params)) + i * height, values, height=height, label=label)
    axes.set_yticks(np.arange(len(params)) + height * (frame["evaluator"].nunique() - 1) / 2, params)
    axes.set_xlabel("importance for best dev accuracy (normalised)")
    axes.set_xlim(0, 1)
    axes.legend(title="Optuna evaluator", fontsize="small")
    axes.set_title(
        f"{experiment}: hyperparameter importance over {total:,} trials",
        fontsize="medium",
    )
    return figure


def plot_parallel_coordinates(trials: Sequence[TrialRun], experiment: str) -> Figure | None:
    """Searched hyperparameters and best dev accuracy of every finished trial; None if nothing
    was searched."""
    done = finished([t for t in trials if t.experiment == experiment])
    names = searched_params([t.record.params for t in done])
    if not done or not names:
        return None
    accuracy = np.array([t.record.best_dev_accuracy * 100 for t in done])
    columns, labels = [], []
    for name in names:
        values = _values(done, name)
        if _is_numeric(values):
            raw = np.array(values, dtype=float)
            scaled = np.log10(raw) if _log_scale(values) else raw
            span = scaled.max() - scaled.min() or 1.0
            columns.append((scaled - scaled.min()) / span)
            ticks = sorted(set(values))
            if len(ticks) > 6:
                ticks = [min(values), max(values)]
            positions = [
                ((math.log10(v) if _log_scale(values) else v) - scaled.min()) / span for v in ticks
            ]
            labels.append((positions, [short_value(v) for v in ticks]))
        else:
            categories = sorted({str(v) for v in values})
            index = {c: i / max(len(categories) - 1, 1) for i, c in enumerate(categories)}
            columns.append(np.array([index[str(v)] for v in values]))
            labels.append((list(index.values()), categories))
    low, high = accuracy.min(), accuracy.max()
    columns.append((accuracy - low) / ((high - low) or 1.0))
    labels.append(([0.0, 1.0] if high > low else [0.0], [f"{low:.1f}%", f"{high:.1f}%"][: 2 if high > low else 1]))
    axis_names = [*names, "best dev accuracy"]
    figure = new_figure(max(6, 1.8 * len(axis_names)), 5)
    axes = figure.subplots()
    colour = colormaps["viridis"]
    norm = Normalize(low, high if high > low else low + 1e-9)
    data = np.stack(columns, axis=1)
    # One collection, best trials drawn last (on top): a line artist per trial made a 10,000-trial
    # figure take tens of seconds in each of its three formats.
    order = np.argsort(accuracy, kind="stable")
    axis_x = np.arange(len(axis_names), dtype=np.float64)
    lines = LineCollection([np.column_stack([axis_x, data[i]]) for i in order],
                           colors=colour(norm(accuracy[order])), alpha=0.8,
                           linewidths=max(0.3, 1.5 * min(1.0, math.sqrt(100 / len(done)))))  # thinner when many
    axes.add_collection(lines)
    for x, (positions, texts) in enumerate(labels):
        axes.axvline(x, color="black", linewidth=0.8)
        for position, text in zip(positions, texts, strict=True):
            axes.annotate(text, (x, position), xytext=(4, 0), textcoords="offset points",
                          fontsize="small", va="center")
    axes.set_xticks(range(len(axis_names)), axis_names)
    axes.set_yticks([])
    axes.set_xlim(-0.2, len(axis_names) - 0.5)
    axes.set_ylim(-0.05, 1.05)
    for side in ("top", "right", "left"):
        axes.spines[side].set_visible(False)
    figure.colorbar(ScalarMappable(norm, colour), ax=axes, label="best dev accuracy (%)")
    axes.set_title(f"{experiment}: {len(done):,} finished trial{'s' * (len(done) != 1)}", fontsize="medium")
    return figure


def top_trials(trials: Sequence[TrialRun], experiment: str, k: int = TOP_K) -> list[TrialRun]:
    done = finished([t for t in trials if t.experiment == experiment])
    return sorted(done, key=lambda t: (-t.record.best_dev_accuracy, t.record.run_id))[:k]


def plot_learning_curves(
    top: Sequence[TrialRun], histories: Mapping[str, list[tuple[int, float]]], title: str
) -> Figure:
    """Dev accuracy per epoch of ``top`` (their run ids key ``histories``)."""
    figure = new_figure(8, 5)
    axes = figure.subplots()
    for rank, trial in enumerate(top, start=1):
        curve = histories.get(trial.record.run_id) or []
        if curve:
            steps, values = zip(*curve, strict=True)
            label = f"#{rank} {trial.run_name or trial.record.run_id[:8]}"
            axes.plot(steps, [v * 100 for v in values], marker=".", label=label)
    axes.set_xlabel("epoch")
    axes.set_ylabel("dev accuracy (%)")
    axes.grid(alpha=0.3)
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_title(title, fontsize="medium")
    figure.legend(loc="outside lower center", fontsize="small")
    return figure


def analysis_files(
    trials: Sequence[TrialRun],
    importance: pa.Table,
    histories: Mapping[str, list[tuple[int, float]]],
    experiment: str,
    folder: Path,
) -> list[tuple[Path, pa.Table | bytes]]:
    """One experiment's analysis as files under ``folder``: importance.parquet and the
    importance, parallel-coordinates, EVP and top-k learning-curve figures (PNG, PDF, SVG)."""
    mine = importance.filter(pa.compute.equal(importance.column("experiment"), experiment))
    files: list[tuple[Path, pa.Table | bytes]] = [(folder / "importance.parquet", mine)]
    top = top_trials(trials, experiment)
    figures = {
        "importance": plot_importance(importance, experiment),
        "parallel_coordinates": plot_parallel_coordinates(trials, experiment),
        "evp": plot_evp(evp_table([t for t in trials if t.experiment == experiment]), "trials")
        if finished([t for t in trials if t.experiment == experiment])
        else None,
        "learning_curves": plot_learning_curves(
            top, histories, f"{experiment}: dev accuracy of the top {len(top)} trials"
        )
        if top
        else None,
    }
    for name, figure in figures.items():
        if figure is not None:
            files += figure_files(figure, folder / f"{name}.png")
    return files
