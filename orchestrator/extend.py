"""`orchestrate sweep SPEC --extend`: more trials for the experiment's completed sweep, in its own
parent run, without running a finished configuration again.

SPEC is the sweep's spec with more grid values (sampler grid: only the grid points and seeds no
trial ran are run) or a larger search.num_samples (an Optuna sampler, told every finished
configuration as in --warm-start, draws the difference). Every trial the sweep ran must be a point
of SPEC's space (orchestrator/warm_start.py; exit 2 otherwise, nothing written). The extension
goes through the sweep's lifecycle (orchestrator/lifecycle.py: completed -> running ->
completed | interrupted | failed), its journal and its progress line; an interrupted extension
continues with `--resume`. Tune cannot add trials to a finished run (ray-project/ray#42221):
extension k is a Tune run of its own (`tune_experiment`), and the trials of the runs before it
are read back from their folders for the selection.

The selection on dev is applied again over every trial; test data is evaluated only for selected
runs that have no test metric yet, as the sweep's next evaluation (results/run_schema.py,
TAG_TEST_EVALUATIONS): when the selection did not change, test is not touched again.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from nli_models.config import Overrides
from nli_models.data import PreparedData
from nli_models.errors import InputError, mask_secrets
from orchestrator.lifecycle import SweepState
from orchestrator.ray_adapter import PriorTrials, TrialOutcome, recorded_outcomes
from orchestrator.spec import SweepSpec, effective_spec_text
from orchestrator.warm_start import (
    check_room,
    config_key,
    finite_space,
    recorded_points,
    searched,
    tune_point,
)
from results import run_schema as rs
from results.sweeps import observed_state
from results.tracking import trial_params

OPTION = "--extend"


@dataclass
class Extension:
    """An extension of a sweep (`index` 1 for the first) and what the sweep recorded before it."""

    index: int
    prior: PriorTrials
    tested: dict[str, float] = field(default_factory=dict)  # run id -> its test accuracy
    selected: set[str] = field(default_factory=set)  # runs tagged nli.selected=true
    evaluations: int = 0  # test evaluations recorded so far


def tune_experiment(spec_name: str, parent_run_id: str, extension: int) -> str:
    """The Tune run of a sweep (extension 0) or of its extension."""
    name = f"{spec_name}-{parent_run_id[:8]}"
    return name if extension == 0 else f"{name}-extend{extension}"


def completed_sweep(tracker, spec: SweepSpec):
    """The parent run --extend extends: the experiment's latest sweep, which must be completed."""
    experiment_id = tracker.find_experiment(spec.name)
    sweeps = [] if experiment_id is None else tracker.sweeps(experiment_id)
    if not sweeps:
        raise InputError(f"{OPTION}: experiment {spec.name!r} holds no sweep to extend; drop {OPTION}")
    latest, state = sweeps[0], observed_state(sweeps[0].data.tags)
    if state != rs.SWEEP_COMPLETED:
        hint = "continue it with --resume" if state != rs.SWEEP_RUNNING else "wait for it to end"
        raise InputError(
            f"{OPTION}: the latest sweep of experiment {spec.name!r} (run {latest.info.run_id}) is "
            f"{state}; only a completed sweep is extended: {hint}"
        )
    return latest


