"""The only module that touches Ray Tune's API: the trial function, the search space, samplers,
schedulers, the Tuner and its callbacks. A Ray release that moves things changes this file alone.

Ray 2.60 runs Train V2: inside a trial only ray.tune.report / get_checkpoint / get_context work.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import ray
import torch
import yaml
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import TRAINING_ITERATION, TRIAL_ID
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler
from ray.tune.search import ConcurrencyLimiter, Repeater, Searcher
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.repeater import TRIAL_INDEX
from ray.tune.search.variant_generator import generate_variants

from nli_models.config import RunConfig
from nli_models.cpus import usable_cpus
from nli_models.data import PreparedData
from nli_models.errors import InputError
from nli_models.training import (
    TRIAL_CONFIG_FILE,
    EpochResult,
    Trainer,
    TrainingDiverged,
    make_trainer,
)
from nli_models.training.device_info import describe_device
from orchestrator.environment import WAIT_POLICY, trial_threads
from orchestrator.reaper import start_reaper
from orchestrator.spec import SweepSpec, apply_hyperparameters
from results import run_schema as rs
from results.trial_result import TrialResult

CONFIGURATION_KEY = "configuration"
POINT_KEY = "point"  # a grid --extend: Tune's grid runs over the points still to run, whole
FAIL_ONCE_ENV = "NLI_FAIL_ONCE_AT_EPOCH"  # fault injection for recovery tests: "EPOCH:MARKER_DIR"
EPOCH_DELAY_ENV = "NLI_EPOCH_DELAY_S"  # lifecycle tests: every epoch lasts this much longer


# -- inside a trial ---------------------------------------------------------------------------
def trial_params(tune_config: dict[str, Any], spec_search: dict[str, Any]) -> dict[str, Any]:
    """Flat hyperparameters of a trial (the names logged to MLflow) from Tune's config."""
    tune_config = tune_config.get(POINT_KEY, tune_config)
    params = {k: v for k, v in tune_config.items() if k not in (CONFIGURATION_KEY, TRIAL_INDEX)}
    if CONFIGURATION_KEY in tune_config:
        params.update(spec_search["configurations"][tune_config[CONFIGURATION_KEY]])
    if TRIAL_INDEX in tune_config:  # Repeater: the n-th repeat of a sampled configuration
        params["seed"] = spec_search["seeds"][tune_config[TRIAL_INDEX]]
    elif "seed" not in params:  # one seed and no grid over it
        params["seed"] = spec_search["seeds"][0]
    return params


def _maybe_inject_failure(epoch: int) -> None:
    setting = os.environ.get(FAIL_ONCE_ENV)
    if not setting:
        return
    at_epoch, marker_dir = setting.split(":", 1)
    marker = Path(marker_dir) / tune.get_context().get_trial_id()
    if epoch == int(at_epoch) and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"injected failure at epoch {epoch} ({FAIL_ONCE_ENV})")


def trial_result(trainer: Trainer, epochs_trained: int) -> TrialResult:
    """What the trial has achieved after `epochs_trained` epochs."""
    state = trainer.state
    return TrialResult(
        best_dev_accuracy=state.best_dev_accuracy,
        best_train_accuracy=state.best_train_accuracy,
        best_epoch=state.best_epoch,
        epochs_trained=epochs_trained,
        theta_m=trainer.theta_m,
        theta_wm=trainer.theta_wm,
    )


def epoch_metrics(trainer: Trainer, result: EpochResult, finished: bool) -> dict[str, Any]:
    """The Tune result of an epoch: its metrics and the trial's TrialResult, named as MLflow
    records them (results/run_schema.py)."""
    return {
        rs.METRIC_TRAIN_LOSS: result.train_loss,
        rs.METRIC_TRAIN_ACCURACY: result.train_accuracy,
        rs.METRIC_DEV_LOSS: result.dev_loss,
        rs.METRIC_DEV_ACCURACY: result.dev_accuracy,
        rs.METRIC_EPOCH_TIME: result.epoch_time_s,
        **trial_result(trainer, result.epoch).metrics(),
        rs.RESULT_TRIAL_FINISHED: int(finished),
    }


