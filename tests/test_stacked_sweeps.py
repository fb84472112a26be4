"""Stacked trials in a sweep (search.stack, issue 47) as a user meets them: `orchestrate sweep` on a
real local Ray and a real SQLite MLflow store. Every member is its own trial: its own child run
with its own epochs, checkpoint and selection, equal to the solo trial of its configuration; the
scheduler stops a member alone; a member whose loss is NaN fails alone; Ctrl-C and --resume
leave each member's record as an uninterrupted sweep's."""

from __future__ import annotations

import os
import pickle
import re
import signal
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from testkit.cli import run_orchestrate, start_orchestrate
from testkit.processes import assert_processes_gone, kill_session, wait_while_driving
from testkit.specs import write_spec
from testkit.store import client_for, runs_of, trial_running
from testkit.toy import decomposable

from nli_models.training import CHECKPOINT_FILE
from orchestrator.ray_adapter.optuna_study import STUDY_NAME
from orchestrator.ray_adapter.reaper import descendants
from results import run_schema as rs

pytestmark = pytest.mark.ray

EPOCHS = 3
EXIT_INTERRUPTED = 3
MEMBER = ("lr", "l2", "seed")


# search.stack: auto stacks ABCNN on a CPU (the one model measured faster stacked there).
ABCNN = {"name": "abcnn", "variant": "abcnn3", "args": {"embedding_dim": 8, "hidden_size": 6, "nonover": True}}


def _spec(folder: Path, name: str, stack, space: dict | None = None, model: dict | None = None, **search) -> Path:
    return write_spec(folder, {
        "name": name, "model": model or decomposable(dim=16, dropout=0.0), "data": {"toy": {"size": 600}},
        "training": {"optimizer": "adagrad", "lr": 0.05, "epochs": EPOCHS},
    }, replace_search={"sampler": "grid", "space": space or {"lr": {"grid": [0.01, 0.1]}, "l2": {"grid": [0.0, 0.001]}},
                       "seeds": [1, 2], "stack": stack, "max_concurrent_trials": 1, "resources": {"cpu": 1},
                       **search})


def _members(folder: Path, name: str) -> dict[tuple, object]:
    _, children = runs_of(folder, name)
    members = {tuple(c.data.params[k] for k in MEMBER): c for c in children}
    assert len(members) == len(children)  # one run per configuration and seed
    return members


def _history(folder: Path, run, metric: str = rs.METRIC_DEV_ACCURACY) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client_for(folder).get_metric_history(run.info.run_id, metric))


def _checkpoint_state(folder: Path, run) -> dict:
    local = client_for(folder).download_artifacts(run.info.run_id, rs.ARTIFACT_CHECKPOINT_DIR, str(folder / run.info.run_id))
    return torch.load(Path(local) / CHECKPOINT_FILE, weights_only=True)["state"]


def _delete_tune_state(folder: Path, name: str) -> None:
    """Tune's experiment files deleted (the trial folders stay): --resume goes on from the journal."""
    (experiment,) = (folder / "ray_results").glob(f"{name}-*")
    for pattern in ("tuner.pkl", "experiment_state-*.json", "basic-variant-state-*.json"):
        for path in experiment.glob(pattern):
            path.unlink()


