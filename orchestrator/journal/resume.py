"""`--resume` from the sweep's own journal when Tune's experiment state is missing or torn.

Tune continues a sweep from its experiment folder (tuner.pkl, experiment_state-*.json, the search
state). Ray rewrites those files in place, so a driver killed while it saves leaves them empty or
cut short (issue 27), and a user may delete them; Tuner.restore then fails (a bare `Aborted!`
from the EOFError of an empty tuner.pkl). The sweep's journal (operations.py) still holds each
trial's params, how it ended and where its checkpoint is. For a grid that is enough: a fresh Tuner
runs the planned points the journal does not show finished (a finished trial counts only while
its checkpoint is there, which the test evaluation loads), each on the run of an earlier
unfinished trial of the same point when there is one (the recorder skips the epochs that run
already holds), and the finished trials' outcomes are rebuilt from the journal for the selection.
An Optuna sampler's state is what is torn, so a fresh sampler stands in for it: it is
told each finished configuration as an evaluated trial (what Tune told the original,
ray_search.told_result: the mean over its finished seeds of the last search.metric, or with
search.objectives each objective's final value; ray_search.PriorTrials, as --warm-start tells
one), skips its own proposals of it (ray_search.DistinctProposals), and draws the configurations
left of search.num_samples. Before it draws, the seeds not finished of every configuration the journal
holds run again (ray_search.FirstPoints), each on the run of an earlier unfinished trial of it if
there is one; the sampler is told such a configuration once all its seeds ended. The fresh
Tuner runs exactly the planned trials less the finished ones.

The fresh Tuner runs in its own experiment folder (REBUILT_SUFFIX), so its state is never taken
for the sweep's original one; each resume from the journal sets the Tune state files it finds
aside (renamed, never deleted) and starts from the journal again.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs

from nli_models.data import PreparedData
from orchestrator.journal.operations import Journal, Op, journal_file, read_records
from orchestrator.ray_adapter.ray_search import (
    PriorTrials,
    grid_points,
    param_space,
    told_result,
    without_seed,
)
from orchestrator.ray_adapter.ray_trial import trial_params
from orchestrator.ray_adapter.stacks import MemberHistory
from orchestrator.ray_adapter.tuner import (
    StopHook,
    TrialListener,
    TrialOutcome,
    checkpoint_at,
    read_tune_pickle,
    run_tuner,
)
from orchestrator.sweep.extend import tune_experiment
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.warm_start import (
    config_key,
    evaluated_points,
    finite_space,
    point_of,
    searched,
)
from results import run_schema as rs

REBUILT_SUFFIX = "-from-journal"  # the experiment folder of a Tuner started from the journal
SET_ASIDE_SUFFIX = ".set-aside"  # a Tune state file a resume from the journal no longer uses
# Tune's state of an experiment: (file name pattern, how to read it, required for a restore).
# Tune reads the newest of each pattern (timestamped names sort as text); the search states are
# cloudpickle whatever their suffix (ray.tune.utils.util._atomic_save).
TUNE_STATE_FILES = (
    ("tuner.pkl", read_tune_pickle, True),
    ("experiment_state-*.json", json.loads, True),
    ("basic-variant-state-*.json", read_tune_pickle, False),
    ("search_gen_state-*.json", read_tune_pickle, False),
    ("searcher-state-*.pkl", read_tune_pickle, False),
)


def experiment_name(spec: SweepSpec, parent_run_id: str) -> str:
    """The sweep's Tune experiment folder under storage_path."""
    return tune_experiment(spec.name, parent_run_id, 0)


def _experiment_path(spec: SweepSpec, name: str) -> str:
    return f"{spec.storage_path.rstrip('/')}/{name}"  # Path() would fold "s3://" into "s3:/"


def _state_files(path: str) -> tuple[pyarrow.fs.FileSystem, str, list[str]]:
    fs, fs_path = pyarrow.fs.FileSystem.from_uri(path)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(fs_path, allow_not_found=True))
    names = [Path(info.path).name for info in infos if info.type == pyarrow.fs.FileType.File]
    return fs, fs_path, names


