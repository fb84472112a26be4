"""What a resume from the journal plans for a sampler's sweep (orchestrator.journal.resume.plan_from_journal),
from a journal written as the driver writes it: the count of trials it runs, what the sampler
is told and which points run first (the end-to-end run: tests/test_lifecycle.py -k torn)."""

from __future__ import annotations

import pytest
from testkit.specs import write_spec

from orchestrator.journal.operations import Journal, Op
from orchestrator.journal.resume import plan_from_journal
from orchestrator.sweep.spec import load_spec, logged_params
from results import run_schema as rs

pytestmark = pytest.mark.unit


def test_a_two_seed_sampler_plan_keeps_the_finished_seed_runs_the_rest_first_and_draws_the_difference(tmp_path):
    """num_samples 3 x seeds [1, 2]: lr 0.002 finished seed 1 and was cut at seed 2, lr 0.005
    started seed 1 only. Kept: one trial; first: 0.002 seed 2, 0.005 seeds 1 and 2 (on the
    earlier runs where there are); the sampler is told 0.002 and draws one configuration (two
    trials): 5 trials to run, 6 planned."""
    spec = load_spec(write_spec(tmp_path, {"name": "plan"}, replace_search={
        "sampler": "tpe", "num_samples": 3, "space": {"lr": {"uniform": [0.001, 0.01]}}, "seeds": [1, 2],
        "resources": {"cpu": 1}}))
    base = logged_params(spec.base_config())
    journal = Journal(tmp_path / "journal.jsonl", "0", "parent")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for trial_id, lr, seed in (("done", 0.002, 1), ("cut", 0.002, 2), ("started", 0.005, 1)):
        journal.append(Op.START, trial_id, {"params": {**base, "lr": lr, "seed": seed}, "tags": {}})
        journal.append(Op.EPOCH, trial_id, {"step": 1, "values": {rs.METRIC_DEV_ACCURACY: 0.5}})
    journal.append(Op.EPOCH, "done", {"step": 2, "values": {rs.METRIC_DEV_ACCURACY: 0.75}})
    journal.append(Op.FINISH, "done", {"values": {rs.METRIC_BEST_DEV_ACCURACY: 0.75}, "tags": {},
                                       "status": "FINISHED"})
    journal.append(Op.ARTIFACTS, "done", {"path": str(checkpoint), "dest": rs.ARTIFACT_CHECKPOINT_DIR})
    journal.close()

    plan = plan_from_journal(spec, journal.path)
    assert [(o.trial_id, o.params) for o in plan.kept] == [("done", {"lr": 0.002, "seed": 1})]
    assert plan.remaining == [{"lr": 0.002, "seed": 2}, {"lr": 0.005, "seed": 1}, {"lr": 0.005, "seed": 2}]
    assert (plan.prior.points, plan.prior.values) == ([{"lr": 0.002}], [{rs.METRIC_DEV_ACCURACY: 0.75}])
    assert plan.prior.first == plan.remaining and plan.to_run == 5 and spec.num_trials() == 6
    assert sorted(trial for trials in plan.reuse.values() for trial in trials) == ["cut", "started"]


def test_a_multi_objective_plan_tells_the_sampler_every_objective_of_a_finished_trial(tmp_path):
    """search.objectives [dev_accuracy: max, trial_time_s: min]: the sampler is told the
    finished configuration's final values from its FINISH record (what Tune told it: the best
    dev accuracy, Tune's time_total_s, recorded as trial_time_s), under the Tune result keys the
    study reads; the unfinished trial's configuration runs first."""
    spec = load_spec(write_spec(tmp_path, {"name": "plan"}, replace_search={
        "sampler": "tpe", "num_samples": 3, "space": {"lr": {"uniform": [0.001, 0.01]}}, "seeds": [1],
        "objectives": [{"dev_accuracy": "max"}, {"trial_time_s": "min"}], "resources": {"cpu": 1}}))
    base = logged_params(spec.base_config())
    journal = Journal(tmp_path / "journal.jsonl", "0", "parent")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for trial_id, lr in (("done", 0.002), ("cut", 0.005)):
        journal.append(Op.START, trial_id, {"params": {**base, "lr": lr, "seed": 1}, "tags": {}})
        journal.append(Op.EPOCH, trial_id, {"step": 1, "values": {rs.METRIC_DEV_ACCURACY: 0.5}})
    journal.append(Op.FINISH, "done", {"values": {rs.METRIC_BEST_DEV_ACCURACY: 0.75, rs.METRIC_THETA_M: 1000.0,
                                                  rs.METRIC_TRIAL_TIME: 12.5}, "tags": {}, "status": "FINISHED"})
    journal.append(Op.ARTIFACTS, "done", {"path": str(checkpoint), "dest": rs.ARTIFACT_CHECKPOINT_DIR})
    journal.close()

    plan = plan_from_journal(spec, journal.path)
    assert plan.prior.points == [{"lr": 0.002}]
    assert plan.prior.values == [{rs.METRIC_BEST_DEV_ACCURACY: 0.75, "time_total_s": 12.5}]
    assert plan.remaining == [{"lr": 0.005, "seed": 1}] and plan.to_run == 2