def plan_extension(tracker, spec: SweepSpec, parent, resuming: bool) -> Extension:
    """What an extension of `parent` runs (a new one, or the interrupted one --resume continues).
    InputError when a trial of the sweep is not a point of the spec's space, or when the spec
    adds no trial."""
    runs = tracker.trial_runs(parent.info.experiment_id, parent.info.run_id)
    ended = [run for run in runs if run.info.status in ("FINISHED", "FAILED")]
    ran = {config_key(tune_point(spec, run, OPTION, seed=True)) for run in ended}
    points, values = recorded_points(spec, runs, OPTION)
    seeds = spec.search.seeds
    if spec.search.sampler == "grid":
        grid = [{**point, rs.PARAM_SEED: seed} for point in finite_space(spec, limit=None) for seed in seeds]
        prior = PriorTrials(points, values, grid=[p for p in grid if config_key(p) not in ran])
        added = len(prior.grid)
    else:
        # Whole configurations: each runs once per seed (Tune's Repeater).
        added = math.ceil(max(spec.num_trials() - len(ended), 0) / len(seeds)) * len(seeds)
        prior = PriorTrials(points, values, num_trials=added, finite_space=finite_space(spec))
        check_room(spec, prior, added // len(seeds), OPTION)
    if not added and not resuming:
        raise InputError(
            f"{OPTION}: the spec adds no trial to sweep run {parent.info.run_id}: its {len(ended)} "
            "trials ended and are every point the spec plans; add grid values, seeds or raise "
            "search.num_samples (in the file or with --set)"
        )
    tags = parent.data.tags
    tested = {run.info.run_id: run.data.metrics[rs.METRIC_TEST_ACCURACY]
              for run in runs if rs.METRIC_TEST_ACCURACY in run.data.metrics}
    return Extension(
        index=int(tags.get(rs.TAG_EXTENSIONS, "0")) + (0 if resuming else 1),
        prior=prior,
        tested=tested,
        selected={run.info.run_id for run in runs if run.data.tags.get(rs.TAG_SELECTED) == "true"},
        evaluations=rs.evaluation_of(tags) if tested else 0,
    )


def open_extension(tracker, spec: SweepSpec, spec_path: Path, parent, overrides: Overrides | None,
                   extension: Extension) -> SweepState:
    """The completed parent run, reopened for the extension: its spec as run is logged beside the
    sweep's own, and nli.spec_hash becomes that spec's (the spec --resume is checked against)."""
    run_id = parent.info.run_id
    tracker.reopen(run_id)
    tracker.log_text(run_id, mask_secrets(effective_spec_text(spec_path, overrides)),
                     rs.EXTENSION_SPEC_TEMPLATE.format(extension.index))
    tracker.set_tags(run_id, {rs.TAG_EXTENSIONS: str(extension.index), rs.TAG_SPEC_HASH: spec.spec_hash()})
    print(f"extending sweep run {run_id} (extension {extension.index}): "
          f"{len(extension.prior.points)} configurations finished before are not run again",
          file=sys.stderr)
    return SweepState(partial(tracker.set_tags, run_id), rs.SWEEP_COMPLETED)


def earlier_outcomes(spec: SweepSpec, data: PreparedData, parent_run_id: str, extension: Extension,
                     runs: list) -> list[TrialOutcome]:
    """The outcomes of the Tune runs before this extension, with the hyperparameters their MLflow
    runs record."""
    names = [*searched(spec), rs.PARAM_SEED]
    params = {}
    for run in runs:
        typed = trial_params(run)
        params[run.data.tags.get(rs.TAG_TRIAL_ID)] = {k: typed[k] for k in names if k in typed}
    outcomes = []
    for index in range(extension.index):
        name = tune_experiment(spec.name, parent_run_id, index)
        outcomes += recorded_outcomes(spec, data, name, params)
    return [replace(o, params=params[o.trial_id]) for o in outcomes]


def record_evaluation(tracker, parent_run_id: str, selection, extension: Extension) -> int:
    """Records an extension's test evaluation, if it made one: the newly tested runs' metrics
    and predictions, which evaluation tested them, nli.selected moved to the new selection (the
    runs selected before keep their test metrics), and on the parent the summary at step
    evaluation - 1. Returns the index of the evaluation the parent's test accuracy is from."""
    if not selection.tested:
        print(f"the selection on dev did not change: test data was not evaluated again (the test "
              f"accuracy is evaluation {extension.evaluations}'s)", file=sys.stderr)
        return extension.evaluations
    evaluation = extension.evaluations + 1
    for run_id, metrics in selection.tested.items():
        tracker.log_metrics(run_id, metrics)
        tracker.log_bytes(run_id, selection.predictions[run_id], rs.ARTIFACT_TEST_PREDICTIONS)
        tracker.set_tags(run_id, {rs.TAG_SELECTED: "true", rs.TAG_TEST_EVALUATION: str(evaluation)})
    for run_id in extension.selected - selection.selected:
        tracker.set_tags(run_id, {rs.TAG_SELECTED: "false"})
    summary = {rs.METRIC_SWEEP_BEST_DEV_ACCURACY: selection.best_dev}
    if selection.best_test is not None:
        summary[rs.METRIC_SWEEP_TEST_ACCURACY] = selection.best_test
    tracker.log_metrics(parent_run_id, summary, step=evaluation - 1)
    tracker.set_tags(parent_run_id, {rs.TAG_TEST_EVALUATIONS: str(evaluation),
                                     rs.TAG_BEST_RUN: selection.best_run_id or ""})
    return evaluation
