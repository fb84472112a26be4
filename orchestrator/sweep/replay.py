"""A completed sweep replayed as a tabular benchmark: the sweep's own search code, fed the record.

Training is deterministic for a configuration and seed, so a finished sweep already holds the
dev curve any search would see for the configurations it trained. The replay builds the
searcher and scheduler a real sweep builds (``ray_search.make_searcher`` / ``make_scheduler``
from the spec with the strategy's sampler, seed and scheduler; a grid is Tune's own variant
generator over ``param_space``) and drives them with Tune's calls in Tune's order
(``TuneController._process_trial_result`` and ``stop_trial``): ``on_trial_add``; per epoch the
scheduler's ``on_trial_result``, then, unless it said STOP, the searcher's; at the trial's end
the scheduler's and the searcher's ``on_trial_complete`` with the last result. A simulated clock
advances by each epoch's recorded seconds over a fixed number of slots, and a freed slot is
refilled at once, so no trial is ever pending (the median rule, which pauses a trial only while
others wait, never pauses here).

A proposal the record lacks (a point the sweep never trained, or whose run did not finish) is
not invented: it counts as missing and is reported to the searcher and scheduler as a failed
trial, as Tune reports a trial that errors. A trial that would run past the end of a curve a
scheduler had cut in the recorded sweep ends there, and is counted.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from nli_models.errors import InputError
from orchestrator.ray_adapter.ray_search import (
    SCHEDULER_STOP,
    SEARCH_FINISHED,
    TIME_ATTR,
    TRIAL_ERROR,
    TRIAL_RUNNING,
    TRIAL_TERMINATED,
    make_scheduler,
    proposals,
)
from orchestrator.ray_adapter.ray_trial import trial_params
from orchestrator.sweep.spec import Domain, SweepSpec
from results import run_schema as rs
from results.replay_record import RecordedTrial
from results.replay_report import ReplayedTrial, ReplayRun
from results.selection import FINISHED, TrialRecord


@dataclass(frozen=True)
class Strategy:
    sampler: str
    scheduler: str

    @property
    def label(self) -> str:
        return f"{self.sampler}+{self.scheduler}"


@dataclass(frozen=True)
class Budget:
    """When a replay stops: after `trials` trials are proposed and have ended, or once the
    trial-epochs or simulated seconds run out (trials still running then are cut, as a sweep's
    time_budget_s cuts them: only trials that ended count for the selection)."""

    trials: int
    epochs: int | None = None
    seconds: float | None = None


def params_key(params: Mapping[str, Any], names: list[str]) -> str:
    """A configuration and seed as text: the searched names' values, types kept (1 is not 1.0)."""
    return json.dumps([[name, params.get(name)] for name in sorted(names)], default=str)


CONTINUOUS = ("uniform", "loguniform")  # Domain kinds with no finite set of points


def check_replayable(spec: SweepSpec, where: str) -> None:
    """A replay looks each proposal up among the configurations the sweep trained. A continuous
    range has no finite set of points: every sampler draws values no recorded trial trained
    (only the recorded sampler and seed would repeat the record), so every strategy would replay
    nothing but missing trials. Refused, saying so."""
    ranges = {n: d for n, d in spec.search.space.items() if d.kind in CONTINUOUS}
    if ranges:
        raise InputError(
            f"{where}: its search space cannot be replayed: "
            + ", ".join(f"{n} is a continuous range ({d.kind} {list(d.values)})" for n, d in ranges.items())
            + " with no finite set of points to look up in the record; a sampler would draw "
            "values no recorded trial trained. Replay a sweep whose space is grid, choice or "
            "randint values"
        )


def strategy_spec(spec: SweepSpec, strategy: Strategy, seed: int) -> SweepSpec:
    """The recorded spec with the strategy's sampler, sampler seed and scheduler. An Optuna
    sampler over a grid's space samples each grid's values as a categorical (`choice`), the
    domain a real sweep with that sampler would give them; `grid` needs a grid space."""
    search = spec.search
    kinds = {name: domain.kind for name, domain in search.space.items()}
    if strategy.sampler == "grid" and any(kind != "grid" for kind in kinds.values()):
        raise InputError(
            "--sampler grid: the recorded sweep's space is not a grid ("
            + ", ".join(f"{name}: {kind}" for name, kind in kinds.items() if kind != "grid")
            + "); allowed: random, tpe, cmaes"
        )
    space = search.space
    if strategy.sampler != "grid":
        space = {
            name: Domain(choice=domain.values) if domain.kind == "grid" else domain
            for name, domain in space.items()
        }
    scheduler = search.scheduler.model_copy(update={"type": strategy.scheduler})
    return spec.model_copy(update={"search": search.model_copy(update={
        "sampler": strategy.sampler, "sampler_seed": seed, "space": space, "scheduler": scheduler,
    })})


@dataclass(eq=False)
class _Trial:
    """What Tune's schedulers read of a trial: its id and status (the object is a dict key)."""

    trial_id: str
    recorded: RecordedTrial | None
    status: str = TRIAL_RUNNING
    epochs: int = 0


