"""DistinctProposals: a configuration proposed again is not trained again."""

from __future__ import annotations

import json

import optuna
import pytest
from ray import tune
from ray.tune.search import Repeater, Searcher

from orchestrator.ray_adapter.optuna_study import optuna_search
from orchestrator.ray_adapter.ray_search import DistinctProposals, FirstPoints, PriorTrials
from results import run_schema as rs

METRIC = "dev_accuracy"


class Scripted(Searcher):
    """Proposes the given configurations in order and records what it is told."""

    def __init__(self, proposals: list[dict]):
        super().__init__(metric=METRIC, mode="max")
        self.proposals = list(proposals)
        self.told: dict[str, tuple[dict | None, bool]] = {}
        # An Optuna study over lr, as StudySearch keeps one (its tell_evaluated adds the trials it
        # was told that it did not propose).
        self.study = optuna.create_study(direction="maximize")

    def suggest(self, trial_id):
        return self.proposals.pop(0) if self.proposals else Searcher.FINISHED

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.told[trial_id] = (result, error)

    def tell_evaluated(self, config, result):
        self.study.add_trial(optuna.trial.create_trial(
            value=result[METRIC], params=config,
            distributions={"lr": optuna.distributions.FloatDistribution(0, 10)}))

    @property
    def evaluated(self) -> list[tuple[dict, float]]:
        return [(trial.params, trial.value) for trial in self.study.trials]


def _result(value: float) -> dict:
    return {METRIC: value, "training_iteration": 3}


def test_repeat_of_a_finished_configuration_is_told_its_result_and_skipped():
    inner = Scripted([{"lr": 1}, {"lr": 1}, {"lr": 1}, {"lr": 2}])
    searcher = DistinctProposals(inner)
    assert searcher.suggest("a") == {"lr": 1}
    searcher.on_trial_complete("a", _result(0.7))
    assert searcher.suggest("b") == {"lr": 2}
    # Both repeats were closed with the recorded score, under ids of their own.
    repeats = [v for k, v in inner.told.items() if not k.startswith("a/")]
    assert repeats == [({METRIC: 0.7}, False), ({METRIC: 0.7}, False)]


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
    assert sum(1 for r, _ in inner.told.values() if r[METRIC] == 0.7) == 4


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


def test_the_state_is_a_snapshot_that_later_trials_do_not_change():
    inner = Scripted([{"lr": 1}, {"lr": 2}, {"lr": 2}, {"lr": 3}])
    searcher = DistinctProposals(inner)
    searcher.suggest("a")
    searcher.on_trial_complete("a", _result(0.7))
    searcher.suggest("b")  # lr 2, running
    state = searcher.get_state()
    searcher.suggest("c")  # a repeat of b, waiting for it; then lr 3
    searcher.on_trial_complete("b", _result(0.5))
    assert state["_trials"].keys() == {"a", "b"}
    assert state["_outcome"] == {'{"lr": 1}': {METRIC: 0.7}, '{"lr": 2}': None}
    assert state["_waiting"] == {}
    assert state["_proposals"] == 2


def test_the_state_keeps_each_configurations_score_not_tunes_whole_result():
    """Tune snapshots the searcher's state at every trial checkpoint (num_to_keep): a state that
    grew by a whole result dict per trial made the driver's time grow with trials squared."""
    inner = Scripted([{"lr": i} for i in range(50)])
    searcher = DistinctProposals(inner)
    for i in range(50):
        searcher.suggest(str(i))
        tune_result = {**_result(i / 100), "config": {"lr": i, "nested": {"deep": list(range(20))}},
                       "hostname": "node", "time_total_s": 3.0}
        searcher.on_trial_complete(str(i), tune_result)
    outcomes = searcher.get_state()["_outcome"]
    assert outcomes == {json.dumps({"lr": i}): {METRIC: i / 100} for i in range(50)}
    assert inner.told["0/0"][0]["hostname"] == "node"  # the searcher itself is told the whole result


def test_a_result_without_the_metric_is_told_to_a_repeat_as_such():
    inner = Scripted([{"lr": 1}, {"lr": 1}, {"lr": 2}])
    searcher = DistinctProposals(inner)
    searcher.suggest("a")
    searcher.on_trial_complete("a", {"training_iteration": 1})  # stopped before its first result
    searcher.suggest("b")
    assert inner.told["b/1"] == ({}, False)  # Optuna marks both pruned: no value to tell


SPACE = {"lr": tune.choice([1, 2, 3]), "dropout": tune.choice([0.0, 0.1, 0.2])}


SAMPLERS = ("random", "tpe", "cmaes", "nsga2")  # every Optuna sampler a spec may name


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


