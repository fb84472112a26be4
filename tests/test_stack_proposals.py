"""StackProposals (orchestrator/ray_adapter/stacks.py): an Optuna sampler's proposals drawn a stack
at a time, each member a trial of its own to the sampler's searcher, and its state kept through
Tune's own save and restore of a searcher chain."""

from __future__ import annotations

import json

import pytest
from ray.tune.result import TRAINING_ITERATION
from ray.tune.search import ConcurrencyLimiter, Repeater, Searcher, SearchGenerator

from orchestrator.ray_adapter.stack_trial import MEMBER_ENDED, MEMBERS_KEY, STACK_KEY
from orchestrator.ray_adapter.stacks import StackProposals

pytestmark = pytest.mark.unit

METRIC = "dev_accuracy"
SEARCH = {"seeds": [1, 2], "configurations": []}
MEMBER_FIELDS = ("lr", "l2", "seed")  # SweepSpec.stacked_fields with seeds in stacks
SEEDS_APART = ("lr", "l2")


class Scripted(Searcher):
    """Proposes lr 1, 2, 3, ... (up to `count`) and records what it is told, in order."""

    def __init__(self, count: int, waits_after: int | None = None):
        super().__init__(metric=METRIC, mode="max")
        self.count, self.waits_after, self.drawn = count, waits_after, 0
        self.results: list[tuple[str, int]] = []  # (trial id, epoch)
        self.completed: list[tuple[str, dict | None, bool]] = []
        self.space = None

    def set_search_properties(self, metric, mode, config, **spec):
        self.space = config
        return True

    def suggest(self, trial_id):
        if self.drawn == self.waits_after:
            return None
        if self.drawn == self.count:
            return Searcher.FINISHED
        self.drawn += 1
        return {"lr": self.drawn}

    def on_trial_result(self, trial_id, result):
        self.results.append((trial_id, result[TRAINING_ITERATION]))

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append((trial_id, result, error))


def _report(epoch: int, ended: bool = False, accuracy: float = 0.5) -> dict:
    return {METRIC: accuracy, TRAINING_ITERATION: epoch, MEMBER_ENDED: ended}


STACK_TIME_S = 12.0  # Tune's time_total_s of the stack


def _result(*reports: dict) -> dict:
    return {METRIC: max(r[METRIC] for r in reports), MEMBERS_KEY: json.dumps(list(reports)),
            "time_total_s": STACK_TIME_S}


def _told(report: dict) -> dict:
    """A member's report as the searcher is told it: with its stack's time (search.objectives may
    read it, as they read a solo trial's)."""
    return {**report, "time_total_s": STACK_TIME_S}


def _lrs(stack: dict) -> list[tuple[int, int]]:
    return [(member["lr"], member.get("__trial_index__", 0)) for member in stack[STACK_KEY]]


def test_proposals_fill_stacks_in_order_and_the_sweep_ends_at_its_total():
    inner = Scripted(count=100)
    stacks = StackProposals(inner, {"lr": "domain"}, size=3, search=SEARCH, fields=MEMBER_FIELDS, total=5)
    assert stacks.set_search_properties(METRIC, "max", {STACK_KEY: None})
    assert inner.space == {"lr": "domain"}  # the sampler's domains, not Tune's stacked space
    assert _lrs(stacks.suggest("a")) == [(1, 0), (2, 0), (3, 0)]
    assert _lrs(stacks.suggest("b")) == [(4, 0), (5, 0)]  # the total: 5 trials
    assert stacks.suggest("c") == Searcher.FINISHED and inner.drawn == 5


def test_a_searcher_that_waits_gets_a_partial_stack_and_one_that_finishes_ends_the_sweep():
    inner = Scripted(count=3, waits_after=2)
    stacks = StackProposals(inner, {}, size=4, search=SEARCH, fields=MEMBER_FIELDS, total=10)
    assert _lrs(stacks.suggest("a")) == [(1, 0), (2, 0)]
    assert stacks.suggest("b") is None  # waiting: no stack, not finished
    inner.waits_after = None
    assert _lrs(stacks.suggest("c")) == [(3, 0)]
    assert stacks.suggest("d") == Searcher.FINISHED


def test_seeds_apart_hold_the_other_seed_for_the_next_stack():
    """Where seeds train apart, a configuration's second seed (Repeater's next repeat) waits for
    the next stack; the held proposals come first there, in the order they were drawn."""
    inner = Scripted(count=100)
    repeated = Repeater(inner, repeat=2, set_index=True)
    stacks = StackProposals(repeated, {}, size=3, search=SEARCH, fields=SEEDS_APART, total=8)
    assert _lrs(stacks.suggest("a")) == [(1, 0), (2, 0), (3, 0)]
    assert _lrs(stacks.suggest("b")) == [(1, 1), (2, 1), (3, 1)]
    assert _lrs(stacks.suggest("c")) == [(4, 0)]  # the total (8) is drawn; (4, 1) is held
    assert _lrs(stacks.suggest("d")) == [(4, 1)]
    assert stacks.suggest("e") == Searcher.FINISHED