@dataclass
class _Controller:
    """The TuneController calls the schedulers make (get_trials, get_live_trials)."""

    trials: list[_Trial] = field(default_factory=list)

    def get_trials(self) -> list[_Trial]:
        return self.trials

    def get_live_trials(self) -> list[_Trial]:
        return [t for t in self.trials if t.status not in (TRIAL_TERMINATED, TRIAL_ERROR)]


def replay(
    spec: SweepSpec,
    trials: Mapping[str, RecordedTrial],
    strategy: Strategy,
    seed: int,
    budget: Budget,
    slots: int,
    distinct: bool = True,
) -> ReplayRun:
    """One replay of `strategy` with sampler seed `seed` over the recorded `trials` (keyed by
    params_key of their searched params and seed). distinct=False: an Optuna sampler's repeated
    proposals are trained again (ray_search.proposals)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # not a warning per proposal (CMA-ES)
    run_spec = strategy_spec(spec, strategy, seed)
    search = run_spec.search
    dump = search.model_dump()
    names = searched_names(run_spec)
    proposer = proposals(run_spec, slots, distinct)
    scheduler = make_scheduler(run_spec)
    scheduler.set_search_properties(search.metric, search.mode)
    np.random.seed(seed)  # ASHA draws each trial's bracket from numpy's global generator
    controller = _Controller()
    run = ReplayRun(strategy=strategy.label, repeat=seed)
    running: list[tuple[float, int, _Trial]] = []
    order, ids = itertools.count(), itertools.count()
    proposed = 0
    exhausted = False
    spent_epochs = 0

    def fill(now: float) -> None:
        nonlocal proposed, exhausted
        while not exhausted and proposed < budget.trials and len(running) < slots:
            trial_id = f"replay_{next(ids):05d}"
            config = proposer.suggest(trial_id)
            if config is None or config == SEARCH_FINISHED:
                exhausted = config == SEARCH_FINISHED or not running
                return
            proposed += 1
            key = params_key(trial_params(config, dump), names)
            trial = _Trial(trial_id, trials.get(key))
            controller.trials.append(trial)
            scheduler.on_trial_add(controller, trial)
            if trial.recorded is None:
                run.missing.append(key)
                trial.status = TRIAL_ERROR
                scheduler.on_trial_error(controller, trial)
                proposer.on_trial_complete(trial_id, error=True)
                continue
            heapq.heappush(running, (now + trial.recorded.epoch_time_s[0], next(order), trial))

    fill(0.0)
    while running:
        now, _, trial = heapq.heappop(running)
        if (budget.seconds is not None and now > budget.seconds) or (
            budget.epochs is not None and spent_epochs >= budget.epochs
        ):
            break  # the budget ran out: trials still running are cut
        recorded = trial.recorded
        trial.epochs += 1
        spent_epochs += 1
        epoch = trial.epochs
        result = {
            TIME_ATTR: epoch,
            search.metric: recorded.curves[search.metric][epoch - 1],
            rs.METRIC_DEV_ACCURACY: recorded.dev_accuracy[epoch - 1],
        }
        run.epochs.append((now, recorded.dev_accuracy[epoch - 1]))
        decision = scheduler.on_trial_result(controller, trial, result)
        if decision != SCHEDULER_STOP:
            proposer.on_trial_result(trial.trial_id, result)
        if decision == SCHEDULER_STOP or epoch == len(recorded.dev_accuracy):
            scheduler.on_trial_complete(controller, trial, result)
            proposer.on_trial_complete(trial.trial_id, result)
            trial.status = TRIAL_TERMINATED
            run.trials.append(_replayed(trial, stopped=decision == SCHEDULER_STOP))
            fill(now)
        else:
            heapq.heappush(running, (now + recorded.epoch_time_s[epoch], next(order), trial))
    run.cut = sum(t.status == TRIAL_RUNNING for t in controller.trials)
    return run


def _replayed(trial: _Trial, stopped: bool) -> ReplayedTrial:
    recorded = trial.recorded
    dev = recorded.dev_accuracy[: trial.epochs]
    return ReplayedTrial(
        record=TrialRecord(
            run_id=recorded.run_id,
            config_key=recorded.config_key,
            model_config=recorded.model_config,
            params=recorded.params,
            best_dev_accuracy=max(dev),
            seed=recorded.params.get("seed"),
            status=FINISHED,
            theta_m=recorded.theta_m,
            epochs_trained=trial.epochs,
        ),
        stopped_early=stopped and trial.epochs < len(recorded.dev_accuracy),
        past_record=not stopped and recorded.cut_by_scheduler,
    )


def searched_names(spec: SweepSpec) -> list[str]:
    """The params a proposal sets, in the spec's order: the space's, the configurations', the
    seed."""
    names = [*spec.search.space]
    for configuration in spec.search.configurations:
        names += [name for name in configuration if name not in names]
    return [*names, "seed"]


def recorded_trials(spec: SweepSpec, recorded: list[RecordedTrial]) -> dict[str, RecordedTrial]:
    """The record keyed as replay looks it up; a (configuration, seed) recorded twice (a sampler's
    repeat) keeps the run that trained the most epochs, as the selection rule does."""
    names = searched_names(spec)
    keyed: dict[str, RecordedTrial] = {}
    for trial in sorted(recorded, key=lambda t: (-len(t.dev_accuracy), t.run_id)):
        keyed.setdefault(params_key(trial.params, names), trial)
    return keyed
