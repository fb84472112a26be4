"""The sections of `orchestrate report` that analyse the trials: the Pareto front, the
search's hyperparameter importance and curves, per-class results and McNemar's test
between the top models."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from results import run_schema as rs
from results.analysis import (
    importance_with_notes,
    plot_importance,
    plot_learning_curves,
    plot_parallel_coordinates,
    top_trials,
)
from results.compare import compare_predictions, describe_comparison
from results.figures import new_figure
from results.pareto import describe_front, pareto_front, plot_front, sweep_objectives
from results.report_page import Section
from results.report_record import NOT_RECORDED, Record
from results.results_errors import ResultsError


def pareto_section(record: Record) -> Section:
    """The front of the experiment's trials over its sweeps' objectives (results.pareto)."""
    section = Section("Pareto front")
    name = record.experiment.name
    try:
        objectives = sweep_objectives([sweep.data.tags for sweep in record.sweeps], name)
        front = pareto_front(record.trials, name, objectives)
    except ResultsError as exc:
        return section.text(f"No front: {exc}.")
    searched = any(rs.TAG_OBJECTIVES in sweep.data.tags for sweep in record.sweeps)
    rules = sorted({sweep.data.tags[rs.TAG_SELECTION_RULE] for sweep in record.sweeps
                    if rs.TAG_SELECTION_RULE in sweep.data.tags})
    section.text(
        ("The sweep searched these objectives together (search.objectives). " if searched else
         "The sweep searched one metric; the front is drawn over dev accuracy and |θ|M. ")
        + "A trial is on the front when no other is at least as good in every objective and "
        "better in one. The tested configuration was chosen on dev alone, by the rule the sweep "
        f"recorded: {'; '.join(rules) or NOT_RECORDED}."
    )
    # As text and bullets, which are escaped: names in it come from the store (a code block is not).
    header, *lines = describe_front(front).splitlines()
    section.text(header).bullets([line.strip() for line in lines])
    return section.figure(plot_front(front), "pareto", f"Pareto front of {name}")


FEW_TRIALS_FOR_IMPORTANCE = 30  # below this, the importance figure gets a caveat


def analysis_section(record: Record) -> Section:
    section = Section("Analysis of the search")
    name = record.experiment.name
    importance, notes = importance_with_notes(record.trials)
    section.figure(plot_importance(importance, name), "importance",
                   "Hyperparameter importance (Optuna fANOVA and PED-ANOVA) for best dev accuracy")
    if name in notes:
        section.text(f"Importance: not computed: {notes[name]}.")
    elif len(record.trials) < FEW_TRIALS_FOR_IMPORTANCE:
        section.text(
            f"**Caveat**: importance from {len(record.trials)} trials is a rough indication at "
            f"best (fANOVA's random forest and PED-ANOVA's top-quantile split need tens of "
            f"trials; below {FEW_TRIALS_FOR_IMPORTANCE}, near-equal importances mean \"not "
            "enough trials to tell\", not \"equally important\")."
        )
    section.figure(plot_parallel_coordinates(record.trials, name), "parallel_coordinates",
                   "Searched hyperparameters against best dev accuracy, one line per trial")
    top = top_trials(record.trials, name)
    if top:
        section.figure(
            plot_learning_curves(top, record.histories, f"{name}: top {len(top)} trials"),
            "learning_curves", "Dev accuracy per epoch of the best trials",
        )
    return section


def _confusion_figure(predictions: pd.DataFrame, title: str) -> Figure:
    names = dict(zip(predictions["label"], predictions["label_name"], strict=False))
    labels = sorted(names)
    matrix = np.zeros((len(labels), len(labels)), dtype=int)
    index = {label: i for i, label in enumerate(labels)}
    for gold, predicted in zip(predictions["label"], predictions["prediction"], strict=True):
        if predicted in index:
            matrix[index[gold], index[predicted]] += 1
    figure = new_figure(1.3 * len(labels) + 2.5, 1.1 * len(labels) + 1.8)
    axes = figure.subplots()
    image = axes.imshow(matrix, cmap="Blues")
    tick_names = [names[label] for label in labels]
    axes.set_xticks(range(len(labels)), tick_names, rotation=30, ha="right")
    axes.set_yticks(range(len(labels)), tick_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("gold")
    for (i, j), count in np.ndenumerate(matrix):
        colour = "white" if count > matrix.max() / 2 else "black"
        axes.text(j, i, str(count), ha="center", va="center", color=colour)
    figure.colorbar(image, ax=axes, label="test pairs")
    axes.set_title(title, fontsize="small")
    return figure


def per_class_section(record: Record) -> Section:
    section = Section("Per-class accuracy and confusion")
    frame = record.table.to_pandas()
    shown = False
    for number, (_, row) in enumerate(frame.iterrows()):
        predictions = record.predictions.get(row["selected_run_id"])
        if predictions is None:
            continue
        shown = True
        correct = predictions["label"] == predictions["prediction"]
        per_class = (
            predictions.assign(correct=correct)
            .groupby("label_name")
            .agg(pairs=("correct", "size"), accuracy=("correct", "mean"))
            .reset_index()
            .rename(columns={"label_name": "class"})
        )
        per_class["accuracy"] = (per_class["accuracy"] * 100).round(2)
        section.text(f"**{row['model_config']}** (selected run {row['selected_run_id'][:12]}):")
        section.table(per_class)
        section.figure(
            _confusion_figure(predictions, row["model_config"]),
            f"confusion_{number}",
            f"Test confusion matrix of {row['model_config']}",
        )
    if not shown:
        section.text(f"Test predictions: {NOT_RECORDED} (no selected run logged "
                     f"`{rs.ARTIFACT_TEST_PREDICTIONS}`).")
    return section


def mcnemar_section(record: Record) -> Section:
    section = Section("McNemar test between the top models")
    frame = record.table.to_pandas()
    ranked = frame[frame["selected_run_id"].isin(record.predictions)].sort_values(
        "dev_accuracy", ascending=False
    )
    if len(ranked) < 2:
        return section.text(
            "Fewer than two models with test predictions: no paired comparison possible."
        )
    first, second = ranked.iloc[0], ranked.iloc[1]
    with tempfile.TemporaryDirectory() as scratch:
        paths = []
        for name, row in (("a", first), ("b", second)):
            path = Path(scratch) / f"{name}.parquet"
            record.predictions[row["selected_run_id"]].reset_index().to_parquet(path)
            paths.append(path)
        comparison = compare_predictions(
            first["model_config"], paths[0], second["model_config"], paths[1]
        )
    section.text("The two best models on dev, on their selected runs' test predictions:")
    return section.code(describe_comparison(comparison))