def trial_device(configured: str) -> str:
    """The training.device of a trial, which sees only the GPUs Ray gave it. Ray 2.60 sets
    CUDA_VISIBLE_DEVICES only for workers it gives GPUs (ray/_private/accelerators/accelerator.py,
    ray-project/ray#54868): a trial with resources.gpu 0 would see every GPU of its node, and
    `auto` would take cuda:0. Without GPU ids the GPUs are hidden before torch initialises CUDA
    here, and `auto` is the CPU whatever CUDA says."""
    if ray.get_gpu_ids():
        return configured
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return "cpu" if configured == "auto" else configured


def device_tags(trainer: Trainer) -> dict[str, str]:
    """What the trial trains on, under its MLflow tag names (reported with every epoch: the
    recorder tags the run when it first comes and when a retry ran elsewhere)."""
    described = describe_device(trainer.device, trainer.autocast_dtype)
    return {tag: described[key] for key, tag in rs.DEVICE_TAGS.items()}


def run_trial(tune_config: dict[str, Any], *, base: dict, search: dict, data: PreparedData) -> None:
    """A Tune function trainable: the foundation's trainer with a report and checkpoint per epoch."""
    config = apply_hyperparameters(RunConfig.model_validate(base), trial_params(tune_config, search))
    training = config.training
    config = config.model_copy(
        update={"training": training.model_copy(update={"device": trial_device(training.device)})}
    )
    torch.set_num_threads(trial_threads(tune.get_context().get_trial_resources().required_resources.get("CPU", 1)))
    trainer = make_trainer(config, data)
    config_yaml = yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True), sort_keys=False)
    device = device_tags(trainer)  # once: this process trains on one device throughout
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            trainer.load_checkpoint(directory)

    def report(trainer: Trainer, result: EpochResult) -> None:
        _maybe_inject_failure(result.epoch)
        time.sleep(float(os.environ.get(EPOCH_DELAY_ENV) or 0))
        finished = trainer.finished()
        with tempfile.TemporaryDirectory() as directory:
            trainer.save_checkpoint(directory)
            # The config travels with the weights: `orchestrate attention` rebuilds the model
            # (and its vocabulary) from the checkpoint artifact alone.
            (Path(directory) / TRIAL_CONFIG_FILE).write_text(config_yaml)
            tune.report(
                {**epoch_metrics(trainer, result, finished), **device},
                checkpoint=tune.Checkpoint.from_directory(directory),
            )

    try:
        trainer.fit(report)
    except TrainingDiverged as exc:
        # Ends the trial (no retry: training is deterministic, it would diverge again) with a
        # last result that marks it; the worst possible metric keeps schedulers and Optuna off it.
        tune.report(diverged_result(trainer, exc))


def diverged_result(trainer: Trainer, exc: TrainingDiverged) -> dict[str, Any]:
    return {
        **trial_result(trainer, exc.epoch).metrics(),
        rs.METRIC_DEV_ACCURACY: 0.0,
        rs.METRIC_DEV_LOSS: float("inf"),
        rs.RESULT_TRIAL_FINISHED: 1,
        rs.METRIC_DIVERGED_EPOCH: exc.epoch,
        rs.METRIC_DIVERGED_STEP: exc.step,
        rs.RESULT_DIVERGED_LOSS: str(exc.loss),
    }


