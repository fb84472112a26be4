"""The Tuner of a sweep (the Ray adapter's side of the driver): the trials run or resumed with Tune,
Tune's driver-side events forwarded to plain listeners, each trial's outcome, and Tune's
checkpoints and pickled experiment state read back."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ray
from ray import tune
from ray.tune.result import TRIAL_ID

from nli_models.data import PreparedData
from orchestrator.ray_adapter.ray_runtime import trial_slots
from orchestrator.ray_adapter.ray_search import (
    PriorTrials,
    grid_points,
    make_scheduler,
    make_searcher,
    param_space,
)
from orchestrator.ray_adapter.ray_trial import run_trial, trial_params
from orchestrator.ray_adapter.stack_trial import run_stack_trial
from orchestrator.ray_adapter.stacks import (
    SAMPLED_STACK_SPACE,
    MemberHistory,
    StackEvents,
    StackProposals,
    is_stack,
    member_configs,
    stack_space,
)
from orchestrator.sweep.spec import SweepSpec
from results import run_schema as rs
from results.trial_result import TrialResult


class TrialListener(Protocol):
    """What the driver-side listeners (MLflow tracking, terminal progress) are told."""

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None: ...
    def trial_result(self, trial_id: str, metrics: dict[str, Any]) -> None: ...
    def trial_completed(self, trial_id: str, last: dict[str, Any], checkpoint_dir: str | None) -> None: ...
    def trial_errored(self, trial_id: str, params: dict[str, Any], error: str) -> None: ...
    def trial_retried(self, trial_id: str, retries: int, cause: str, resumed_from_epoch: int) -> None: ...
    def trial_cut(self, trial_id: str) -> None: ...  # stopped by an interruption, resumable
    def trial_checkpoint(self, trial_id: str, checkpoint_dir: str) -> None: ...  # a stack member's, after its end
    def sweep_ended(self) -> None: ...


StopHook = Callable[[Callable[[], None]], None]


@dataclass
class _Driver:
    """What the sweep this process drives is told through (a process runs one Tuner at a time).
    Tune pickles its run config, callbacks included, into the experiment folder, and Tuner.restore
    brings the interrupted driver's callbacks back (it takes no run config): a callback reads the
    listeners here when it is called, so a restored one tells the driver that resumed it."""

    listeners: list[TrialListener] = field(default_factory=list)
    on_stop: StopHook | None = None
    stacks: StackEvents | None = None  # a stacked sweep's (stacks.py)


_driver = _Driver()


class _Events(tune.Callback):
    """Forwards Tune's driver-side events to this process's listeners (_driver), with flat trial
    params."""

    def __init__(self, search: dict):
        self.search = search

    @property
    def listeners(self) -> list[TrialListener]:
        return _driver.listeners

    def setup(self, **info):
        # tune.run has installed its stop handler (on SIGUSR1 always; on SIGINT unless
        # TUNE_DISABLE_SIGINT_HANDLER, which run_tuner sets so that SIGINT stays the driver's).
        # Calling it is Tune's own Ctrl-C: the loop ends, the experiment state is saved as it
        # stands (what Tuner.restore continues), then the trials are stopped.
        tune_stop = signal.getsignal(signal.SIGUSR1)
        if _driver.on_stop is not None and callable(tune_stop):
            _driver.on_stop(lambda: tune_stop(signal.SIGUSR1, None))

    def _params(self, trial) -> dict[str, Any]:
        return trial_params(trial.config, self.search)

    @staticmethod
    def _stack(trial) -> StackEvents | None:
        """The stacked sweep's events when `trial` trains a stack (its members are the trials)."""
        return _driver.stacks if is_stack(trial.config) else None

    def on_trial_start(self, iteration, trials, trial, **info):
        if (stack := self._stack(trial)) is not None:
            stack.started(trial)
            return
        for listener in self.listeners:
            listener.trial_started(trial.trial_id, self._params(trial))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if (stack := self._stack(trial)) is not None:
            stack.result(trial, result)
            return
        for listener in self.listeners:
            listener.trial_result(trial.trial_id, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        if (stack := self._stack(trial)) is not None:
            stack.completed(trial)
            return
        checkpoint = trial.checkpoint
        path = checkpoint.path if checkpoint is not None else None
        for listener in self.listeners:
            listener.trial_completed(trial.trial_id, dict(trial.last_result or {}), path)

    def on_trial_recover(self, iteration, trials, trial, **info):
        # Tune restarts the trial from its latest checkpoint (or from scratch without one).
        saved = trial.latest_checkpoint_result
        epoch = int(saved.metrics.get(rs.METRIC_EPOCHS_TRAINED, 0)) if saved is not None else 0
        cause = _trial_error_text(trial)
        if (stack := self._stack(trial)) is not None:
            stack.retried(trial, trial.num_failures, cause, epoch)
            return
        for listener in self.listeners:
            listener.trial_retried(trial.trial_id, trial.num_failures, cause, epoch)

    def on_trial_error(self, iteration, trials, trial, **info):
        error = _trial_error_text(trial)
        if (stack := self._stack(trial)) is not None:
            stack.errored(trial, error)
            return
        for listener in self.listeners:
            listener.trial_errored(trial.trial_id, self._params(trial), error)

    def on_experiment_end(self, trials, **info):
        for listener in self.listeners:
            listener.sweep_ended()


def _trial_error_text(trial) -> str:
    path = getattr(trial, "error_file", None)
    if path and Path(path).exists():
        return Path(path).read_text()
    error = trial.get_error() if hasattr(trial, "get_error") else None
    return str(error) if error is not None else "unknown error"


@dataclass
class TrialOutcome:
    trial_id: str
    params: dict[str, Any]
    metrics: dict[str, Any]
    checkpoint: tune.Checkpoint | None  # on local disk, a shared folder or s3://
    error: str | None

    @property
    def result(self) -> TrialResult:
        """The trial's TrialResult as its last Tune result reported it."""
        return TrialResult.from_metrics(self.metrics)

    def local_checkpoint(self):
        """Context manager: the checkpoint as a local folder (downloaded if remote)."""
        return self.checkpoint.as_directory()


def checkpoint_at(path: str) -> tune.Checkpoint:
    """The Tune checkpoint a trial left at `path`.

    Args:
        path: the checkpoint's folder, on local disk, a shared folder or s3://.
    """
    return tune.Checkpoint(path)


def read_tune_pickle(content: bytes) -> Any:
    """A file of Tune's experiment state that Tune pickled (tuner.pkl, the search states), read
    with the cloudpickle Tune wrote it with.

    Args:
        content: the file's bytes.
    """
    return ray.cloudpickle.loads(content)


def run_tuner(
    spec: SweepSpec,
    data: PreparedData,
    experiment_name: str,
    listeners: list[TrialListener],
    resume: bool,
    verbose: int = 0,
    on_stop: StopHook | None = None,
    prior: PriorTrials | None = None,
    members: MemberHistory | None = None,
) -> list[TrialOutcome]:
    """Run (or resume) the sweep; returns every trial's outcome as Tune last knew it (after a
    stop Tune calls unfinished trials TERMINATED: the listeners, not these statuses, tell which
    trials ended). `on_stop` is given a function that stops the running fit() as Ctrl-C would.
    `prior`: an earlier sweep's finished configurations (--warm-start, --extend, a resume from
    the journal: orchestrator/journal/resume.py). `members`: a resumed stacked sweep's members as
    its journal holds them (stacks.MemberHistory). A stacked sweep (search.stack) returns each
    member's outcome, under the member's id. Never raises for a failed trial."""
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # the driver handles SIGINT (lifecycle.py)
    if not verbose:  # a stop makes Tune log how to restore by hand; the driver says it its way
        logging.getLogger("ray.tune").setLevel(logging.ERROR)
        # Tune's TensorBoard logger warns "NaN or Inf found in input tensor." for a diverged
        # trial's metrics; the sweep says that trial diverged itself.
        logging.getLogger("tensorboardX").setLevel(logging.ERROR)
    search_dump = spec.search.model_dump()
    stack_size, _ = spec.stacking(trial_slots(spec))
    members = members or MemberHistory()
    stops_name = f"nli-member-stops-{experiment_name}"
    trainable = _trainable(spec, data, stops_name if stack_size > 1 else None)
    experiment_path = _experiment_path(spec, experiment_name)
    if resume and tune.Tuner.can_restore(experiment_path):
        # The restored run config is the interrupted driver's: its callbacks find this driver's
        # listeners (_driver), and Tune's own tables keep the verbosity the sweep started with.
        tuner = tune.Tuner.restore(
            experiment_path, trainable=trainable, resume_unfinished=True, resume_errored=True
        )
    else:
        search = spec.search
        num_samples = 1 if search.sampler == "grid" else search.num_samples * len(search.seeds)
        if prior is not None and prior.num_trials is not None:
            num_samples = prior.num_trials
        space, searcher = _search(spec, prior, stack_size, num_samples)
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                # With objectives the searcher holds them (optuna_search) and FIFO needs none.
                metric=None if search.objectives else search.metric,
                mode=None if search.objectives else search.mode,
                search_alg=searcher,
                # A stack's members are scheduled by the driver (stacks.MemberScheduler).
                scheduler=make_scheduler(spec) if stack_size == 1 else None,
                num_samples=num_samples,
                max_concurrent_trials=search.max_concurrent_trials,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=experiment_name,
                storage_path=spec.storage_path,
                callbacks=[_Events(search_dump)],
                verbose=verbose,
                # One checkpoint: the latest, which also carries the best-on-dev weights.
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                failure_config=tune.FailureConfig(max_failures=search.max_failures),
            ),
        )
    _driver.listeners, _driver.on_stop = listeners, on_stop
    if stack_size > 1:
        _driver.stacks = StackEvents(spec, lambda: _driver.listeners, stops_name, members)
    try:
        grid = tuner.fit()
    finally:
        if _driver.stacks is not None:
            ray.kill(_driver.stacks.stops)
        _driver.listeners, _driver.on_stop, _driver.stacks = [], None, None
    return _outcomes(grid, lambda _, config: trial_params(config, search_dump))