def tune_state_problem(path: str) -> str | None:
    """What makes Tune's state of the experiment at `path` unusable (None: Tuner.restore can
    read it): a required file missing, or the newest file of a kind unreadable."""
    fs, fs_path, names = _state_files(path)
    if not names:
        return f"{path} holds no Tune experiment state"
    for pattern, load, required in TUNE_STATE_FILES:
        matching = sorted(fnmatch.filter(names, pattern))
        if not matching:
            if not required:
                continue
            aside = fnmatch.filter(names, pattern + SET_ASIDE_SUFFIX)
            return f"{path}/{pattern} is missing" + (" (set aside by an earlier resume)" if aside else "")
        with fs.open_input_file(f"{fs_path}/{matching[-1]}") as handle:
            content = handle.readall()
        try:
            load(content)
        except Exception as exc:  # any way a cut file fails to load (EOFError, JSONDecodeError, ...)
            return f"{path}/{matching[-1]} is torn ({len(content)} bytes; {type(exc).__name__})"
    return None


def _set_aside(path: str) -> None:
    """Rename Tune's state files at `path` so that no later restore reads them."""
    fs, fs_path, names = _state_files(path)
    for name in names:
        if any(fnmatch.fnmatch(name, pattern) for pattern, _, _ in TUNE_STATE_FILES):
            fs.move(f"{fs_path}/{name}", f"{fs_path}/{name}{SET_ASIDE_SUFFIX}")


@dataclass
class RecordedTrial:
    """One trial as the journal holds it: its params (the base config's included), its last
    ending (None: none since its last start), final metrics, its last epoch's metrics (what Tune
    told the sampler) and its checkpoint folder."""

    params: dict[str, Any] = field(default_factory=dict)
    status: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    last_epoch: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None


def recorded_trials(path: Path) -> dict[str, RecordedTrial]:
    trials: dict[str, RecordedTrial] = {}
    if not path.exists():
        return trials
    for _, record in read_records(path):
        if not record.trial_id:
            continue  # the parent run's
        trial = trials.setdefault(record.trial_id, RecordedTrial())
        if record.kind == Op.START:
            trial.params, trial.status = record.data["params"], None
        elif record.kind == Op.FINISH:
            trial.status, trial.values = record.data["status"], record.data["values"]
        elif record.kind == Op.EPOCH:
            trial.last_epoch = record.data["values"]
        elif record.kind == Op.ARTIFACTS and record.data.get("dest") == rs.ARTIFACT_CHECKPOINT_DIR:
            trial.checkpoint = record.data["path"]
    return trials


def member_history(path: Path) -> MemberHistory:
    """What a resumed stacked sweep's driver is told of its trials (stacks.MemberHistory): which
    ended, and every epoch's metrics in the journal's order (its per-member scheduler is told
    them again). Trials of no stack are in it too; only members' ids are looked up.

    Args:
        path: the sweep's journal.
    """
    history = MemberHistory()
    if not path.exists():
        return history
    for _, record in read_records(path):
        if not record.trial_id:
            continue
        if record.kind == Op.START:
            history.ended.discard(record.trial_id)
        elif record.kind == Op.FINISH and record.data["status"] in ("FINISHED", "FAILED"):
            history.ended.add(record.trial_id)
        elif record.kind == Op.EPOCH:
            history.epochs.append((record.trial_id, int(record.data["step"]), record.data["values"]))
    return history


def check_resumable(spec: SweepSpec, parent_run_id: str | None) -> str | None:
    """For `--resume` of sweep run `parent_run_id`: None when Tune can restore it (or no trial
    of it started: a fresh start loses nothing), else what is unusable in Tune's state, for
    resume_from_journal."""
    if parent_run_id is None or not recorded_trials(journal_file(spec.storage_path, parent_run_id)):
        return None
    return tune_state_problem(_experiment_path(spec, experiment_name(spec, parent_run_id)))


def _point_key(params: dict[str, Any], names: list[str]) -> str:
    return json.dumps({name: params.get(name) for name in names}, sort_keys=True, default=str)