# -- the driver -------------------------------------------------------------------------------
@contextlib.contextmanager
def _sigterm_blocked():
    """SIGTERM blocked while the local Ray starts: its processes inherit the signal mask. SIGTERM
    to the sweep's whole process group (what `timeout`, SLURM and Kubernetes send) then reaches
    the driver alone, which stops the trials, records the state and shuts Ray down itself, as
    on Ctrl-C (Ray blocks SIGINT in its processes the same way); before, Ray's processes died
    first and the driver could record nothing. The driver's own mask is restored at once."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def joins_a_cluster(address: str | None) -> bool:
    """Whether init_ray joins a running cluster (--address or RAY_ADDRESS) rather than starting
    a private local instance."""
    return bool(address or os.environ.get("RAY_ADDRESS"))


def init_ray(address: str | None = None, verbose: bool = False, wait_policy: str | None = None) -> bool:
    """Join the cluster in RAY_ADDRESS / `address`, or start a local instance with the CPUs this
    process may use. `wait_policy`: the OMP_WAIT_POLICY of the job's workers (the trials), given
    in its runtime environment, so that it is set before a worker loads torch. Returns whether
    this call connected (False: the process was already connected, e.g. by a test session)."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": verbose, "logging_level": "INFO" if verbose else "WARNING"}
    if wait_policy is not None:
        kwargs["runtime_env"] = {"env_vars": {WAIT_POLICY: wait_policy}}
    if joins_a_cluster(address):
        ray.init(address=address or os.environ["RAY_ADDRESS"], **kwargs)
    else:
        # address="local": always a private instance. A bare ray.init() joins the cluster named in
        # Ray's current-cluster file, which a killed `ray start --head` leaves behind (a dead head
        # then hangs every local sweep). Ray would count every CPU of the machine, not the ones
        # this process may use (taskset, cpusets): trials would share them.
        with _sigterm_blocked():
            ray.init(address="local", num_cpus=usable_cpus(), include_dashboard=False, **kwargs)
        global _reaper
        _reaper = start_reaper()  # the local instance goes with this process, even on SIGKILL
    return True


AUTOSCALING_WAIT_S = 600.0  # on an autoscaling cluster: a GPU node boots in ~5-10 minutes
PROGRESS_EVERY_S = 15.0


def autoscaling() -> bool:
    """Whether the cluster's autoscaler can start nodes: its monitor reports the node types of a
    cluster config (`ray up`, KubeRay, ray.cluster_utils.AutoscalingCluster). A plain `ray start`
    or local instance runs it read-only, with each node's type named after the node itself."""
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.autoscaler._private.util import format_readonly_node_type
    from ray.experimental.internal_kv import _internal_kv_get

    status = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
    report = (json.loads(status).get("autoscaler_report") or {}) if status else {}
    types = (report.get("node_type_mapping") or {}).items()
    return any(name != format_readonly_node_type(node) for node, name in types)


def _fits(cpu: float, gpu: float) -> tuple[bool, list[dict]]:
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    return any(n.get("CPU", 0) >= cpu and n.get("GPU", 0) >= gpu for n in nodes), nodes


def check_resources(cpu: float, gpu: float, wait_s: float | None = None) -> None:
    """InputError when no node of the cluster can hold one trial (`resources.cpu` and
    `resources.gpu` per trial): Tune would wait forever. Until a node fits, the autoscaler is
    asked for one trial's worth (request_resources) and the sweep waits `wait_s` seconds
    (default: AUTOSCALING_WAIT_S on an autoscaling cluster, else none), saying so every
    PROGRESS_EVERY_S; the request is withdrawn once a node fits (Tune's own demand then keeps
    the cluster up) or the wait ends."""
    fits, nodes = _fits(cpu, gpu)
    if fits:
        return
    if wait_s is None:
        wait_s = AUTOSCALING_WAIT_S if autoscaling() else 0.0
    if wait_s > 0:
        from ray.autoscaler.sdk import request_resources

        bundle = {"CPU": cpu, **({"GPU": gpu} if gpu else {})}
        request_resources(bundles=[bundle])
        started = time.monotonic()
        try:
            while not fits and time.monotonic() - started < wait_s:
                print(f"waiting for a node with {cpu:g} CPU and {gpu:g} GPU (asked the Ray "
                      f"autoscaler): {time.monotonic() - started:.0f}s of {wait_s:.0f}s",
                      file=sys.stderr, flush=True)
                time.sleep(min(PROGRESS_EVERY_S, max(wait_s - (time.monotonic() - started), 0.1)))
                fits, nodes = _fits(cpu, gpu)
        finally:
            request_resources(bundles=[])
        if fits:
            return
    largest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={})
    waited = (f" after waiting {wait_s:.0f}s for the autoscaler to start one (--wait-for-resources)"
              if wait_s else "")
    raise InputError(
        f"search.resources: a trial asks for {cpu:g} CPU and {gpu:g} GPU, but no node of the Ray "
        f"cluster has that much{waited} (largest node: {largest.get('CPU', 0):g} CPU, "
        f"{largest.get('GPU', 0):g} GPU); ask for at most that per trial, join a larger cluster "
        "with --address, or on a cluster that adds nodes give it time with --wait-for-resources "
        "SECONDS"
    )