def test_seeds_together_share_a_stack():
    repeated = Repeater(Scripted(count=100), repeat=2, set_index=True)
    stacks = StackProposals(repeated, {}, size=4, search=SEARCH, fields=MEMBER_FIELDS, total=4)
    assert _lrs(stacks.suggest("a")) == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_each_member_is_told_its_new_epochs_and_its_end_as_it_ends():
    inner = Scripted(count=100)
    stacks = StackProposals(inner, {}, size=3, search=SEARCH, fields=MEMBER_FIELDS, total=3)
    stacks.suggest("s")
    first, stopped, diverged = (f"s-p{i}" for i in range(3))
    stacks.on_trial_result("s", _result(_report(1), _report(1), _report(1, ended=True, accuracy=0.0)))
    assert inner.results == [(first, 1), (stopped, 1)]
    assert inner.completed == [(diverged, _told(_report(1, ended=True, accuracy=0.0)), False)]
    # The scheduler stopped the second member after epoch 1: it repeats that epoch, then ends.
    stacks.on_trial_result("s", _result(_report(2), _report(1), _report(1, ended=True, accuracy=0.0)))
    stacks.on_trial_result("s", _result(_report(3), _report(1, ended=True), _report(1, ended=True, accuracy=0.0)))
    assert inner.results == [(first, 1), (stopped, 1), (first, 2), (first, 3)]
    assert [trial_id for trial_id, _, _ in inner.completed] == [diverged, stopped]
    final = _result(_report(3, ended=True), _report(1, ended=True), _report(1, ended=True, accuracy=0.0))
    stacks.on_trial_complete("s", final)
    assert inner.completed[2] == (first, _told(_report(3, ended=True)), False)
    assert len(inner.completed) == 3  # each member told its end once


def test_a_stack_that_errors_ends_its_open_members_as_errors():
    inner = Scripted(count=100)
    stacks = StackProposals(inner, {}, size=2, search=SEARCH, fields=MEMBER_FIELDS, total=2)
    stacks.suggest("s")
    stacks.on_trial_result("s", _result(_report(1, ended=True), _report(1)))
    stacks.on_trial_complete("s", None, error=True)
    assert inner.completed == [("s-p0", _told(_report(1, ended=True)), False), ("s-p1", None, True)]


class Saved(Scripted):
    """A base searcher Tune can save and restore (a file of its own, as OptunaSearch keeps)."""

    def save(self, checkpoint_path):
        with open(checkpoint_path, "w") as file:
            json.dump(self.drawn, file)

    def restore(self, checkpoint_path):
        with open(checkpoint_path) as file:
            self.drawn = json.load(file)


def _chain(inner: Searcher) -> SearchGenerator:
    stacks = StackProposals(Repeater(inner, repeat=2, set_index=True), {}, size=2, search=SEARCH,
                            fields=SEEDS_APART, total=6)
    return SearchGenerator(ConcurrencyLimiter(stacks, max_concurrent=4))


def test_tune_saves_and_restores_the_held_proposals_and_the_open_members(tmp_path):
    """Tune's SearchGenerator saves each wrapper's get_state apart from the base searcher's file:
    a restored chain goes on where the saved one was (the held seed next, the count of draws, the
    members still training)."""
    saved = _chain(Saved(count=100))
    searcher = saved.searcher.searcher
    searcher.suggest("a")  # lr 1 and 2 of seed 1; their seed 2 held
    saved.save_to_dir(str(tmp_path), "session")
    restored = _chain(Saved(count=100))
    restored.restore_from_dir(str(tmp_path))
    stacks = restored.searcher.searcher
    assert _lrs(stacks.suggest("b")) == [(1, 1), (2, 1)]
    assert _lrs(stacks.suggest("c")) == [(3, 0)]  # the base searcher's draws went on, to the total (6)
    assert _lrs(stacks.suggest("d")) == [(3, 1)]
    assert stacks.suggest("e") == Searcher.FINISHED
    # The stack of seed 1 was open when saved: its members' ends reach the restored Repeater,
    # which tells the sampler each configuration's mean over its seeds.
    stacks.on_trial_complete("a", _result(_report(3, True, 0.4), _report(3, True, 0.6)))
    stacks.on_trial_complete("b", _result(_report(3, True, 0.6), _report(3, True, 0.8)))
    told = stacks.searcher.searcher.completed
    assert [(trial_id, result[METRIC], error) for trial_id, result, error in told] == [
        ("a-p0", pytest.approx(0.5), False), ("a-p2", pytest.approx(0.7), False)]