@dataclass
class JournalPlan:
    """What the journal leaves to do: `kept`, the finished trials' outcomes; `remaining`, the
    grid points (seed included) still to train, or a sampler's points that run before it draws
    (the configurations of its unfinished trials, each seed not finished); `reuse`, point key ->
    earlier unfinished trials of that point, whose runs the new trials take over;
    `lost_checkpoints`, finished trials trained again because their checkpoint folder is gone;
    `prior`, what a sampler is told (the finished configurations, `remaining` as its `first`)
    and how many trials the fresh Tuner runs (None: a grid)."""

    names: list[str]
    kept: list[TrialOutcome]
    remaining: list[dict[str, Any]]
    reuse: dict[str, list[str]]
    lost_checkpoints: int
    prior: PriorTrials | None = None

    @property
    def to_run(self) -> int:
        return len(self.remaining) if self.prior is None else self.prior.num_trials


def _checkpoint_there(path: str | None) -> bool:
    if not path:
        return False
    fs, fs_path = pyarrow.fs.FileSystem.from_uri(path)
    return fs.get_file_info(fs_path).type == pyarrow.fs.FileType.Directory


def _kept(trial_id: str, point: dict[str, Any], trial: RecordedTrial) -> TrialOutcome:
    return TrialOutcome(trial_id, point, dict(trial.values), checkpoint_at(trial.checkpoint), None)


def plan_from_journal(spec: SweepSpec, journal_path: Path) -> JournalPlan:
    search = spec.search.model_dump()
    if spec.search.sampler == "grid":
        planned = [trial_params(config, search) for config in grid_points(param_space(spec))]
        names = sorted(planned[0])
    else:
        names = sorted({*searched(spec), rs.PARAM_SEED})
    finished: dict[str, list[tuple[str, RecordedTrial]]] = {}
    reuse: dict[str, list[str]] = {}
    lost_checkpoints = 0
    trials = recorded_trials(journal_path)
    for trial_id, trial in trials.items():
        key = _point_key(trial.params, names)
        if trial.status == "FINISHED" and _checkpoint_there(trial.checkpoint):
            finished.setdefault(key, []).append((trial_id, trial))
        else:
            lost_checkpoints += trial.status == "FINISHED"
            reuse.setdefault(key, []).append(trial_id)
    if spec.search.sampler != "grid":
        return _sampler_plan(spec, trials, names, finished, reuse, lost_checkpoints)
    kept, remaining = [], []
    for point in planned:
        done = finished.get(_point_key(json.loads(json.dumps(point, default=str)), names))
        if not done:
            remaining.append(point)
            continue
        trial_id, trial = done.pop(0)
        kept.append(_kept(trial_id, point, trial))
    return JournalPlan(names, kept, remaining, reuse, lost_checkpoints)


def _sampler_plan(spec: SweepSpec, trials: dict[str, RecordedTrial], names: list[str],
                  finished: dict[str, list[tuple[str, RecordedTrial]]], reuse: dict[str, list[str]],
                  lost_checkpoints: int) -> JournalPlan:
    """A sampler's sweep: every finished trial is kept and its configuration told to the sampler
    (the mean over its finished seeds of what Tune told of them, told_result); each seed not
    finished of a configuration the journal holds runs first, on the run of an earlier trial of
    it if there is one; the sampler draws the configurations left of search.num_samples."""
    search = spec.search.model_dump()
    configurations: dict[str, dict[str, Any]] = {}  # configuration key -> Tune config (no seed)
    for trial_id, trial in trials.items():
        point = point_of(spec, trial.params, f"--resume: trial {trial_id}")
        configurations.setdefault(config_key(point), point)
    kept, measured = [], []
    for done in finished.values():
        for trial_id, trial in done:
            point = point_of(spec, trial.params, f"--resume: trial {trial_id}", seed=True)
            kept.append(_kept(trial_id, trial_params(point, search), trial))
            # The journal's last epoch and final values: a trial's latest value of each metric.
            measured.append((without_seed(point), told_result(spec, {**trial.last_epoch, **trial.values})))
    first = [{**configuration, rs.PARAM_SEED: seed} for configuration in configurations.values()
             for seed in spec.search.seeds]
    first = [point for point in first
             if not finished.get(_point_key(trial_params(point, search), names))]
    seeds = len(spec.search.seeds)
    draws = max(spec.num_trials() - len(kept) - len(first), 0) // seeds
    points, values = evaluated_points(measured)
    prior = PriorTrials(points, values, num_trials=len(first) + draws * seeds,
                        finite_space=finite_space(spec), first=first)
    return JournalPlan(names, kept, first, reuse, lost_checkpoints, prior)