def _prior(points: list[tuple], finite: bool) -> PriorTrials:
    configs = [{"lr": lr, "dropout": dropout} for lr, dropout in points]
    space = [{"lr": lr, "dropout": d} for lr in (1, 2, 3) for d in (0.0, 0.1, 0.2)]
    return PriorTrials(configs, [{METRIC: lr / 10 - d} for lr, d in points], finite_space=space if finite else None)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_warm_started_study_holds_the_prior_and_never_proposes_it(sampler):
    """--warm-start / --extend: 6 of the 9 points finished before; only the 3 others are
    proposed, even with max_tries 1 (an unvisited point is enqueued in the study)."""
    done = [(lr, d) for lr in (1, 2) for d in (0.0, 0.1, 0.2)]
    prior = _prior(done, finite=True)
    searcher = DistinctProposals(optuna_search(sampler, 0), max_tries=1, prior=prior)
    assert searcher.set_search_properties(METRIC, "max", SPACE)
    study = searcher.searcher.study()
    assert [(t.params["lr"], t.params["dropout"]) for t in study.trials] == done
    assert [{METRIC: t.value} for t in study.trials] == prior.values
    proposed = _run(searcher, 3)  # (with max_tries 1 a repeat of this run's own may run)
    assert {lr for lr, _ in proposed} == {3}
    assert any("fixed_params" in t.system_attrs for t in study.trials)  # enqueued (enqueue_trial)


def test_without_a_finite_space_a_prior_repeat_is_skipped_before_it_counts():
    """The same sampler seed proposes the earlier sweep's points first (a continuous space: the
    draws never repeat by chance): they are skipped, and do not use up max_tries."""
    space = {"lr": tune.uniform(1, 3), "dropout": tune.uniform(0.0, 0.2)}
    earlier = DistinctProposals(optuna_search("random", 0), max_tries=1)
    assert earlier.set_search_properties(METRIC, "max", space)
    first = _run(earlier, 4)
    prior = _prior(first, finite=False)
    searcher = DistinctProposals(optuna_search("random", 0), max_tries=1, prior=prior)
    assert searcher.set_search_properties(METRIC, "max", space)
    second = _run(searcher, 2)
    assert len(set(second)) == 2 and not set(second) & set(first)


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2"])  # those search.objectives allows
def test_a_multi_objective_repeat_is_told_every_objective(sampler):
    import optuna

    objectives = [("dev_accuracy", "max"), ("trial_time_s", "min")]
    searcher = DistinctProposals(optuna_search(sampler, 0, objectives), max_tries=50)
    assert searcher.set_search_properties(None, None, SPACE)  # Tune passes no metric with objectives
    assert searcher.metric == ["best_dev_accuracy", "time_total_s"]  # the Tune result's keys
    for i in range(9):
        config = searcher.suggest(str(i))
        searcher.on_trial_complete(str(i), {"best_dev_accuracy": config["lr"] / 10,
                                            "time_total_s": 10 * config["dropout"], "epoch": 2})
    study = searcher.searcher.study()
    assert len(study.directions) == 2
    told = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(told) > 9  # the repeats were told, with both values of the point they repeat
    assert all(t.values == [t.params["lr"] / 10, 10 * t.params["dropout"]] for t in told)