def _search(spec: SweepSpec, prior: PriorTrials | None, stack_size: int, num_samples: int):
    """Tune's param space and searcher of a new run of the sweep (search.stack: a grid over its
    stacks, or a sampler's proposals drawn a stack at a time)."""
    space, searcher = param_space(spec, prior), make_searcher(spec, prior)
    if stack_size == 1:
        return space, searcher
    search, fields = spec.search.model_dump(), spec.stacked_fields()
    if searcher is None:  # a grid
        return stack_space(grid_points(space), search, stack_size, fields), None
    return SAMPLED_STACK_SPACE, StackProposals(searcher, space, stack_size, search, fields, num_samples)


def recorded_outcomes(spec: SweepSpec, experiment_name: str, params: dict[str, dict[str, Any]]) -> list[TrialOutcome]:
    """The outcomes of an earlier Tune run of the sweep (an extended sweep's earlier trials),
    read from its experiment folder without running anything: those of the trials in `params`
    (trial id -> its hyperparameters as recorded; an earlier spec's configuration and seed
    indices need not be this spec's). Read with Tune's ExperimentAnalysis, not Tuner.restore,
    which wants the earlier run's trainable: run_trial or run_stack_trial, as its search.stack was."""
    analysis = tune.ExperimentAnalysis(_experiment_path(spec, experiment_name))
    outcomes = _outcomes(tune.ResultGrid(analysis), lambda trial_id, _: params.get(trial_id, {}))
    return [outcome for outcome in outcomes if outcome.trial_id in params]