_reaper = None


def shutdown_ray() -> None:
    global _reaper
    ray.shutdown()
    if _reaper is not None:
        _reaper.terminate()
        _reaper.wait()
        _reaper = None


def cluster_resources() -> dict[str, float]:
    return ray.cluster_resources()


def _domain(kind: str, values: list[Any]):
    return {
        "grid": tune.grid_search,
        "choice": tune.choice,
        "uniform": lambda v: tune.uniform(*v),
        "loguniform": lambda v: tune.loguniform(*v),
        "randint": lambda v: tune.randint(v[0], v[1] + 1),  # inclusive, as written in the spec
    }[kind](values)


@dataclass(frozen=True)
class PriorTrials:
    """Configurations an earlier sweep finished (orchestrator/warm_start.py), as Tune configs.

    `points` and `values`: each configuration (searched names, CONFIGURATION_KEY) and what its
    sampler was told of it; an Optuna sampler gets them as evaluated trials, never as trials of
    this sweep. `grid`: a grid --extend's points still to run (seed included). `num_trials`:
    a sampler --extend's trials to run now. `finite_space`: every configuration of a space with
    no continuous domain (None with one), from which an unvisited one is enqueued when the
    sampler keeps proposing finished ones."""

    points: list[dict[str, Any]]
    values: list[float]
    grid: list[dict[str, Any]] | None = None
    num_trials: int | None = None
    finite_space: list[dict[str, Any]] | None = None


def param_space(spec: SweepSpec, prior: PriorTrials | None = None) -> dict[str, Any]:
    search = spec.search
    if prior is not None and prior.grid is not None:
        return {POINT_KEY: tune.grid_search(prior.grid)}
    space = {name: _domain(d.kind, d.values) for name, d in search.space.items()}
    grid = search.sampler == "grid"
    if search.configurations:
        indices = list(range(len(search.configurations)))
        space[CONFIGURATION_KEY] = tune.grid_search(indices) if grid else tune.choice(indices)
    if grid:
        space["seed"] = tune.grid_search(search.seeds)
    return space


def optuna_search(sampler: str, seed: int, objectives: Sequence[tuple[str, str]] = (),
                  prior: PriorTrials | None = None) -> OptunaSearch:
    """Tune's OptunaSearch over the named, seeded Optuna sampler (random | tpe | cmaes | nsga2);
    with `objectives` ((name, max|min) pairs) a multi-objective study, which Tune wants given
    here, not in TuneConfig. The configurations of `prior` are told as evaluated trials:
    OptunaSearch adds them with add_evaluated_point (Optuna's study.add_trial) once Tune gives it
    the space (set_search_properties); they are not this sweep's trials. Tune's space is a dict
    of distributions, not a define-by-run function, whose points_to_evaluate are ignored
    (ray-project/ray#35319). add_evaluated_point takes one value per trial: a prior goes with a
    single objective only (warm_start.check_single_objective refuses the rest)."""
    import optuna

    samplers = {
        "random": optuna.samplers.RandomSampler,
        "tpe": optuna.samplers.TPESampler,
        "cmaes": optuna.samplers.CmaEsSampler,
        "nsga2": optuna.samplers.NSGAIISampler,
    }
    options: dict[str, Any] = {}
    if objectives:
        options["metric"] = [objective_result_key(name) for name, _ in objectives]
        options["mode"] = [direction for _, direction in objectives]
    if prior is not None and prior.points:
        options["points_to_evaluate"], options["evaluated_rewards"] = prior.points, prior.values
    return OptunaSearch(sampler=samplers[sampler](seed=seed), **options)


