"""Stacked trials on the driver's side (search.stack; the trainable is stack_trial.py): the grid's
configurations, or a sampler's proposals, grouped into stacks, a stack's Tune events turned into its
members' (every member is a trial of its own to the listeners: its journal records, MLflow run,
outcome, and to the sampler), and Tune's scheduler run per member.

Grouping: grid points whose flat hyperparameters agree on everything but lr, l2,
adagrad_accumulator, dropout and seed (SweepSpec.stacked_fields) share stacks, taken in the grid's
order up to the stack size; the seed only where SweepSpec.stacks_seeds (search.stack N, or auto
on GPUs). An Optuna sampler's proposals fill stacks as it draws them (StackProposals). Every
member trains on its solo run's batches (one order per seed: StackedTrainer), from its solo run's
initialisation, so with dropout off its epochs are its solo trial's (tests/test_stacked_sweeps.py).

Schedulers: ASHA and the median rule decide per member. The driver holds one Tune scheduler
(ray_search.make_scheduler) that sees each member as a trial; a member it stops is named to the
trial through stack_trial.MemberStops and ends at once (its run FINISHED, early_stopped), while
the stack trains on. Tune's own scheduler for stacked trials is FIFO: a stack ends when every
member ended. A resumed sweep's scheduler is told the journal's member epochs first, in the
order they were recorded (MemberHistory), so its rungs are where the interrupted driver left them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import tune
from ray.tune.result import TRAINING_ITERATION
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

from orchestrator.ray_adapter.ray_search import make_scheduler
from orchestrator.ray_adapter.ray_trial import trial_params
from orchestrator.ray_adapter.stack_trial import (
    MEMBER_ENDED,
    MEMBERS_KEY,
    STACK_KEY,
    MemberStops,
    member_checkpoint,
    member_id,
    parse_member_id,
    stack_members,
)
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.stack_groups import group_into_stacks, stack_key
from results import run_schema as rs


def group_stacks(configs: list[dict[str, Any]], search: dict[str, Any], size: int,
                 fields: tuple[str, ...]) -> list[list[dict[str, Any]]]:
    """Tune configs (a grid's points) as stacks of at most `size` (see the module docstring).

    Args:
        configs: the grid's points as Tune configs, in Tune's order.
        search: the sweep's search block (ray_trial.trial_params reads it).
        size: the most members of a stack.
        fields: the flat hyperparameters members may differ in (SweepSpec.stacked_fields).
    """
    return group_into_stacks(configs, lambda config: trial_params(config, search), size, fields)


def stack_space(configs: list[dict[str, Any]], search: dict[str, Any], size: int,
                fields: tuple[str, ...]) -> dict[str, Any]:
    """Tune's param space of a stacked sweep: a grid over its stacks.

    Args:
        configs, search, size, fields: as ``group_stacks`` takes them.
    """
    return {STACK_KEY: tune.grid_search(group_stacks(configs, search, size, fields))}


def is_stack(config: dict[str, Any]) -> bool:
    return STACK_KEY in config


# A stacked sampler sweep's param space as Tune holds it: Tune merges each suggestion into the
# space it was given, so it gets one key the suggestion replaces (the sampler's domains go to
# StackProposals, which passes them on); and a space that is not empty, or Tune would not set the
# searcher's metric and mode.
SAMPLED_STACK_SPACE = {STACK_KEY: None}


class StackProposals(Searcher):
    """A sampler's proposals as stacks (search.stack with an Optuna sampler): each trial Tune asks
    for is a stack of up to `size` proposals of the searcher it wraps (DistinctProposals, in a
    Repeater for seeds, behind FirstPoints on a resume from the journal), drawn together. Each
    member is a trial of its own to that searcher: told each of its new epochs, and its end as
    soon as it ends (a scheduler's stop, a divergence), not when its stack does. So the sampler
    draws a stack's members before it is told any of their results: with TPE a stack of k
    proposals is k draws from the model of the trials told so far, as Tune's fractional trials
    started together would be.

    A proposal that cannot share the stack being filled (stack_key: another seed where seeds train
    apart; SweepSpec.stacking refuses samplers that search anything else a member cannot differ
    in) is held for the next stack, so held proposals stay fewer than a stack per seed.
    FINISHED once `total` proposals were drawn and every one is in a stack.

    Args:
        searcher: the sampler's searcher (ray_search.make_searcher).
        space: the sweep's param space (ray_search.param_space), passed on to the searcher.
        size: the most members of a stack.
        search: the sweep's search block (ray_trial.trial_params reads it).
        fields: the flat hyperparameters members may differ in (SweepSpec.stacked_fields).
        total: the proposals the sweep runs (its trials).
    """

    def __init__(self, searcher: Searcher, space: dict[str, Any], size: int, search: dict[str, Any],
                 fields: tuple[str, ...], total: int):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.space, self.size, self.search, self.fields, self.total = space, size, search, fields, total
        self._drawn = 0
        self._held: list[tuple[str, dict[str, Any]]] = []  # (the searcher's trial id, proposal)
        self._members: dict[str, list[str]] = {}  # stacked trial id -> its members' ids to the searcher
        self._epochs: dict[str, int] = {}  # a member still training -> the last epoch it was told

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if not self.searcher.set_search_properties(metric, mode, self.space, **spec):
            return False
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        return True

    def suggest(self, trial_id: str) -> dict | str | None:
        stack: list[tuple[str, dict[str, Any]]] = []
        for proposal in list(self._held):  # held proposals first, in the order they were drawn
            if len(stack) < self.size and self._fits(stack, proposal[1]):
                stack.append(proposal)
                self._held.remove(proposal)
        while len(stack) < self.size and self._drawn < self.total:
            inner_id = f"{trial_id}-p{self._drawn}"
            config = self.searcher.suggest(inner_id)
            if not isinstance(config, dict):  # None (wait) or FINISHED
                if config == Searcher.FINISHED:
                    self.total = self._drawn
                break
            self._drawn += 1
            (stack if self._fits(stack, config) else self._held).append((inner_id, config))
        if not stack:
            return Searcher.FINISHED if self._drawn >= self.total else None
        self._members[trial_id] = [inner_id for inner_id, _ in stack]
        self._epochs.update((inner_id, 0) for inner_id, _ in stack)
        return {STACK_KEY: [config for _, config in stack]}

    def _fits(self, stack: list[tuple[str, dict[str, Any]]], config: dict[str, Any]) -> bool:
        return not stack or (stack_key(trial_params(config, self.search), self.fields)
                             == stack_key(trial_params(stack[0][1], self.search), self.fields))

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        for inner_id, report in zip(self._members[trial_id], _member_reports(result), strict=True):
            if inner_id not in self._epochs:
                continue  # ended
            if report[MEMBER_ENDED]:
                self._end(inner_id, report, error=False)
            elif report[TRAINING_ITERATION] > self._epochs[inner_id]:  # a stopped member repeats its last
                self._epochs[inner_id] = report[TRAINING_ITERATION]
                self.searcher.on_trial_result(inner_id, report)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        members = self._members.pop(trial_id)
        reports = _member_reports(result) if result and MEMBERS_KEY in result else [None] * len(members)
        for inner_id, report in zip(members, reports, strict=True):
            if inner_id in self._epochs:
                self._end(inner_id, report, error=error or report is None)

    def _end(self, inner_id: str, report: dict | None, error: bool) -> None:
        del self._epochs[inner_id]
        self.searcher.on_trial_complete(inner_id, report, error=error)

    # As DistinctProposals: Tune checkpoints the wrapped searcher apart.
    def get_state(self) -> dict:
        state = self.__dict__.copy()
        del state["searcher"]
        state["_held"], state["_epochs"] = list(self._held), dict(self._epochs)
        state["_members"] = {trial_id: list(ids) for trial_id, ids in self._members.items()}
        return state

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)


def _member_reports(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each member's report in a stacked trial's Tune result, with the stack's time_total_s (Tune's
    own, which a solo trial's result carries: search.objectives may read it)."""
    return [{**report, "time_total_s": result.get("time_total_s", 0.0)} for report in json.loads(result[MEMBERS_KEY])]


@dataclass(frozen=True)
class _Member:
    """A member as Tune's schedulers see a trial (they key their records by it, or its id)."""

    trial_id: str


class _NoController:
    """The controller a scheduler may ask for live trials (the median rule, before it has
    enough samples): none wait for a member's slot."""

    def get_live_trials(self) -> list:
        return []


@dataclass
class MemberHistory:
    """What the journal holds of a resumed sweep's members: the ids of those that ended
    (FINISHED or FAILED), and every member epoch's metrics in the order they were recorded.

    Args:
        ended: member trial ids that ended.
        epochs: (member trial id, epoch, metrics) in the journal's order.
    """

    ended: set[str] = field(default_factory=set)
    epochs: list[tuple[str, int, dict[str, float]]] = field(default_factory=list)


class MemberScheduler:
    """Tune's scheduler of the sweep (ray_search.make_scheduler), deciding for members."""

    def __init__(self, spec: SweepSpec, history: MemberHistory):
        self.scheduler = make_scheduler(spec)
        self.scheduler.set_search_properties(spec.search.metric, spec.search.mode)
        self._added: set[str] = set()
        # The members the told epochs stop: a stop the journal does not hold as an end (a signal
        # that landed as the interrupted driver stopped the member recorded it as cut) is still
        # the stop an uninterrupted sweep made, and the member trains no further.
        self.stopped = {trial_id for trial_id, epoch, metrics in history.epochs
                        if self.stops(trial_id, {**metrics, TRAINING_ITERATION: epoch})}

    def stops(self, trial_id: str, result: dict[str, Any]) -> bool:
        """Whether the scheduler stops the member after this epoch's result."""
        member = _Member(trial_id)
        if trial_id not in self._added:
            self._added.add(trial_id)
            self.scheduler.on_trial_add(_NoController(), member)
        return self.scheduler.on_trial_result(_NoController(), member, result) == TrialScheduler.STOP

    def ended(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self._added:
            self.scheduler.on_trial_complete(_NoController(), _Member(trial_id), result)


Listeners = Callable[[], list]


class StackEvents:
    """A stack's Tune events as its members' events to the listeners (tuner.TrialListener).

    A member starts with its stack (unless it ended before a resume); each new epoch of it is a
    result; it completes when it ends (its stack reports MEMBER_ENDED, or the scheduler stops it),
    without a checkpoint, which follows once the stack completes (trial_checkpoint: the stack's
    last checkpoint holds every member's). A member still training when the stack completes
    completes with it; the ledger tells a finished one from one cut by a stop."""

    def __init__(self, spec: SweepSpec, listeners: Listeners, stops_name: str, history: MemberHistory):
        self.search = spec.search.model_dump()
        self.listeners = listeners
        self.scheduler = MemberScheduler(spec, history)
        self.ended = set(history.ended)
        self.last: dict[str, dict[str, Any]] = {}  # member id -> its latest result
        self.epochs = {trial_id: epoch for trial_id, epoch, _ in history.epochs}
        # A member the scheduler stopped but the journal holds as cut stops at the same epoch, and
        # ends, early stopped, with the report of that epoch (stack_trial).
        self.stops = open_member_stops(stops_name, {member: self.epochs.get(member, 0)
                                                    for member in self.ended | self.scheduler.stopped})

    def _members(self, trial) -> list[tuple[int, str, dict[str, Any]]]:
        params = stack_members(trial.config, self.search)
        return [(i, member_id(trial.trial_id, i), p) for i, p in enumerate(params)]

    def _tell(self, method: str, *args) -> None:
        for listener in self.listeners():
            getattr(listener, method)(*args)

    def started(self, trial) -> None:
        for _, member, params in self._members(trial):
            if member not in self.ended:
                self._tell("trial_started", member, params)

    def result(self, trial, result: dict[str, Any]) -> None:
        for (index, member, _), report in zip(self._members(trial), _member_reports(result), strict=True):
            if member in self.ended:
                continue
            # An epoch the driver heard before (a stack restored from an older checkpoint, or a
            # member that did not train) was told to the scheduler then (or in MemberHistory's replay).
            new = int(report[rs.METRIC_EPOCHS_TRAINED]) > self.epochs.get(member, 0)
            if new:
                self.epochs[member] = int(report[rs.METRIC_EPOCHS_TRAINED])
                self.last[member] = report
                self._tell("trial_result", member, report)
            if report[MEMBER_ENDED]:
                self._end(member, report)
            elif new and self.scheduler.stops(member, report):
                ray.get(self.stops.stop.remote(trial.trial_id, index, self.epochs[member]))
                self._end(member, report)

    def _end(self, member: str, report: dict[str, Any]) -> None:
        self.ended.add(member)
        self.scheduler.ended(member, report)
        self._tell("trial_completed", member, report, None)

    def completed(self, trial) -> None:
        path = trial.checkpoint.path if trial.checkpoint is not None else None
        finished = bool((trial.last_result or {}).get(rs.RESULT_TRIAL_FINISHED))
        for index, member, _ in self._members(trial):
            folder = member_checkpoint(path, index) if path else None
            if member not in self.ended:
                self._tell("trial_completed", member, self.last.get(member, {}), folder)
            elif finished and folder:
                self._tell("trial_checkpoint", member, folder)

    def errored(self, trial, error: str) -> None:
        for _, member, params in self._members(trial):
            if member not in self.ended:
                self._tell("trial_errored", member, params, error)

    def retried(self, trial, retries: int, cause: str, resumed_from_epoch: int) -> None:
        for _, member, _ in self._members(trial):
            if member not in self.ended:
                self._tell("trial_retried", member, retries, cause, resumed_from_epoch)


def open_member_stops(name: str, ended: dict[str, int]) -> Any:
    """The driver's MemberStops actor, holding a resumed sweep's members that train no more.

    Args:
        name: the actor's name (the stacked trials look it up).
        ended: trial id -> the last epoch of each member that ended or was stopped (other trials'
            ids are ignored).
    """
    stopped: dict[str, dict[int, int]] = {}
    for member_trial, epoch in ended.items():
        parsed = parse_member_id(member_trial)
        if parsed is not None:
            stopped.setdefault(parsed[0], {})[parsed[1]] = epoch
    return MemberStops.options(name=name).remote(stopped)


def member_configs(trial_id: str, config: dict[str, Any], metrics: dict[str, Any],
                   checkpoint_path: str | None) -> list[tuple[str, dict[str, Any], dict[str, Any], str | None]]:
    """A stacked trial's members as Tune knew them last: (member id, the member's Tune config, its
    last result, its checkpoint folder) each.

    Args:
        trial_id: the stacked trial's id.
        config: its Tune config.
        metrics: its last Tune result.
        checkpoint_path: its last checkpoint's folder (None: it has none).
    """
    reports = json.loads(metrics[MEMBERS_KEY]) if MEMBERS_KEY in metrics else None
    return [(member_id(trial_id, index), member, reports[index] if reports else {},
             member_checkpoint(checkpoint_path, index) if checkpoint_path else None)
            for index, member in enumerate(config[STACK_KEY])]