def _experiment_path(spec: SweepSpec, experiment_name: str) -> str:
    return f"{spec.storage_path.rstrip('/')}/{experiment_name}"  # Path() folds s3:// into s3:/


def _trainable(spec: SweepSpec, data: PreparedData, stops: str | None = None):
    """The sweep's Tune trainable: run_trial, or with `stops` (the MemberStops actor's name)
    run_stack_trial."""
    stacked = {"stops": stops} if stops is not None else {}
    trainable = tune.with_parameters(
        run_stack_trial if stops is not None else run_trial,
        base=spec.base_config().model_dump(exclude_unset=True),
        search=spec.search.model_dump(),
        data=data,  # put in the object store once; every trial reads the same copy
        **stacked,
    )
    resources = {"cpu": spec.search.resources.cpu, "gpu": spec.search.resources.gpu}
    return tune.with_resources(trainable, resources)


def _outcomes(grid, params_of: Callable[[str, dict], dict[str, Any]]) -> list[TrialOutcome]:
    """TrialOutcomes of a ResultGrid, a stacked trial's as its members'; `params_of(trial id,
    Tune's config)`: its hyperparameters."""
    outcomes = []
    for result in grid:
        error = None
        if result.error is not None:
            error = str(result.error)
        trial_id = result.metrics.get(TRIAL_ID) if result.metrics else None
        trial_id = trial_id or Path(result.path).name
        config, metrics = result.config or {}, dict(result.metrics or {})
        if is_stack(config):
            path = result.checkpoint.path if result.checkpoint is not None else None
            for member, member_config, report, folder in member_configs(trial_id, config, metrics, path):
                outcomes.append(TrialOutcome(member, params_of(member, member_config), report,
                                             checkpoint_at(folder) if folder else None, error))
            continue
        outcomes.append(TrialOutcome(trial_id, params_of(trial_id, config), metrics, result.checkpoint, error))
    return outcomes