def objective_result_key(objective: str) -> str:
    """The key of a trial's Tune result that holds an objective: every epoch reports it, and the
    last one is what the searcher is told (the value the recorder stores under
    rs.OBJECTIVE_METRICS[objective]; Tune's own time_total_s becomes trial_time_s)."""
    metric = rs.OBJECTIVE_METRICS[objective]
    return "time_total_s" if metric == rs.METRIC_TRIAL_TIME else metric


def make_searcher(spec: SweepSpec, prior: PriorTrials | None = None):
    search = spec.search
    if search.sampler == "grid":
        return None
    # No ConcurrencyLimiter here: TuneConfig(max_concurrent_trials=...) wraps the searcher in one
    # (and warns when it already is one).
    searcher = DistinctProposals(
        optuna_search(search.sampler, search.sampler_seed, search.objective_directions, prior), prior=prior
    )
    if len(search.seeds) == 1:
        return searcher
    # Each sampled configuration runs once per seed; Optuna sees the mean over seeds.
    return Repeater(searcher, repeat=len(search.seeds), set_index=True)


class DistinctProposals(Searcher):
    """Wraps a searcher so that a configuration is not trained twice.

    Optuna's samplers propose points they already proposed: on a 32-point categorical space TPE
    proposed 22-23 distinct configurations in 32 samples (benchmarks/README.md). Training is
    deterministic for a configuration and seed, so a repeat would only reproduce a recorded
    result. The wrapper tells the sampler that result instead (the remedy Optuna's maintainers give
    in optuna/optuna#2021) and asks again; a repeat of a trial still running is told the trial's
    result when it arrives. If `max_tries` proposals in a row are all repeats (a converged sampler
    or an exhausted space), the last one runs, so a sweep still runs `num_samples` trials.

    A configuration an earlier sweep finished (`prior`: --warm-start, --extend) is told its
    recorded value like any repeat. In a finite space, when the tries run out on one, an
    unvisited configuration is enqueued in the Optuna study (enqueue_trial) and asked for, so it
    never runs. With a continuous domain its repeats do not count toward `max_tries` (up to one
    per recorded configuration: the earlier sweep's sampler seed draws each of them again); past
    that the last repeat would run.
    """

    def __init__(self, searcher: Searcher, max_tries: int = 10, prior: PriorTrials | None = None):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.max_tries = max_tries
        self._proposals = 0
        self._trials: dict[str, tuple[str, str]] = {}  # Tune's trial id -> (inner searcher's id, key)
        self._outcome: dict[str, dict | None] = {}  # configuration key -> final result (None: running)
        self._waiting: dict[str, list[str]] = {}  # key of a running trial -> inner ids of its repeats
        # Configurations an earlier sweep finished -> the value the sampler is told of them.
        points, values = (prior.points, prior.values) if prior else ([], [])
        self._recorded = {_config_key(p): v for p, v in zip(points, values, strict=True)}
        self._finite_space = (prior.finite_space or []) if prior else []

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if not self.searcher.set_search_properties(metric, mode, config, **spec):
            return False
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        for key, value in self._recorded.items():  # the metric is known from here on
            self._outcome.setdefault(key, {self.metric: value})
        return True

    def suggest(self, trial_id: str) -> dict | None:
        # Recorded repeats a call skips before they count toward max_tries: a continuous space's
        # sampler with the earlier sweep's seed first draws each recorded point again. A finite
        # space has an unvisited point to enqueue instead.
        repeats, free = 0, 0 if self._finite_space else len(self._recorded)
        while True:
            inner_id = f"{trial_id}/{self._proposals}"
            self._proposals += 1
            config = self.searcher.suggest(inner_id)
            if not isinstance(config, dict):  # None (wait) or Searcher.FINISHED
                return config
            key = _config_key(config)
            if key not in self._outcome:
                break
            recorded = key in self._recorded
            if recorded and free:
                free -= 1
            elif repeats < self.max_tries - 1 or (recorded and self._enqueue_unvisited()):
                repeats += 1
            else:
                break  # the last repeat runs
            if self._outcome[key] is None:
                self._waiting.setdefault(key, []).append(inner_id)
            else:
                self.searcher.on_trial_complete(inner_id, self._outcome[key])
        self._trials[trial_id] = (inner_id, key)
        self._outcome.setdefault(key, None)
        return config

    def _enqueue_unvisited(self) -> bool:
        """Enqueue a configuration of the finite space that was neither recorded nor proposed
        (the first in the space's order); False when there is none (a continuous space)."""
        point = next((p for p in self._finite_space if _config_key(p) not in self._outcome), None)
        if point is None:
            return False
        # OptunaSearch keeps its study private; enqueue_trial is Optuna's way to fix the
        # parameters of the next ask().
        self.searcher._ot_study.enqueue_trial(point)
        return True

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.searcher.on_trial_result(self._trials[trial_id][0], result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        inner_id, key = self._trials[trial_id]
        self.searcher.on_trial_complete(inner_id, result, error=error)
        if error:  # a failed configuration may be proposed and run again
            self._outcome.pop(key, None)
        else:
            self._outcome[key] = self._scores(result)
        for repeat_id in self._waiting.pop(key, []):
            self.searcher.on_trial_complete(repeat_id, result, error=error)

    def _scores(self, result: dict | None) -> dict | None:
        """The part of a result a searcher reads (its metric): what a repeat is told.

        Not Tune's whole result dict (config, timings, host): get_state copies every outcome at
        each experiment snapshot, and with CheckpointConfig(num_to_keep) Tune forces a snapshot
        at every trial checkpoint, so whole results made a sweep's driver time grow with the
        square of its trials (benchmarks/README.md, section 9)."""
        if not result:
            return result
        names = self.metric if isinstance(self.metric, list) else [self.metric]  # objectives
        return {name: result[name] for name in names if name in result}

    # Tune checkpoints a wrapper's state apart from the searcher it wraps (as for Ray's own
    # ConcurrencyLimiter and Repeater): get_state/set_state hold only the wrapper's bookkeeping.
    def get_state(self) -> dict:
        state = self.__dict__.copy()
        del state["searcher"]
        # A copy of each container this wrapper changes, not a deep copy: Tune calls this at every
        # snapshot, and the items are never changed in place (ids are strings, a score is
        # replaced, not updated).
        state["_trials"] = dict(self._trials)
        state["_outcome"] = dict(self._outcome)
        state["_waiting"] = {key: list(ids) for key, ids in self._waiting.items()}
        return state

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)


