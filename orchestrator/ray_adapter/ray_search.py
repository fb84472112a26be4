"""The Ray Tune adapter's search (with ray_runtime.py and tuner.py, the driver, and ray_trial.py, the trainable):
the param space, the Optuna samplers (optuna_study.py), the distinct-proposal guard, the
points a resume from the journal runs before its sampler draws, the schedulers, and what
orchestrator/sweep/replay.py drives as Tune's controller would.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ray import tune
from ray.tune.experiment import Trial
from ray.tune.result import TRAINING_ITERATION
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler
from ray.tune.search import ConcurrencyLimiter, Repeater, Searcher
from ray.tune.search.variant_generator import generate_variants

from orchestrator.ray_adapter.optuna_study import objective_result_key, optuna_search
from orchestrator.ray_adapter.ray_trial import CONFIGURATION_KEY, POINT_KEY
from orchestrator.sweep.spec import SweepSpec
from results import run_schema as rs


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
    """Configurations an earlier sweep finished (orchestrator/sweep/warm_start.py), as Tune configs.

    `points` and `values`: each configuration (searched names, CONFIGURATION_KEY) and what its
    sampler was told of it (told_result: search.metric, or every objective of search.objectives);
    an Optuna sampler gets them as evaluated trials (tell_evaluated), never as trials of this
    sweep. `grid`: a grid --extend's points still to run (seed included). `num_trials`:
    a sampler --extend's trials to run now. `finite_space`: every configuration of a space with
    no continuous domain (None with one), from which an unvisited one is enqueued when the
    sampler keeps proposing finished ones. `first`: trials (seed included) that run before the
    sampler draws, outside it: a resume from the sweep's journal (orchestrator/journal/resume.py)
    runs the configurations of its unfinished trials again; a configuration of them not in
    `points` is told to the sampler once all its seeds ended (FirstPoints)."""

    points: list[dict[str, Any]]
    values: list[dict[str, float]]
    grid: list[dict[str, Any]] | None = None
    num_trials: int | None = None
    finite_space: list[dict[str, Any]] | None = None
    first: list[dict[str, Any]] | None = None


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


def told_result(spec: SweepSpec, metrics: Mapping[str, float]) -> dict[str, float] | None:
    """What Tune told the sampler of a finished trial whose recorded metrics (each one's latest
    value, as MLflow holds them; a journal's last epoch and final values) are `metrics`: its
    search.metric, or each objective of search.objectives under its Tune result key (the value
    the recorder stores under rs.OBJECTIVE_METRICS, which the Pareto front reads). None when one
    is missing: such a trial is not told."""
    directions = spec.search.objective_directions
    recorded = ({objective_result_key(name): rs.OBJECTIVE_METRICS[name] for name, _ in directions}
                if directions else {spec.search.metric: spec.search.metric})
    if any(metrics.get(metric) is None for metric in recorded.values()):
        return None
    return {key: float(metrics[metric]) for key, metric in recorded.items()}


def make_searcher(spec: SweepSpec, prior: PriorTrials | None = None):
    search = spec.search
    if search.sampler == "grid":
        return None
    # No ConcurrencyLimiter here: TuneConfig(max_concurrent_trials=...) wraps the searcher in one
    # (and warns when it already is one).
    distinct = DistinctProposals(
        optuna_search(search.sampler, search.sampler_seed, search.objective_directions), prior=prior
    )
    # Each sampled configuration runs once per seed; Optuna sees the mean over seeds.
    searcher = distinct if len(search.seeds) == 1 else Repeater(distinct, repeat=len(search.seeds), set_index=True)
    if prior is not None and prior.first:
        return FirstPoints(searcher, prior.first, told=distinct.told)
    return searcher


class DistinctProposals(Searcher):
    """Wraps a searcher so that a configuration is not trained twice.

    Optuna's samplers propose points they already proposed: on a 32-point categorical space TPE
    proposed 22-23 distinct configurations in 32 samples (benchmarks/README.md's git history). Training is
    deterministic for a configuration and seed, so a repeat would only reproduce a recorded
    result. The wrapper tells the sampler that result instead (the remedy Optuna's maintainers give
    in optuna/optuna#2021) and asks again; a repeat of a trial still running is told the trial's
    result when it arrives. If `max_tries` proposals in a row are all repeats (a converged sampler
    or an exhausted space), the last one runs, so a sweep still runs `num_samples` trials.

    A configuration an earlier sweep finished (`prior`: --warm-start, --extend, a resume from the
    journal) is told to the study (tell_evaluated) once Tune gives it the space, and its recorded
    result like any repeat; one of `prior.first` (run again outside
    the sampler: FirstPoints) counts as a trial still running until `told` its result. In a finite space, when the tries run out on one, an
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
        # Configurations an earlier sweep finished -> the result the sampler is told of them.
        points, values = (prior.points, prior.values) if prior else ([], [])
        self._prior = list(zip(points, values, strict=True))
        self._recorded = {_config_key(p): dict(v) for p, v in self._prior}
        self._finite_space = (prior.finite_space or []) if prior else []
        for point in (prior.first or []) if prior else []:
            key = _config_key(without_seed(point))
            if key not in self._recorded:
                self._outcome[key] = None  # run again first: a repeat waits for its result
        self._before = set(self._outcome) | set(self._recorded)  # what an earlier run of it has

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if not self.searcher.set_search_properties(metric, mode, config, **spec):
            return False
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        for point, result in self._prior:  # the study exists from here on
            self.searcher.tell_evaluated(point, result)
        for key, result in self._recorded.items():
            self._outcome.setdefault(key, result)
        return True

    def suggest(self, trial_id: str) -> dict | None:
        # Recorded repeats a call skips before they count toward max_tries: a continuous space's
        # sampler with the earlier sweep's seed first draws each recorded point again. A finite
        # space has an unvisited point to enqueue instead.
        repeats, free = 0, 0 if self._finite_space else len(self._before)
        while True:
            inner_id = f"{trial_id}/{self._proposals}"
            self._proposals += 1
            config = self.searcher.suggest(inner_id)
            if not isinstance(config, dict):  # None (wait) or Searcher.FINISHED
                return config
            key = _config_key(config)
            if key not in self._outcome:
                break
            recorded = key in self._before
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
        self.searcher.enqueue(point)
        return True

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.searcher.on_trial_result(self._trials[trial_id][0], result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        inner_id, key = self._trials[trial_id]
        result = _searched_result(result)
        self.searcher.on_trial_complete(inner_id, result, error=error)
        self._ended(key, result, error)

    def _ended(self, key: str, result: dict | None, error: bool) -> None:
        if error:  # a failed configuration may be proposed and run again
            self._outcome.pop(key, None)
        else:
            self._outcome[key] = self._scores(result)
        for repeat_id in self._waiting.pop(key, []):
            self.searcher.on_trial_complete(repeat_id, result, error=error)

    def told(self, config: dict, results: list[dict | None]) -> None:
        """A configuration of `prior.first` ended outside the sampler, `results` one per seed
        (None: failed): the sampler is told the mean over its seeds of each metric it optimises
        (as Tune's Repeater tells it) as an evaluated trial (tell_evaluated), and so are its
        repeats. One of `prior.points` (some of its seeds finished before) was told already."""
        key = _config_key(config)
        if key in self._recorded:
            return
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]  # objectives
        ended = [_searched_result(r) for r in results if r and all(m in r for m in metrics)]
        if not ended:
            self._ended(key, None, error=True)
            return
        result = {metric: statistics.fmean(r[metric] for r in ended) for metric in metrics}
        self.searcher.tell_evaluated(config, result)
        self._ended(key, result, error=False)

    def _scores(self, result: dict | None) -> dict | None:
        """The part of a result a searcher reads (its metric): what a repeat is told.

        Not Tune's whole result dict (config, timings, host): get_state copies every outcome at
        each experiment snapshot, and with CheckpointConfig(num_to_keep) Tune forces a snapshot
        at every trial checkpoint, so whole results made a sweep's driver time grow with the
        square of its trials (benchmarks/README.md, "scale_cluster")."""
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


def _searched_result(result: dict | None) -> dict | None:
    """What the search is told of a trial's last result: a diverged trial counts as dev accuracy
    0 (ray_trial.diverged_result reports dev_accuracy 0; its best_dev_accuracy stays the
    pre-divergence best for the record), also where an objective reads best_dev_accuracy
    (search.objectives)."""
    if result and rs.RESULT_DIVERGED_LOSS in result:
        return {**result, rs.METRIC_BEST_DEV_ACCURACY: 0.0}
    return result


def _config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def without_seed(point: dict[str, Any]) -> dict[str, Any]:
    """A trial's configuration: its Tune config less its seed."""
    return {name: value for name, value in point.items() if name != rs.PARAM_SEED}


class FirstPoints(Searcher):
    """Runs `points` (Tune configs, seed included) before the searcher it wraps proposes: a
    resume from the sweep's journal runs its unfinished trials' configurations again first
    (PriorTrials.first). They are not the searcher's trials; `told(configuration, results)` is
    called once every seed of a configuration among them has ended (DistinctProposals.told)."""

    def __init__(self, searcher: Searcher, points: list[dict[str, Any]],
                 told: Callable[[dict, list[dict | None]], None]):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.told = told
        self._points = [dict(point) for point in points]
        self._running: dict[str, dict[str, Any]] = {}  # Tune's trial id -> its point
        self._ended: dict[str, list[dict | None]] = {}  # configuration key -> its seeds' results
        self._seeds: dict[str, int] = {}  # configuration key -> its points
        for point in points:
            key = _config_key(without_seed(point))
            self._seeds[key] = self._seeds.get(key, 0) + 1

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if not self.searcher.set_search_properties(metric, mode, config, **spec):
            return False
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        return True

    def suggest(self, trial_id: str) -> dict | None:
        if not self._points:
            return self.searcher.suggest(trial_id)
        self._running[trial_id] = self._points.pop(0)
        return dict(self._running[trial_id])

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self._running:
            self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        point = self._running.pop(trial_id, None)
        if point is None:
            self.searcher.on_trial_complete(trial_id, result, error=error)
            return
        configuration = without_seed(point)
        key = _config_key(configuration)
        self._ended.setdefault(key, []).append(None if error else result)
        if len(self._ended[key]) == self._seeds[key]:
            self.told(configuration, self._ended.pop(key))

    # As DistinctProposals: Tune checkpoints the wrapped searcher apart.
    def get_state(self) -> dict:
        state = self.__dict__.copy()
        del state["searcher"], state["told"]
        state["_points"], state["_running"] = list(self._points), dict(self._running)
        state["_ended"] = {key: list(results) for key, results in self._ended.items()}
        return state

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)


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


# -- what orchestrator/sweep/replay.py drives as Tune's controller would ----------------------------
SCHEDULER_STOP = TrialScheduler.STOP
SEARCH_FINISHED = Searcher.FINISHED
TRIAL_RUNNING, TRIAL_TERMINATED, TRIAL_ERROR = Trial.RUNNING, Trial.TERMINATED, Trial.ERROR


def grid_points(space: dict[str, Any]) -> list[dict[str, Any]]:
    """Every configuration of a grid, in the order Tune's BasicVariantGenerator runs them.

    Args:
        space: the param space (param_space), grid_search values included.
    """
    return [variant["config"] for _, variant in generate_variants({"config": space})]


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