def _spec_of(spec: SweepSpec, points: list[dict[str, Any]]) -> SweepSpec:
    """The spec whose grid is exactly `points` (each a configuration carrying its seed, which
    ray_trial.trial_params lets override the one-seed grid)."""
    search = spec.search.model_copy(update={"space": {}, "configurations": points, "seeds": [points[0]["seed"]]})
    return spec.model_copy(update={"search": search})


class _SameRuns:
    """A TrialListener in front of the driver's: a new trial whose point an earlier unfinished
    trial had is reported under that trial's id, so it continues that trial's run."""

    def __init__(self, listener: TrialListener, plan: JournalPlan):
        self.listener = listener
        self.plan = plan
        self.ids: dict[str, str] = {}  # new trial id -> the id it is recorded under

    def recorded_id(self, trial_id: str) -> str:
        return self.ids.get(trial_id, trial_id)

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        if trial_id not in self.ids:
            earlier = self.plan.reuse.get(_point_key(json.loads(json.dumps(params, default=str)), self.plan.names))
            self.ids[trial_id] = earlier.pop(0) if earlier else trial_id
        self.listener.trial_started(self.ids[trial_id], params)

    def __getattr__(self, name: str) -> Callable[..., None]:
        method = getattr(self.listener, name)
        if name == "sweep_ended":
            return method
        return lambda trial_id, *args: method(self.recorded_id(trial_id), *args)


def resume_from_journal(
    spec: SweepSpec, data: PreparedData, journal: Journal, problem: str, listener: TrialListener,
    verbose: int, on_stop: StopHook | None,
) -> list[TrialOutcome]:
    """Run the trials the journal does not show finished in a fresh Tuner (see the module
    docstring); returns every planned trial's outcome, the kept ones rebuilt from the journal."""
    plan = plan_from_journal(spec, journal.path)
    told = "" if plan.prior is None else (
        f"; the {spec.search.sampler} sampler is told the {len(plan.prior.points)} finished "
        f"configuration{'s' * (len(plan.prior.points) != 1)}, runs the unfinished ones' {len(plan.remaining)} trials first and draws the rest")
    print(
        f"resume: Tune's experiment state is unusable ({problem}); continuing from the sweep's journal: "
        f"{len(plan.kept)} finished trial{'s' * (len(plan.kept) != 1)} kept, {plan.to_run} of "
        f"{spec.num_trials()} planned trials to run{told} (an unfinished trial restarts from its first epoch on its own run"
        + (f"; {plan.lost_checkpoints} finished trial{'s' * (plan.lost_checkpoints != 1)} train "
           "again: their checkpoints are gone"
           if plan.lost_checkpoints else "") + ")",
        file=sys.stderr,
    )
    name = experiment_name(spec, journal.parent_run_id)
    for path in (_experiment_path(spec, name), _experiment_path(spec, name + REBUILT_SUFFIX)):
        _set_aside(path)
    if not plan.to_run:
        return plan.kept
    same_runs = _SameRuns(listener, plan)
    run_spec = _spec_of(spec, plan.remaining) if plan.prior is None else spec
    outcomes = run_tuner(run_spec, data, name + REBUILT_SUFFIX, [same_runs],
                         resume=False, verbose=verbose, on_stop=on_stop, prior=plan.prior)
    for outcome in outcomes:
        outcome.trial_id = same_runs.recorded_id(outcome.trial_id)
    return plan.kept + outcomes