def _config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


TIME_ATTR = TRAINING_ITERATION  # what ASHA and the median rule count in: Tune's count of reports (epochs)


def make_scheduler(spec: SweepSpec):
    scheduler = spec.search.scheduler
    max_t = spec.training.epochs
    if scheduler.type == "asha":
        return ASHAScheduler(
            time_attr=TIME_ATTR,
            max_t=max_t,
            grace_period=min(scheduler.grace_period, max_t),
            reduction_factor=scheduler.reduction_factor,
        )
    if scheduler.type == "median":
        return MedianStoppingRule(
            time_attr=TIME_ATTR, grace_period=scheduler.grace_period, min_samples_required=3
        )
    return FIFOScheduler()


# -- what orchestrator/replay.py drives as Tune's controller would ----------------------------
SCHEDULER_STOP = TrialScheduler.STOP
SEARCH_FINISHED = Searcher.FINISHED
TRIAL_RUNNING, TRIAL_TERMINATED, TRIAL_ERROR = Trial.RUNNING, Trial.TERMINATED, Trial.ERROR


class GridProposals:
    """Tune's grid as a searcher: the variants BasicVariantGenerator makes of the param space
    (generate_variants), in its order."""

    def __init__(self, space: dict[str, Any]):
        self._variants = generate_variants({"config": space})

    def suggest(self, trial_id: str) -> dict | str:
        variant = next(self._variants, None)
        return SEARCH_FINISHED if variant is None else variant[1]["config"]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass  # a grid does not learn

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass


def proposals(spec: SweepSpec, slots: int, distinct: bool = True) -> GridProposals | Searcher:
    """What proposes a sweep's trials, as Tuner.fit makes it with max_concurrent_trials=slots:
    the grid's variants, or the searcher in a ConcurrencyLimiter (tune.py), its metric, mode and
    space set. distinct=False unwraps the sampler from DistinctProposals (every proposal is
    trained; one-seed sweeps of an Optuna sampler only)."""
    if spec.search.sampler == "grid":
        return GridProposals(param_space(spec))
    searcher = make_searcher(spec)
    if not distinct:
        if not isinstance(searcher, DistinctProposals):  # e.g. Repeater(DistinctProposals) for seeds
            raise ValueError("distinct=False replays one-seed sweeps of an Optuna sampler only")
        searcher = searcher.searcher
    searcher = ConcurrencyLimiter(searcher, max_concurrent=slots)
    searcher.set_search_properties(spec.search.metric, spec.search.mode, param_space(spec))
    return searcher


class TrialListener(Protocol):
    """What the driver-side listeners (MLflow tracking, terminal progress) are told."""

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None: ...
    def trial_result(self, trial_id: str, metrics: dict[str, Any]) -> None: ...
    def trial_completed(self, trial_id: str, last: dict[str, Any], checkpoint_dir: str | None) -> None: ...
    def trial_errored(self, trial_id: str, params: dict[str, Any], error: str) -> None: ...
    def trial_retried(self, trial_id: str, retries: int, cause: str, resumed_from_epoch: int) -> None: ...
    def trial_cut(self, trial_id: str) -> None: ...  # stopped by an interruption, resumable
    def sweep_ended(self) -> None: ...


StopHook = Callable[[Callable[[], None]], None]


class _Events(tune.Callback):
    """Forwards Tune's driver-side events to plain listeners, with flat trial params."""

    def __init__(self, listeners: list[TrialListener], search: dict, on_stop: StopHook | None = None):
        self.listeners = listeners
        self.search = search
        self.on_stop = on_stop

    def __getstate__(self):
        # Tune pickles its run config into the experiment folder; listeners hold threads and
        # clients, and a resumed driver brings its own (see run_tuner).
        return {"listeners": [], "search": self.search, "on_stop": None}

    def setup(self, **info):
        # tune.run has installed its stop handler (on SIGUSR1 always; on SIGINT unless
        # TUNE_DISABLE_SIGINT_HANDLER, which run_tuner sets so that SIGINT stays the driver's).
        # Calling it is Tune's own Ctrl-C: the loop ends, the experiment state is saved as it
        # stands (what Tuner.restore continues), then the trials are stopped.
        tune_stop = signal.getsignal(signal.SIGUSR1)
        if self.on_stop is not None and callable(tune_stop):
            self.on_stop(lambda: tune_stop(signal.SIGUSR1, None))

    def _params(self, trial) -> dict[str, Any]:
        return trial_params(trial.config, self.search)

    def on_trial_start(self, iteration, trials, trial, **info):
        for listener in self.listeners:
            listener.trial_started(trial.trial_id, self._params(trial))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        for listener in self.listeners:
            listener.trial_result(trial.trial_id, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        checkpoint = trial.checkpoint
        path = checkpoint.path if checkpoint is not None else None
        for listener in self.listeners:
            listener.trial_completed(trial.trial_id, dict(trial.last_result or {}), path)

    def on_trial_recover(self, iteration, trials, trial, **info):
        # Tune restarts the trial from its latest checkpoint (or from scratch without one).
        saved = trial.latest_checkpoint_result
        epoch = int(saved.metrics.get(rs.METRIC_EPOCHS_TRAINED, 0)) if saved is not None else 0
        cause = _trial_error_text(trial)
        for listener in self.listeners:
            listener.trial_retried(trial.trial_id, trial.num_failures, cause, epoch)

    def on_trial_error(self, iteration, trials, trial, **info):
        error = _trial_error_text(trial)
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


def run_tuner(
    spec: SweepSpec,
    data: PreparedData,
    experiment_name: str,
    listeners: list[TrialListener],
    resume: bool,
    verbose: int = 0,
    on_stop: StopHook | None = None,
    prior: PriorTrials | None = None,
) -> list[TrialOutcome]:
    """Run (or resume) the sweep; returns every trial's outcome as Tune last knew it (after a
    stop Tune calls unfinished trials TERMINATED: the listeners, not these statuses, tell which
    trials ended). `on_stop` is given a function that stops the running fit() as Ctrl-C would.
    `prior`: an earlier sweep's finished configurations (--warm-start, --extend). Never raises
    for a failed trial."""
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # the driver handles SIGINT (lifecycle.py)
    if not verbose:  # a stop makes Tune log how to restore by hand; the driver says it its way
        logging.getLogger("ray.tune").setLevel(logging.ERROR)
    search_dump = spec.search.model_dump()
    trainable = _trainable(spec, data)
    experiment_path = _experiment_path(spec, experiment_name)
    if resume and tune.Tuner.can_restore(experiment_path):
        tuner = tune.Tuner.restore(
            experiment_path, trainable=trainable, resume_unfinished=True, resume_errored=True
        )
        # The restored run config holds the pickled callbacks of the interrupted driver; swap
        # in this driver's listeners so progress and tracking go to this process.
        tuner._local_tuner._run_config.callbacks = [_Events(listeners, search_dump, on_stop)]
        tuner._local_tuner._run_config.verbose = verbose
    else:
        search = spec.search
        num_samples = 1 if search.sampler == "grid" else search.num_samples * len(search.seeds)
        if prior is not None and prior.num_trials is not None:
            num_samples = prior.num_trials
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(spec, prior),
            tune_config=tune.TuneConfig(
                # With objectives the searcher holds them (optuna_search) and FIFO needs none.
                metric=None if search.objectives else search.metric,
                mode=None if search.objectives else search.mode,
                search_alg=make_searcher(spec, prior),
                scheduler=make_scheduler(spec),
                num_samples=num_samples,
                max_concurrent_trials=search.max_concurrent_trials,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=experiment_name,
                storage_path=spec.storage_path,
                callbacks=[_Events(listeners, search_dump, on_stop)],
                verbose=verbose,
                # One checkpoint: the latest, which also carries the best-on-dev weights.
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                failure_config=tune.FailureConfig(max_failures=search.max_failures),
            ),
        )
    return _outcomes(tuner.fit(), lambda _, config: trial_params(config, search_dump))


