"""DistinctProposals: a configuration proposed again is not trained again."""

from __future__ import annotations

import pytest
from ray import tune
from ray.tune.search import Repeater, Searcher

from orchestrator.ray_adapter import DistinctProposals, optuna_search

METRIC = "dev_accuracy"


class Scripted(Searcher):
    """Proposes the given configurations in order and records what it is told."""

    def __init__(self, proposals: list[dict]):
        super().__init__(metric=METRIC, mode="max")
        self.proposals = list(proposals)
        self.told: dict[str, tuple[dict | None, bool]] = {}

    def suggest(self, trial_id):
        return self.proposals.pop(0) if self.proposals else Searcher.FINISHED

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.told[trial_id] = (result, error)


def _result(value: float) -> dict:
    return {METRIC: value, "training_iteration": 3}


def test_repeat_of_a_finished_configuration_is_told_its_result_and_skipped():
    inner = Scripted([{"lr": 1}, {"lr": 1}, {"lr": 1}, {"lr": 2}])
    searcher = DistinctProposals(inner)
    assert searcher.suggest("a") == {"lr": 1}
    searcher.on_trial_complete("a", _result(0.7))
    assert searcher.suggest("b") == {"lr": 2}
    # Both repeats were closed with the recorded result, under ids of their own.
    repeats = [v for k, v in inner.told.items() if not k.startswith("a/")]
    assert repeats == [(_result(0.7), False), (_result(0.7), False)]


def test_repeat_of_a_running_configuration_gets_the_result_when_it_arrives():
    inner = Scripted([{"lr": 1}, {"lr": 1}, {"lr": 2}])
    searcher = DistinctProposals(inner)
    searcher.suggest("a")
    assert searcher.suggest("b") == {"lr": 2}
    assert len(inner.told) == 0  # the repeat waits for trial a
    searcher.on_trial_complete("a", _result(0.6))
    assert sorted(r[METRIC] for r, _ in inner.told.values()) == [0.6, 0.6]
    searcher.on_trial_complete("b", _result(0.5))
    assert len(inner.told) == 3


def test_after_max_tries_of_repeats_the_repeat_runs():
    inner = Scripted([{"lr": 1}] * 5)
    searcher = DistinctProposals(inner, max_tries=3)
    searcher.suggest("a")
    searcher.on_trial_complete("a", _result(0.7))
    assert searcher.suggest("b") == {"lr": 1}  # 2 repeats skipped, the third runs
    assert len(inner.proposals) == 1
    searcher.on_trial_complete("b", _result(0.7))
    assert sum(1 for r, _ in inner.told.values() if r == _result(0.7)) == 4


def test_a_failed_configuration_may_run_again():
    inner = Scripted([{"lr": 1}, {"lr": 1}])
    searcher = DistinctProposals(inner)
    searcher.suggest("a")
    searcher.on_trial_complete("a", None, error=True)
    assert searcher.suggest("b") == {"lr": 1}
    assert list(inner.told.values()) == [(None, True)]


def test_waiting_and_finished_pass_through():
    searcher = DistinctProposals(Scripted([]))
    assert searcher.suggest("a") == Searcher.FINISHED


def test_state_round_trip_keeps_the_record():
    inner = Scripted([{"lr": 1}, {"lr": 1}, {"lr": 2}])
    searcher = DistinctProposals(inner)
    searcher.suggest("a")
    searcher.on_trial_complete("a", _result(0.7))
    state = searcher.get_state()
    assert "searcher" not in state  # Tune saves the wrapped searcher separately
    restored = DistinctProposals(inner)
    restored.set_state(state)
    assert restored.suggest("b") == {"lr": 2}


SPACE = {"lr": tune.choice([1, 2, 3]), "dropout": tune.choice([0.0, 0.1, 0.2])}


SAMPLERS = ("random", "tpe", "cmaes")  # every Optuna sampler a spec may name


def _run(searcher: Searcher, n: int) -> list[tuple]:
    proposed = []
    for i in range(n):
        config = searcher.suggest(str(i))
        proposed.append((config["lr"], config["dropout"]))
        searcher.on_trial_complete(str(i), {METRIC: config["lr"] / 10 - config["dropout"]})
    return proposed


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_on_a_small_space_runs_every_point_once(sampler, seed):
    """The fault this fixes: the samplers repeat points of a 9-point space within 9 samples."""
    bare = optuna_search(sampler, seed)
    assert bare.set_search_properties(METRIC, "max", SPACE)
    assert len(set(_run(bare, 9))) < 9
    wrapped = DistinctProposals(optuna_search(sampler, seed), max_tries=50)
    assert wrapped.set_search_properties(METRIC, "max", SPACE)  # as Tune passes them
    assert (wrapped.metric, wrapped.mode) == (METRIC, "max")
    assert len(set(_run(wrapped, 9))) == 9


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_inside_repeater_each_configuration_runs_once_per_seed(sampler):
    searcher = Repeater(
        DistinctProposals(optuna_search(sampler, 0), max_tries=50), repeat=2, set_index=True
    )
    assert searcher.set_search_properties(METRIC, "max", SPACE)
    proposed = []
    for i in range(18):
        config = searcher.suggest(str(i))
        proposed.append((config["lr"], config["dropout"], config["__trial_index__"]))
        searcher.on_trial_complete(str(i), {METRIC: config["lr"] / 10 - config["dropout"]})
    assert len(set(proposed)) == 18
