"""The per-sweep analysis at the sizes a cluster sweep reaches: what each piece computes stays what
it was at small sizes (EVP against the formula, the parallel-coordinates figure's lines), and the
pieces whose cost grew faster than the trials are bounded (fANOVA sees at most
FANOVA_MAX_TRIALS)."""

import os

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # before anything imports mlflow

import math
import random

import numpy as np
import pytest
from matplotlib.collections import LineCollection

from results import analysis
from results.evp import expected_max_curve
from results.run_reader import TrialRun
from results.selection import TrialRecord

pytestmark = pytest.mark.unit


def synthetic_trials(n: int, experiment: str = "big", seed: int = 0) -> list[TrialRun]:
    """n finished trials of a log-uniform lr and a uniform dropout."""
    rng = random.Random(seed)
    return [
        TrialRun(
            record=TrialRecord(
                run_id=f"run-{i:05d}", config_key=f"key-{i}", model_config="decomposable/vanilla",
                params={"lr": 10 ** rng.uniform(-5, -1), "dropout": rng.uniform(0, 0.5), "seed": 1},
                best_dev_accuracy=rng.uniform(0.3, 0.9), seed=1, status="FINISHED",
            ),
            experiment=experiment, parent_run_id="parent", tagged_selected=False,
            metrics={"trial_time_s": 1.0}, corpus="toy", run_name=f"trial {i}",
        )
        for i in range(n)
    ]


def evp_by_formula(values: list[float]) -> list[tuple[float, float]]:
    """Dodge et al.'s E[max_n] and its std, term by term with exact sums."""
    ordered, total = sorted(values), len(values)
    curve = []
    for n in range(1, total + 1):
        weights = [(i / total) ** n - ((i - 1) / total) ** n for i in range(1, total + 1)]
        mean = math.fsum(w * v for w, v in zip(weights, ordered, strict=True))
        second = math.fsum(w * v * v for w, v in zip(weights, ordered, strict=True))
        curve.append((mean, math.sqrt(max(second - mean * mean, 0.0))))
    return curve


def test_expected_max_curve_equals_the_formula_over_hundreds_of_draws():
    rng = random.Random(3)
    values = [round(rng.uniform(0.3, 0.9), 4) for _ in range(400)] + [0.9] * 5  # ties at the top
    curve, reference = expected_max_curve(values), evp_by_formula(values)
    assert len(curve) == len(values)
    assert [m for m, _ in curve] == pytest.approx([m for m, _ in reference], abs=1e-12)
    assert [s for _, s in curve] == pytest.approx([s for _, s in reference], abs=1e-9)
    means = [m for m, _ in curve]
    assert means[0] == pytest.approx(sum(values) / len(values)) and all(np.diff(means) >= 0) and means[-1] < 0.9


def test_fanova_sees_a_seeded_sample_beyond_its_cap_and_ped_anova_sees_every_trial():
    trials = synthetic_trials(analysis.FANOVA_MAX_TRIALS + 150)
    arrow = analysis.importance_table(trials)
    table = arrow.to_pandas()
    seen = table.groupby("evaluator")["n_trials"].unique().to_dict()
    assert list(seen["fanova"]) == [analysis.FANOVA_MAX_TRIALS]
    assert list(seen["ped_anova"]) == [len(trials)]
    for _, group in table.groupby("evaluator"):
        assert set(group["param"]) == {"lr", "dropout"}
        assert group["importance"].sum() == pytest.approx(1.0)
    # The sample depends on the trials, not on the order the store listed them in.
    sample = analysis.evaluated_trials(trials, "fanova")
    assert len({t.record.run_id for t in sample}) == analysis.FANOVA_MAX_TRIALS
    assert sample == analysis.evaluated_trials(list(reversed(trials)), "fanova")
    small = trials[:50]
    assert analysis.evaluated_trials(small, "fanova") == small
    # The figure says so.
    axes = analysis.plot_importance(arrow, "big").axes[0]
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels == [f"fanova (a random {analysis.FANOVA_MAX_TRIALS} of them)", "ped_anova"]
    assert axes.get_title() == f"big: hyperparameter importance over {len(trials):,} trials"


def test_parallel_coordinates_draw_one_line_per_trial_best_on_top():
    trials = synthetic_trials(300)
    figure = analysis.plot_parallel_coordinates(trials, "big")
    axes = figure.axes[0]
    collections = [c for c in axes.collections if isinstance(c, LineCollection)]
    assert len(collections) == 1 and len(axes.lines) == 3  # the lines: the three vertical axes
    paths = collections[0].get_paths()
    assert len(paths) == len(trials)
    # Axes: dropout, lr, best dev accuracy; the last vertex of each line is its accuracy, scaled.
    last = np.array([path.vertices[-1, 1] for path in paths])
    assert np.all(np.diff(last) >= 0)  # drawn in order of accuracy: the best last, on top
    assert [tick.get_text() for tick in axes.get_xticklabels()] == ["dropout", "lr", "best dev accuracy"]


def test_a_log_uniform_rate_is_drawn_on_a_log_axis_and_a_uniform_dropout_is_not():
    trials = synthetic_trials(3000)
    lr, dropout = (analysis._values(trials, name) for name in ("lr", "dropout"))
    assert min(dropout) > 0 and max(dropout) / min(dropout) > 100  # spans "two orders" by chance
    assert analysis._log_scale(lr) and not analysis._log_scale(dropout)
    assert analysis._log_scale([1e-4, 1e-3, 1e-2]) and not analysis._log_scale([1e-3, 1e-2])
    # On the figure, dropout's values fill its axis evenly: its median trial sits mid-axis.
    paths = analysis.plot_parallel_coordinates(trials, "big").axes[0].collections[0].get_paths()
    assert np.median([path.vertices[0, 1] for path in paths]) == pytest.approx(0.5, abs=0.05)