def recorded_outcomes(
    spec: SweepSpec, data: PreparedData, experiment_name: str, params: dict[str, dict[str, Any]]
) -> list[TrialOutcome]:
    """The outcomes of an earlier Tune run of the sweep (an extended sweep's earlier trials),
    read from its experiment folder without running anything: those of the trials in `params`
    (trial id -> its hyperparameters as recorded; an earlier spec's configuration and seed
    indices need not be this spec's)."""
    tuner = tune.Tuner.restore(_experiment_path(spec, experiment_name), trainable=_trainable(spec, data))
    outcomes = _outcomes(tuner.get_results(), lambda trial_id, _: params.get(trial_id, {}))
    return [outcome for outcome in outcomes if outcome.trial_id in params]


def _experiment_path(spec: SweepSpec, experiment_name: str) -> str:
    return f"{spec.storage_path.rstrip('/')}/{experiment_name}"  # Path() folds s3:// into s3:/


def _trainable(spec: SweepSpec, data: PreparedData):
    trainable = tune.with_parameters(
        run_trial,
        base=spec.base_config().model_dump(exclude_unset=True),
        search=spec.search.model_dump(),
        data=data,  # put in the object store once; every trial reads the same copy
    )
    resources = {"cpu": spec.search.resources.cpu, "gpu": spec.search.resources.gpu}
    return tune.with_resources(trainable, resources)


def _outcomes(grid, params_of: Callable[[str, dict], dict[str, Any]]) -> list[TrialOutcome]:
    """TrialOutcomes of a ResultGrid; `params_of(trial id, Tune's config)`: its hyperparameters."""
    outcomes = []
    for result in grid:
        error = None
        if result.error is not None:
            error = str(result.error)
        trial_id = result.metrics.get(TRIAL_ID) if result.metrics else None
        trial_id = trial_id or Path(result.path).name
        outcomes.append(
            TrialOutcome(
                trial_id=trial_id,
                params=params_of(trial_id, result.config or {}),
                metrics=dict(result.metrics or {}),
                checkpoint=result.checkpoint,
                error=error,
            )
        )
    return outcomes