def test_a_diverged_trial_counts_as_dev_accuracy_0_in_a_multi_objective_search():
    """A diverged trial's result keeps its pre-divergence best_dev_accuracy (the record's); the
    search is told 0, as the single-metric search is told dev_accuracy 0."""
    objectives = [("dev_accuracy", "max"), ("theta_m", "min")]
    searcher = DistinctProposals(optuna_search("tpe", 0, objectives), max_tries=50)
    searcher.set_search_properties(None, None, SPACE)
    searcher.suggest("0")
    searcher.on_trial_complete("0", {"best_dev_accuracy": 0.8, "theta_m": 1000.0, "epoch": 2,
                                     rs.RESULT_DIVERGED_LOSS: "nan"})
    [told] = searcher.searcher.study().trials
    assert told.values == [0.0, 1000.0]


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2"])  # those search.objectives allows
def test_a_multi_objective_study_is_told_every_objective_of_a_prior_and_of_a_first_point(sampler):
    """A resume from the journal of a search.objectives sweep: the study is told the finished
    configuration with its value of each objective (ray_search.tell_evaluated) before it draws,
    and the configuration run first with both of its values once it ended; it draws neither."""
    objectives = [("dev_accuracy", "max"), ("theta_m", "min")]
    first = [{"lr": 2, "dropout": 0.1, "seed": 1}]
    prior = PriorTrials([{"lr": 1, "dropout": 0.0}], [{"best_dev_accuracy": 0.7, "theta_m": 1000.0}],
                        finite_space=[{"lr": lr, "dropout": d} for lr in (1, 2, 3) for d in (0.0, 0.1, 0.2)],
                        first=first)
    distinct = DistinctProposals(optuna_search(sampler, 0, objectives), max_tries=50, prior=prior)
    searcher = FirstPoints(distinct, first, told=distinct.told)
    assert searcher.set_search_properties(None, None, SPACE)  # Tune passes no metric with objectives
    study = distinct.searcher.study()
    assert [(t.params, t.values) for t in study.trials] == [({"lr": 1, "dropout": 0.0}, [0.7, 1000.0])]
    assert searcher.suggest("f") == first[0]
    drawn = []
    for i in range(7):  # the 7 other configurations
        config = searcher.suggest(str(i))
        drawn.append((config["lr"], config["dropout"]))
        searcher.on_trial_complete(str(i), {"best_dev_accuracy": config["lr"] / 10, "theta_m": 10.0, "epoch": 2})
    searcher.on_trial_complete("f", {"best_dev_accuracy": 0.6, "theta_m": 2000.0, "epoch": 2})
    assert len(set(drawn)) == 7 and not set(drawn) & {(1, 0.0), (2, 0.1)}
    told = {}
    for trial in study.trials:
        if trial.state == optuna.trial.TrialState.COMPLETE:
            told.setdefault((trial.params["lr"], trial.params["dropout"]), set()).add(tuple(trial.values))
    assert told[(1, 0.0)] == {(0.7, 1000.0)} and told[(2, 0.1)] == {(0.6, 2000.0)}


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_first_points_run_before_the_sampler_which_is_told_them_and_never_runs_them_again(sampler):
    """A resume from the journal (PriorTrials.first), two seeds: (1, 0.0) finished seed 1 before
    (told to the study), its seed 2 and both seeds of (2, 0.1) run first, outside the sampler;
    (2, 0.1) is told the mean of its seeds once both ended, (1, 0.0) is not told again, and the
    sampler's draws, made while the first points still run, are the other configurations."""
    first = [{"lr": 1, "dropout": 0.0, "seed": 2}, {"lr": 2, "dropout": 0.1, "seed": 1},
             {"lr": 2, "dropout": 0.1, "seed": 2}]
    prior = PriorTrials([{"lr": 1, "dropout": 0.0}], [{METRIC: 0.3}], finite_space=[
        {"lr": lr, "dropout": d} for lr in (1, 2, 3) for d in (0.0, 0.1, 0.2)], first=first)
    distinct = DistinctProposals(optuna_search(sampler, 0), max_tries=50, prior=prior)
    searcher = FirstPoints(Repeater(distinct, repeat=2, set_index=True), first, told=distinct.told)
    assert searcher.set_search_properties(METRIC, "max", SPACE)
    assert [searcher.suggest(f"f{i}") for i in range(3)] == first
    drawn = []
    for i in range(14):  # the 7 other configurations, twice each
        config = searcher.suggest(str(i))
        drawn.append((config["lr"], config["dropout"], config["__trial_index__"]))
        searcher.on_trial_complete(str(i), {METRIC: config["lr"] / 10 - config["dropout"]})
    for trial_id, value in (("f0", 0.9), ("f1", 0.4), ("f2", 0.6)):  # the first points end last
        searcher.on_trial_complete(trial_id, {METRIC: value})
    assert len(set(drawn)) == 14 and not {(lr, d) for lr, d, _ in drawn} & {(1, 0.0), (2, 0.1)}
    told = {}
    for trial in distinct.searcher.study().trials:
        told.setdefault((trial.params["lr"], trial.params["dropout"]), set()).add(trial.value)
    assert told[(1, 0.0)] == {0.3} and told[(2, 0.1)] == {0.5}


def test_a_configuration_run_first_is_a_running_trial_for_the_sampler_until_it_is_told():
    """PriorTrials.first: the sampler's proposal of a configuration that runs first outside it
    waits for its result, which the sampler is then told as an evaluated trial, with the repeat."""
    inner = Scripted([{"lr": 2}, {"lr": 3}])
    prior = PriorTrials([], [], first=[{"lr": 2, "seed": 1}])
    distinct = DistinctProposals(inner, prior=prior)
    searcher = FirstPoints(distinct, prior.first, told=distinct.told)
    assert searcher.suggest("a") == {"lr": 2, "seed": 1}
    assert searcher.suggest("b") == {"lr": 3}  # the repeat of lr 2 waits for trial a
    assert inner.told == {} and inner.evaluated == []
    searcher.on_trial_complete("a", _result(0.6))
    assert inner.evaluated == [({"lr": 2}, 0.6)]
    assert list(inner.told.values()) == [({METRIC: 0.6}, False)]


def test_a_restored_study_search_tells_and_enqueues_into_the_study_it_restored(tmp_path):
    """Tune saves the sampler's search to a file and a resumed sweep restores it: the study that
    StudySearch reaches through Optuna's public API (study(), tell_evaluated, enqueue) is then the
    restored one, the one its sampler draws from."""
    searcher = optuna_search("random", 0)
    assert searcher.set_search_properties(METRIC, "max", SPACE)
    searcher.tell_evaluated({"lr": 1, "dropout": 0.0}, {METRIC: 0.5})
    searcher.save(str(tmp_path / "searcher.pkl"))
    restored = optuna_search("random", 0)
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.enqueue({"lr": 3, "dropout": 0.2})
    assert restored.suggest("x") == {"lr": 3, "dropout": 0.2}
    complete = [(t.params, t.value) for t in restored.study().trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete == [({"lr": 1, "dropout": 0.0}, 0.5)]