def test_each_member_is_its_solo_trial_in_the_store(tmp_path):
    """One sweep stacked (stack: 8, one stack of lr x ℓ2 x 2 seeds, each member on its own seed's
    batch order) and the same sweep one configuration per trial: the same 8 child runs, each member's
    epochs equal to its solo trial's, the same selection and test accuracy, results table, replay
    and report; each member's checkpoint is its own."""
    said = {}
    for name, stack in (("stacked", 8), ("solo", "off")):
        result = run_orchestrate(["sweep", str(_spec(tmp_path, name, stack))], cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        said[name] = result.stderr
    assert "train as stacks of up to 8 members" in said["stacked"]
    assert len(list((tmp_path / "ray_results").glob("stacked-*/run_stack_trial_*"))) == 1
    assert "search.stack" not in said["solo"]
    stacked, solo = _members(tmp_path, "stacked"), _members(tmp_path, "solo")
    assert len(stacked) == len(solo) == 8 and stacked.keys() == solo.keys()
    for key, run in stacked.items():
        assert run.info.status == "FINISHED", key
        for metric in (rs.METRIC_DEV_ACCURACY, rs.METRIC_TRAIN_LOSS, rs.METRIC_DEV_LOSS):
            ours, theirs = _history(tmp_path, run, metric), _history(tmp_path, solo[key], metric)
            assert [s for s, _ in ours] == [s for s, _ in theirs] == [1, 2, 3], (key, metric, ours)
            assert [v for _, v in ours] == pytest.approx([v for _, v in theirs], abs=1e-5), (key, metric)
        assert run.data.metrics[rs.METRIC_BEST_DEV_ACCURACY] == solo[key].data.metrics[rs.METRIC_BEST_DEV_ACCURACY]
        assert _checkpoint_state(tmp_path, run)["best_dev_accuracy"] == run.data.metrics[rs.METRIC_BEST_DEV_ACCURACY]
    chosen = {key for key, run in stacked.items() if run.data.tags.get(rs.TAG_SELECTED) == "true"}
    assert chosen and chosen == {key for key, run in solo.items() if run.data.tags.get(rs.TAG_SELECTED) == "true"}
    for key in chosen:
        assert stacked[key].data.metrics[rs.METRIC_TEST_ACCURACY] == solo[key].data.metrics[rs.METRIC_TEST_ACCURACY]
    parents, _ = runs_of(tmp_path, "stacked")
    assert parents[0].data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    tables = {}
    for name in ("stacked", "solo"):
        out = tmp_path / f"{name}.parquet"
        result = run_orchestrate(["results", name, "--out", str(out)], cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        tables[name] = pd.read_parquet(out).drop(columns=["experiment", "selected_run_id", "parent_run_id",
                                                          "total_trial_time_s"])
    assert tables["stacked"]["n_trials"].tolist() == [8]
    pd.testing.assert_frame_equal(tables["stacked"], tables["solo"], atol=1e-9)
    # replay and the report read the members as they read solo trials: the same strategies,
    # selections and numbers; only the simulated clock differs (a member's recorded epoch time is
    # its stack's, every member's epoch together) and the report's ids, dates and hours.
    replays, reports = {}, {}
    for name in ("stacked", "solo"):
        out = tmp_path / f"{name}.replay.parquet"
        result = run_orchestrate(["replay", name, "--repeats", "2", "--out", str(out)], cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        replays[name] = pd.read_parquet(out).drop(columns=["simulated_hours"])
        result = run_orchestrate(["report", name, "--out", str(tmp_path / f"report_{name}")], cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        page = (tmp_path / f"report_{name}" / f"{name}.md").read_text().replace(name, "NAME")
        for pattern, stands_for in ((r"\b[0-9a-f]{12,32}\b", "ID"), (r"\d{4}-\d\d-\d\d \d\d:\d\d", "DATE"),
                                    (r"\d+\.\d+ h\b", "HOURS")):
            page = re.sub(pattern, stands_for, page)
        reports[name] = page
    assert replays["stacked"]["trials"].tolist() == [8.0] * len(replays["stacked"])
    pd.testing.assert_frame_equal(replays["stacked"], replays["solo"])
    assert "Trials in the store: 8 (8 finished)" in reports["stacked"]
    assert reports["stacked"] == reports["solo"]


def _told_study(folder: Path, name: str) -> list:
    """The trials the sweep's Optuna study was told (its searcher state in Tune's experiment)."""
    (state_file,) = (folder / "ray_results").glob(f"{name}-*/searcher-state-*.pkl")
    study = optuna.load_study(study_name=STUDY_NAME, storage=pickle.loads(state_file.read_bytes())["study_storage"])
    return [trial for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]


def test_a_samplers_proposals_train_as_stacks_each_member_its_solo_trial(tmp_path):
    """TPE with stack: 4 over lr x ℓ2, 4 configurations x 2 seeds: its proposals are drawn a stack
    at a time (each configuration's 2 seeds together), so 2 stacked trials train the 8 members. The
    same sweep one configuration per trial draws the same configurations (TPE's first 10 draws are
    random, which no result changes), and each member's epochs equal its solo trial's. The study is
    told every configuration, its score the mean over its seeds as an unstacked sweep tells it."""
    sampler = "tpe"
    space = {"lr": {"loguniform": [0.01, 0.2]}, "l2": {"choice": [0.0, 0.001]}}
    said, members = {}, {}
    for name, stack in ((f"{sampler}_stacked", 4), (f"{sampler}_solo", "off")):
        spec = _spec(tmp_path, name, stack, space, sampler=sampler, num_samples=4)
        result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        said[name] = result.stderr
        members[name] = _members(tmp_path, name)
    stacked, solo = members[f"{sampler}_stacked"], members[f"{sampler}_solo"]
    assert (f"train as stacks of up to 4 members, one Tune trial each; every member is its own trial and run; "
            f"the {sampler} sampler draws a stack's members together") in said[f"{sampler}_stacked"]
    assert len(list((tmp_path / "ray_results").glob(f"{sampler}_stacked-*/run_stack_trial_*"))) == 2
    assert len(stacked) == 8 and stacked.keys() == solo.keys()
    for key, run in stacked.items():
        assert run.info.status == "FINISHED", key
        ours, theirs = _history(tmp_path, run), _history(tmp_path, solo[key])
        assert [s for s, _ in ours] == [s for s, _ in theirs] == [1, 2, 3], (key, ours)
        assert [v for _, v in ours] == pytest.approx([v for _, v in theirs], abs=1e-5), key
    told = _told_study(tmp_path, f"{sampler}_stacked")
    assert len(told) == 4
    for trial in told:
        seeds = [run for (lr, l2, _), run in stacked.items()
                 if float(lr) == trial.params["lr"] and float(l2) == trial.params["l2"]]
        assert len(seeds) == 2
        assert trial.value == pytest.approx(sum(r.data.metrics[rs.METRIC_DEV_ACCURACY] for r in seeds) / 2)


def test_a_word_by_word_grid_over_dropout_is_one_stack_of_faithful_members(tmp_path):
    """Rocktäschel's word-by-word attention (its LSTMs stepwise in the stack) over lr x dropout:
    one stack of 4 members, each its own run with its own dropout; the dropout-0 members' epochs
    equal their solo trials' (a sweep of those two, unstacked), the others' masks differ. The
    solo sweep asks for `stack: auto`: on a CPU auto trains word-by-word one configuration per
    trial (its stacks measured slower there), and its start line says why."""
    model = {"name": "rocktaschel", "variant": "word_by_word", "args": {"hidden_size": 12, "embedding_dim": 12}}
    space = {"lr": {"grid": [0.01, 0.003]}, "dropout": {"grid": [0.0, 0.3]}}
    runs = {}
    outputs = {}
    for name, stack, dropouts in (("wbw_stacked", 4, [0.0, 0.3]), ("wbw_solo", "auto", [0.0])):
        spec = write_spec(tmp_path, {
            "name": name, "model": model, "data": {"toy": {"size": 400}},
            "training": {"optimizer": "adam", "lr": 0.01, "epochs": 2},
        }, replace_search={"sampler": "grid", "space": {**space, "dropout": {"grid": dropouts}}, "seeds": [1],
                           "stack": stack, "max_concurrent_trials": 1, "resources": {"cpu": 1}})
        result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs[name] = result.stderr
        runs[name] = {(c.data.params["lr"], c.data.params["dropout"]): c for c in runs_of(tmp_path, name)[1]}
    assert len(list((tmp_path / "ray_results").glob("wbw_stacked-*/run_stack_trial_*"))) == 1
    assert "train as stacks of up to 4 members" in outputs["wbw_stacked"]
    assert ("search.stack auto: one configuration per trial (trials without a GPU: of the models, only abcnn "
            "trains faster stacked on a CPU") in outputs["wbw_solo"], outputs["wbw_solo"]
    assert not list((tmp_path / "ray_results").glob("wbw_solo-*/run_stack_trial_*"))
    assert len(list((tmp_path / "ray_results").glob("wbw_solo-*/run_trial_*"))) == 2  # one per configuration
    stacked, solo = runs["wbw_stacked"], runs["wbw_solo"]
    assert sorted(stacked) == [(lr, p) for lr in ("0.003", "0.01") for p in ("0.0", "0.3")]
    assert all(run.info.status == "FINISHED" for run in stacked.values())
    for key, run in solo.items():
        for metric in (rs.METRIC_TRAIN_LOSS, rs.METRIC_DEV_LOSS, rs.METRIC_DEV_ACCURACY):
            ours, theirs = _history(tmp_path, stacked[key], metric), _history(tmp_path, run, metric)
            assert [s for s, _ in ours] == [s for s, _ in theirs] == [1, 2], (key, metric)
            assert [v for _, v in ours] == pytest.approx([v for _, v in theirs], abs=1e-5), (key, metric)
    for lr in ("0.003", "0.01"):
        with_dropout = _history(tmp_path, stacked[(lr, "0.3")], rs.METRIC_TRAIN_LOSS)
        assert with_dropout != _history(tmp_path, stacked[(lr, "0.0")], rs.METRIC_TRAIN_LOSS)


def test_asha_stops_one_member_and_a_nan_member_fails_alone(tmp_path):
    """Adam, lr 0.01 (learns), 1e-5 (barely) and 1e10 (NaN at once) in one stack under ASHA: the
    NaN member is FAILED and marked diverged, ASHA stops the slow member at its first rung (its
    run FINISHED and early_stopped, its epochs and checkpoint those of its last epoch), and the
    good member trains every epoch and is selected."""
    spec = _spec(tmp_path, "asha", 4, {"lr": {"grid": [0.01, 0.00001, 1e10]}}, seeds=[1],
                 scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2})
    spec.write_text(spec.read_text().replace("optimizer: adagrad", "optimizer: adam"))
    result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "3 trials (0 failed), 1 diverged" in output
    runs = {run.data.params["lr"]: run for run in runs_of(tmp_path, "asha")[1]}
    good, slow, bad = runs["0.01"], runs["1e-05"], runs["10000000000.0"]
    assert bad.info.status == "FAILED" and bad.data.tags[rs.TAG_DIVERGED] == "true"
    assert bad.data.metrics[rs.METRIC_DIVERGED_EPOCH] == 1 and rs.METRIC_DEV_ACCURACY not in bad.data.metrics
    assert slow.info.status == "FINISHED" and slow.data.tags[rs.TAG_EARLY_STOPPED] == "true"
    stopped_at = int(slow.data.metrics[rs.METRIC_EPOCHS_TRAINED])
    assert stopped_at < EPOCHS
    assert [s for s, _ in _history(tmp_path, slow)] == list(range(1, stopped_at + 1))
    assert _checkpoint_state(tmp_path, slow)["epoch"] == stopped_at  # its slice stopped updating
    assert good.info.status == "FINISHED" and good.data.tags[rs.TAG_EARLY_STOPPED] == "false"
    assert [s for s, _ in _history(tmp_path, good)] == [1, 2, 3]
    assert good.data.tags[rs.TAG_SELECTED] == "true" and rs.TAG_SELECTED not in slow.data.tags


@pytest.mark.parametrize("tune_state", ["kept", "deleted"])
def test_a_signal_as_the_scheduler_stops_a_member_leaves_it_stopped_after_resume(tmp_path, tune_state):
    """SIGINT lands as ASHA stops the slow member at a rung (a test seam: the driver is
    interrupted before it ends that member, so the journal holds the member as cut, KILLED).
    --resume tells the scheduler the recorded epochs again: it stops the member there, as the
    uninterrupted sweep did, and the member ends FINISHED and early stopped at that epoch, its
    checkpoint that epoch's; it is not trained further. The other member trains every epoch.
    With Tune's state deleted the resume goes on from the journal, the member on its own run."""
    spec = _spec(tmp_path, "race", 2, {"lr": {"grid": [0.01, 0.00001]}}, seeds=[1],
                 scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2})
    spec.write_text(spec.read_text().replace("optimizer: adagrad", "optimizer: adam"))
    interrupted = run_orchestrate(["sweep", str(spec)], cwd=tmp_path,
                                  env={"NLI_SIGINT_AT_MEMBER_STOP": str(tmp_path / "markers")})
    assert interrupted.returncode == EXIT_INTERRUPTED, interrupted.stdout + interrupted.stderr
    assert (tmp_path / "markers" / "signalled").exists()  # the signal landed at the stop
    cut = {run.data.params["lr"]: run for run in runs_of(tmp_path, "race")[1]}
    assert cut["1e-05"].info.status == "KILLED"  # the stop was not recorded as an end
    stopped_at = len(_history(tmp_path, cut["1e-05"]))  # the epoch ASHA stopped it after
    assert 1 <= stopped_at < EPOCHS
    if tune_state == "deleted":
        _delete_tune_state(tmp_path, "race")
    resumed = run_orchestrate(["sweep", str(spec), "--resume"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert ("continuing from the sweep's journal" in resumed.stderr) == (tune_state == "deleted"), resumed.stderr
    runs = {run.data.params["lr"]: run for run in runs_of(tmp_path, "race")[1]}
    slow, good = runs["1e-05"], runs["0.01"]
    assert slow.info.status == "FINISHED" and slow.data.tags[rs.TAG_EARLY_STOPPED] == "true"
    assert slow.data.metrics[rs.METRIC_EPOCHS_TRAINED] == stopped_at
    assert [s for s, _ in _history(tmp_path, slow)] == list(range(1, stopped_at + 1))
    assert _checkpoint_state(tmp_path, slow)["epoch"] == stopped_at
    assert good.info.status == "FINISHED" and [s for s, _ in _history(tmp_path, good)] == [1, 2, 3]


def test_a_stack_whose_corpus_has_a_sentence_longer_than_max_length_is_refused_before_launch(tmp_path):
    """ABCNN-1 with max_length 4 on the toy corpus (longer sentences), two seeds as one stack: the
    sweep is refused before anything runs (exit 2, naming max_length and the length it needs), as
    an unstacked one is, and nothing is recorded. (Inside a stack the model's own refusal, not
    vmap's "Batching rule not implemented", is tests/test_stacked.py's.)"""
    spec = write_spec(tmp_path, {
        "name": "too_long", "data": {"toy": {"size": 300}}, "training": {"optimizer": "adagrad", "epochs": 1},
        "model": {"name": "abcnn", "variant": "abcnn1", "args": {"embedding_dim": 8, "hidden_size": 6, "max_length": 4}},
    }, replace_search={"sampler": "grid", "space": {"lr": {"grid": [0.05]}}, "seeds": [1, 2], "stack": 2,
                       "max_concurrent_trials": 1, "resources": {"cpu": 1}})
    result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert re.search(r"model\.args\.max_length=4, but the corpus has a sentence of (\d+) tokens", output), output
    assert "set model.args.max_length: " in output and "Traceback" not in output
    assert client_for(tmp_path).get_experiment_by_name("too_long") is None  # nothing in the store
    assert not (tmp_path / "ray_results").exists()


def test_auto_sizes_its_stacks_to_the_trial_slots_and_each_member_trains_its_epochs(tmp_path):
    """`auto` on 2 trial slots (max_concurrent_trials 2, half a CPU a trial: 2 slots on any
    machine): ABCNN-3's 4 configurations train as 2 stacks of 2 side by side, not as one stack of 4
    with a slot idle; the start line says the size and why; every member is a finished run with
    each epoch logged once."""
    spec = _spec(tmp_path, "slots", "auto", model=ABCNN, seeds=[1], max_concurrent_trials=2,
                 resources={"cpu": 0.5})
    result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "train as stacks of up to 2 members (auto, for 2 trial slots)" in result.stderr, result.stderr
    assert len(list((tmp_path / "ray_results").glob("slots-*/run_stack_trial_*"))) == 2
    members = _members(tmp_path, "slots")
    assert len(members) == 4
    for run in members.values():
        assert run.info.status == "FINISHED"
        assert [step for step, _ in _history(tmp_path, run)] == list(range(1, EPOCHS + 1))


@pytest.fixture(scope="module")
def uninterrupted_sweep(tmp_path_factory):
    """The uninterrupted sweep of `_spec(..., "cut", stack)` (folder, its result), run once per
    stack value for the module's tests."""
    made = {}

    def sweep(stack, sampler):
        if (stack, sampler) not in made:
            whole = tmp_path_factory.mktemp(f"whole-{stack}-{sampler}")
            spec = _cut_spec(whole, stack, sampler)
            made[stack, sampler] = whole, run_orchestrate(["sweep", str(spec)], cwd=whole)
        return made[stack, sampler]

    return sweep


def _cut_spec(folder: Path, stack, sampler: str) -> Path:
    """ABCNN-3 over lr x ℓ2 (2 x 2), 2 seeds: the grid, or a sampler's 4 draws of the same points."""
    if sampler == "grid":
        return _spec(folder, "cut", stack, model=ABCNN)
    space = {"lr": {"choice": [0.01, 0.1]}, "l2": {"choice": [0.0, 0.001]}}
    return _spec(folder, "cut", stack, space, model=ABCNN, sampler=sampler, num_samples=4)


@pytest.mark.parametrize(("tune_state", "stack", "sampler"), [
    ("kept", "auto", "grid"), ("deleted", "auto", "grid"), ("kept", 8, "grid"), ("deleted", "auto", "random")])
def test_ctrl_c_then_resume_leaves_each_member_as_an_uninterrupted_sweep(tmp_path, tune_state, stack, sampler,
                                                                        uninterrupted_sweep):
    """ABCNN-3 (`auto` stacks it on a CPU). Ctrl-C once a member has logged an epoch: the sweep ends
    interrupted (exit 3), no member run stays RUNNING, none is tested. --resume restores the stacks from their checkpoints (Tune's
    state kept) or reruns the unfinished members as fresh stacks on their own runs (Tune's state
    deleted: from the journal): every member ends FINISHED with epochs 1-3 logged once each,
    equal to an uninterrupted sweep's. With `stack: 8` the two seeds share the stack (each member
    on its own batches): its resume is exact too. With the random sampler each stack's members
    are its proposals (a seed's, seeds apart): from the journal, its finished configurations told
    and the rest drawn again, the same 8 members end as uninterrupted (Tune's restore of its held
    proposals and open stacks: tests/test_stack_proposals.py)."""
    interrupted = tmp_path / "interrupted"
    spec = _cut_spec(interrupted, stack, sampler)
    log = interrupted / "driver.log"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NLI_EPOCH_DELAY_S", "3")
        driver = start_orchestrate(["sweep", str(spec)], cwd=interrupted, log=log)
    wait_while_driving(trial_running(interrupted, "cut", log, epochs_logged=1), driver, log, "a member's first epoch")
    processes = descendants(driver.pid)
    os.killpg(driver.pid, signal.SIGINT)
    try:
        assert driver.wait(timeout=180) == EXIT_INTERRUPTED, log.read_text()
    finally:
        kill_session(driver)
    assert_processes_gone(processes)
    parents, children = runs_of(interrupted, "cut")
    assert parents[0].data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_INTERRUPTED
    assert all(c.info.status in ("FINISHED", "KILLED") for c in children)
    assert not any(rs.METRIC_TEST_ACCURACY in c.data.metrics for c in children)
    assert any(c.info.status == "KILLED" for c in children)
    if tune_state == "deleted":
        _delete_tune_state(interrupted, "cut")
    resumed = run_orchestrate(["sweep", str(spec), "--resume"], cwd=interrupted)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # Tune restores the stacks from its state; without it the journal stands in.
    assert ("continuing from the sweep's journal" in resumed.stderr) == (tune_state == "deleted"), resumed.stderr
    whole, result = uninterrupted_sweep(stack, sampler)
    assert result.returncode == 0, result.stdout + result.stderr
    # auto on CPUs keeps seeds apart: one stack per seed (stacks of several seeds pay on GPUs).
    assert ("seeds apart" in result.stderr) == (stack == "auto")
    assert len(list((whole / "ray_results").glob("cut-*/run_stack_trial_*"))) == (2 if stack == "auto" else 1)
    after, uninterrupted = _members(interrupted, "cut"), _members(whole, "cut")
    assert after.keys() == uninterrupted.keys() and len(after) == 8
    for key, run in after.items():
        assert run.info.status == "FINISHED", key
        ours, theirs = _history(interrupted, run), _history(whole, uninterrupted[key])
        assert [s for s, _ in ours] == [s for s, _ in theirs] == [1, 2, 3], (key, ours)  # each epoch once
        assert [v for _, v in ours] == pytest.approx([v for _, v in theirs], abs=1e-6), key
        assert run.data.tags.get(rs.TAG_SELECTED) == uninterrupted[key].data.tags.get(rs.TAG_SELECTED)


@pytest.mark.parametrize(("change", "why"), [
    ({"search.sampler": "tpe", "search.space.lr": "{choice: [0.01, 0.1]}", "search.space.l2": "{choice: [0.0]}",
      "search.space.hidden_size": "{choice: [8, 16]}"},
     "sampler 'tpe' searches hidden_size, which a stack's members cannot differ in"),
    ({"training.grad_clip": "5.0"}, "not stacked yet: training.grad_clip"),
])
def test_a_stack_the_sweep_cannot_have_is_refused_before_anything_runs(tmp_path, change, why):
    """search.stack: N where the sweep cannot stack: exit 2 naming the field and the reason, and
    no store or Ray results written; the same spec with auto validates (one configuration per trial)."""
    spec = _spec(tmp_path, "refused", 4)
    overrides = [arg for key, value in change.items() for arg in ("--set", f"{key}={value}")]
    result = run_orchestrate(["sweep", str(spec), *overrides], cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "search.stack: 4 asks for stacks, but" in result.stderr and why in result.stderr, result.stderr
    assert not (tmp_path / "ray_results").exists()
    _, children = runs_of(tmp_path, "refused") if client_for(tmp_path).get_experiment_by_name("refused") else (None, [])
    assert children == []
    checked = run_orchestrate(["validate", str(spec), "--no-data", "--set", "search.stack=auto", *overrides], cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "search.stack auto: one configuration per trial (" in checked.stdout and why in checked.stdout
