"""`orchestrate sweep SPEC --extend`: more trials for the experiment's completed sweep, in its own
parent run, without running a finished configuration again.

SPEC is the sweep's spec with more grid values (sampler grid: only the grid points and seeds no
trial ran are run) or a larger search.num_samples (an Optuna sampler, told every finished
configuration as in --warm-start, draws the difference). Every trial the sweep ran must be a point
of SPEC's space (orchestrator/sweep/warm_start.py; exit 2 otherwise, nothing written). The extension
goes through the sweep's lifecycle (orchestrator/sweep/lifecycle.py: completed -> running ->
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
from pathlib import Path
from typing import Any

from nli_models.config import Overrides
from nli_models.errors import InputError, mask_secrets
from orchestrator.journal.operations import Journal
from orchestrator.journal.parent_records import catch_up, record_selection
from orchestrator.journal.recorder import SweepLog
from orchestrator.ray_adapter.ray_search import PriorTrials
from orchestrator.ray_adapter.tuner import TrialOutcome, recorded_outcomes
from orchestrator.sweep.spec import SweepSpec, effective_spec_text
from orchestrator.sweep.warm_start import (
    check_room,
    check_single_objective,
    config_key,
    finite_space,
    recorded_points,
    searched,
    tune_point,
)
from results import run_schema as rs
from results.run_reader import trial_params
from results.sweeps import observed_state

OPTION = "--extend"


@dataclass
class Extension:
    """An extension of a sweep (`index` 1 for the first) and what the sweep recorded before it,
    its trials named by their trial ids (as the journal and the selection name them)."""

    index: int
    prior: PriorTrials
    tested: dict[str, float] = field(default_factory=dict)  # trial id -> its test accuracy
    selected: set[str] = field(default_factory=set)  # trials whose runs are tagged nli.selected=true
    evaluations: int = 0  # test evaluations recorded so far
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # trial id -> searched params


def tune_experiment(spec_name: str, parent_run_id: str, extension: int) -> str:
    """The Tune run of a sweep (extension 0) or of its extension."""
    name = f"{spec_name}-{parent_run_id[:8]}"
    return name if extension == 0 else f"{name}-extend{extension}"


def completed_sweep(tracker, spec: SweepSpec):
    """The parent run --extend extends: the experiment's latest sweep, which must be completed
    (read once its journals are uploaded: parent_records.catch_up)."""
    catch_up(tracker, spec)
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
        check_single_objective(spec, OPTION)
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
    trial_id = {run.info.run_id: run.data.tags.get(rs.TAG_TRIAL_ID) for run in runs}
    tested = {trial_id[run.info.run_id]: run.data.metrics[rs.METRIC_TEST_ACCURACY]
              for run in runs if rs.METRIC_TEST_ACCURACY in run.data.metrics}
    names = [*searched(spec), rs.PARAM_SEED]
    params = {}
    for run in runs:
        typed = trial_params(run)
        params[trial_id[run.info.run_id]] = {k: typed[k] for k in names if k in typed}
    return Extension(
        index=int(tags.get(rs.TAG_EXTENSIONS, "0")) + (0 if resuming else 1),
        prior=prior,
        tested=tested,
        selected={trial_id[run.info.run_id] for run in runs if run.data.tags.get(rs.TAG_SELECTED) == "true"},
        evaluations=rs.evaluation_of(tags) if tested else 0,
        params=params,
    )


def open_extension(log: SweepLog, spec: SweepSpec, spec_path: Path, overrides: Overrides | None,
                   extension: Extension) -> None:
    """Journals the extension on its completed parent run (the move to `running` reopens it):
    its spec as run, logged beside the sweep's own, and nli.spec_hash becomes that spec's (the
    spec --resume is checked against)."""
    log.add(
        tags={rs.TAG_EXTENSIONS: str(extension.index), rs.TAG_SPEC_HASH: spec.spec_hash()},
        files={rs.EXTENSION_SPEC_TEMPLATE.format(extension.index):
               mask_secrets(effective_spec_text(spec_path, overrides))},
    )
    print(f"extending sweep run {log.journal.parent_run_id} (extension {extension.index}): "
          f"{len(extension.prior.points)} configurations finished before are not run again",
          file=sys.stderr)


def earlier_outcomes(spec: SweepSpec, parent_run_id: str, extension: Extension) -> list[TrialOutcome]:
    """The outcomes of the Tune runs before this extension, with the hyperparameters their MLflow
    runs record."""
    outcomes = []
    for index in range(extension.index):
        name = tune_experiment(spec.name, parent_run_id, index)
        outcomes += recorded_outcomes(spec, name, extension.params)
    return [replace(o, params=extension.params[o.trial_id]) for o in outcomes]


def record_evaluation(log: SweepLog, journal: Journal, spec: SweepSpec, spec_path: Path,
                      experiment_id: str, selection, extension: Extension) -> int:
    """Journals an extension's test evaluation, if it made one: the selection as a sweep records
    it (parent_records.record_selection: the newly tested trials' metrics, predictions and
    nli.selected, the parent's summary at step evaluation - 1, its best run), which evaluation
    tested them, and nli.selected=false on the trials selected before and no more (they keep
    their test metrics). Returns the index of the evaluation the parent's test accuracy is from."""
    if not selection.tested:
        print(f"the selection on dev did not change: test data was not evaluated again (the test "
              f"accuracy is evaluation {extension.evaluations}'s)", file=sys.stderr)
        return extension.evaluations
    evaluation = extension.evaluations + 1
    record_selection(log, journal, spec, spec_path, experiment_id, selection, step=evaluation - 1)
    for trial_id in selection.tested:
        log.add(tags={rs.TAG_TEST_EVALUATION: str(evaluation)}, trial_id=trial_id)
    for trial_id in extension.selected - selection.selected:
        log.add(tags={rs.TAG_SELECTED: "false"}, trial_id=trial_id)
    log.add(tags={rs.TAG_TEST_EVALUATIONS: str(evaluation)})
    return evaluation
