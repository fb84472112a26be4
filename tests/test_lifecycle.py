"""A sweep's lifecycle as a user meets it: `orchestrate sweep` in a subprocess on a real local Ray
and a real SQLite MLflow store, interrupted by signals at moments read from the store or the log,
then resumed; assertions on the store, the exit code and the processes left."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import yaml
from testkit.cli import orchestrate, run_orchestrate, start_orchestrate
from testkit.processes import assert_processes_gone, kill_session, wait_while_driving
from testkit.specs import write_spec
from testkit.store import client_for, runs_of, trial_running, trials_finished

from orchestrator.journal.operations import journal_file
from orchestrator.journal.resume import recorded_trials
from orchestrator.ray_adapter.reaper import descendants
from results import run_schema as rs
from results.stored_sweeps import load_sweeps

pytestmark = pytest.mark.ray
EPOCHS = 2
FOUR_EPOCHS = 4  # the sweep cut by SIGKILL and by Ctrl-C, one trial at a time
EXIT_INTERRUPTED = 3
# Each epoch lasts this much longer, so that a trial seen running is still running when the
# signal lands (toy epochs take a fraction of a second).
EPOCH_DELAY = {"NLI_EPOCH_DELAY_S": "3"}
# The sweep cut twice waits for trials to finish, seen in MLflow up to the uploader's interval
# (2 s) late: with toy trials of about a second, every trial could end within that lag. At 1 s
# per epoch the four trials still pending take 16 s or more.
SHORT_EPOCH_DELAY = {"NLI_EPOCH_DELAY_S": "1"}


def _spec(folder: Path, name: str, search: dict | None = None, epochs: int = EPOCHS) -> Path:
    return write_spec(
        folder,
        {"name": name, "data": {"toy": {"size": 300}}, "training": {"epochs": epochs},
         "search": {"max_concurrent_trials": None, **(search or {})}},
    )


def _start(folder: Path, spec: Path, env: dict[str, str], *flags: str, log_name: str = "driver.log"):
    log = folder / log_name
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        return start_orchestrate(["sweep", str(spec), *flags], cwd=folder, log=log), log


def _processes(driver) -> dict[int, int]:
    return descendants(driver.pid)


def _assert_interrupted(folder: Path, name: str, epochs: int = EPOCHS) -> tuple:
    """The records an interruption leaves: parent KILLED/interrupted, no run RUNNING, no test
    metric anywhere, every FINISHED trial trained all its epochs, cut trials KILLED."""
    parents, children = runs_of(folder, name)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "KILLED"
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_INTERRUPTED
    assert rs.TAG_BEST_RUN not in parent.data.tags
    for run in parents + children:
        assert run.info.status in ("FINISHED", "KILLED"), (run.info.run_name, run.info.status)
        assert not any(k.startswith(rs.METRIC_TEST_ACCURACY) for k in run.data.metrics), run.info.run_name
        assert rs.TAG_SELECTED not in run.data.tags
    for child in children:
        if child.info.status == "FINISHED":
            assert child.data.metrics[rs.METRIC_EPOCHS_TRAINED] == epochs
        else:
            assert rs.METRIC_BEST_DEV_ACCURACY not in child.data.metrics
    return parent, children


def _interrupt(driver, log: Path, signum: int, group: bool) -> int:
    processes = _processes(driver)
    (os.killpg if group else os.kill)(driver.pid, signum)
    try:
        code = driver.wait(timeout=180)
    finally:
        kill_session(driver)
    assert_processes_gone(processes)
    output = log.read_text()
    assert "Traceback" not in output and "Tuner.restore" not in output, output
    return code


def _assert_resume_completes(folder: Path, spec: Path, name: str, planned: int, epochs: int = EPOCHS,
                             from_journal: bool = False, says: str = ""):
    resumed = run_orchestrate(["sweep", str(spec), "--resume"], cwd=folder)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # Tune restores an intact experiment state; the journal stands in only for a torn one.
    assert ("continuing from the sweep's journal" in resumed.stderr) == from_journal, resumed.stderr
    assert says in resumed.stderr and "Aborted!" not in resumed.stderr, resumed.stderr
    parents, children = runs_of(folder, name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert len(children) == planned  # exactly the planned trials, none created twice
    assert len({c.data.tags[rs.TAG_TRIAL_ID] for c in children}) == planned
    client = client_for(folder)
    for child in children:
        assert child.info.status == "FINISHED"
        steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, rs.METRIC_DEV_ACCURACY))
        assert steps == list(range(1, epochs + 1))  # no epoch logged twice
    tested = [c for c in children if rs.METRIC_TEST_ACCURACY in c.data.metrics]
    assert len(tested) == 1  # one configuration, one seed: test evaluated once
    history = client.get_metric_history(tested[0].info.run_id, rs.METRIC_TEST_ACCURACY)
    assert len(history) == 1
    assert parents[0].data.tags[rs.TAG_BEST_RUN] == tested[0].info.run_id
    return parents[0], children


def _until_a_trial_finished(folder: Path, spec: Path, name: str):
    """The sweep's driver started, once its first trial has finished (driver, log)."""
    driver, log = _start(folder, spec, SHORT_EPOCH_DELAY)
    try:
        wait_while_driving(trials_finished(folder, name, log, 1), driver, log, "a first trial's end")
    except BaseException:
        kill_session(driver)
        raise
    return driver, log


def test_sigterm_with_pending_trials_then_sweeps_results_and_resume(tmp_path):
    """No concurrency limit and a time budget (as paper specs have none): SIGTERM, what `timeout`
    and SLURM send, while the first trial runs and the others wait."""
    spec = _spec(tmp_path, "term", {"time_budget_s": 3600})
    driver, log = _start(tmp_path, spec, EPOCH_DELAY)
    wait_while_driving(trial_running(tmp_path, "term", log), driver, log, "a running trial")
    assert _interrupt(driver, log, signal.SIGTERM, group=False) == EXIT_INTERRUPTED
    assert "continue with: orchestrate sweep" in log.read_text() and "--resume" in log.read_text()
    parent, children = _assert_interrupted(tmp_path, "term")
    assert parent.data.tags[rs.TAG_PLANNED_TRIALS] == "4"
    done = sum(c.info.status == "FINISHED" for c in children)
    assert f"interrupted: {done}/4 trials done" in log.read_text()

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    shown = orchestrate("sweeps", "term", "--tracking-uri", uri)
    assert shown.returncode == 0, shown.output
    row = shown.stdout.splitlines()[1].split()
    assert row[:4] == ["term", parent.info.run_id, "interrupted", f"{done}/0/4"]
    if done:  # the results table needs a trial that ended
        out = tmp_path / "table.parquet"
        paper = ["results", "term", "--tracking-uri", uri, "--out", str(out), "--paper", "parikh2016"]
        refused = orchestrate(*paper)
        assert refused.returncode == 2 and "--include-incomplete" in refused.output
        assert not out.exists()
        marked = orchestrate(*paper, "--include-incomplete")
        assert marked.returncode == 0, marked.output
        assert f"interrupted, {done}/4 trials done" in marked.output and out.exists()

    _assert_resume_completes(tmp_path, spec, "term", planned=4)
    shown = orchestrate("sweeps", "term", "--tracking-uri", uri)
    assert shown.stdout.splitlines()[1].split()[2:4] == ["completed", "4/0/4"]


def test_sigterm_to_the_whole_process_group_ends_the_sweep_as_sigint_does(tmp_path):
    """Issue 27: `timeout`, SLURM and Kubernetes send SIGTERM to every process of the job; Ray's
    local processes died of it before the driver recorded anything (exit 1, parent left
    RUNNING). They start with SIGTERM blocked, so the driver stops them itself."""
    import time

    spec = _spec(tmp_path, "group-term", {"max_concurrent_trials": 1})
    driver, log = _start(tmp_path, spec, EPOCH_DELAY)
    wait_while_driving(trial_running(tmp_path, "group-term", log), driver, log, "a running trial")
    sent = time.monotonic()
    assert _interrupt(driver, log, signal.SIGTERM, group=True) == EXIT_INTERRUPTED
    assert time.monotonic() - sent < 60
    assert "SIGTERM: stopping the sweep" in log.read_text()
    parent, children = _assert_interrupted(tmp_path, "group-term")
    assert any(c.info.status == "KILLED" for c in children)
    _assert_resume_completes(tmp_path, spec, "group-term", planned=4)


def test_ctrl_c_during_the_last_trial_with_a_concurrency_limit(tmp_path):
    spec = _spec(tmp_path, "last", {"max_concurrent_trials": 1,
                                    "space": {"lr": {"grid": [0.001, 0.01]}, "dropout": {"grid": [0.0]}}})
    driver, log = _start(tmp_path, spec, EPOCH_DELAY)
    wait_while_driving(trials_finished(tmp_path, "last", log, 1), driver, log, "the first trial's end")
    wait_while_driving(trial_running(tmp_path, "last", log, epochs_logged=1), driver, log, "the last trial's epoch 1")
    assert _interrupt(driver, log, signal.SIGINT, group=True) == EXIT_INTERRUPTED  # Ctrl-C
    _, children = _assert_interrupted(tmp_path, "last")
    assert "interrupted: 1/2 trials done" in log.read_text()
    assert sorted(c.info.status for c in children) == ["FINISHED", "KILLED"]
    _assert_resume_completes(tmp_path, spec, "last", planned=2)


def test_ctrl_c_then_resume_restores_the_samplers_study_and_this_driver_tracks_the_trials(tmp_path):
    """A sampler's sweep on a finite space, Ctrl-C once a trial has finished: Tune restores the
    experiment (not the journal), with the sampler's study as it was saved and the interrupted
    driver's callbacks, which tell this driver's listeners: every resumed trial is tracked on its
    run, and the four configurations each train once. `-v` on the resume does not bring Tune's
    trial tables: those keep the verbosity the sweep started with (docs/sweeps.md)."""
    name, planned = "restored-sampler", 4
    spec = write_spec(tmp_path, {"name": name, "data": {"toy": {"size": 300}}, "training": {"epochs": EPOCHS}},
                      replace_search={"sampler": "tpe", "num_samples": planned, "seeds": [1], "resources": {"cpu": 1},
                                      "space": {"lr": {"choice": [0.001, 0.01]}, "dropout": {"choice": [0.0, 0.1]}},
                                      "max_concurrent_trials": 1})
    driver, log = _start(tmp_path, spec, EPOCH_DELAY)
    wait_while_driving(trials_finished(tmp_path, name, log, 1), driver, log, "the first trial's end")
    assert _interrupt(driver, log, signal.SIGINT, group=True) == EXIT_INTERRUPTED
    resumed = run_orchestrate(["sweep", str(spec), "--resume", "-v"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "continuing from the sweep's journal" not in resumed.stderr, resumed.stderr
    assert "Trial status" not in resumed.stdout + resumed.stderr
    parents, children = runs_of(tmp_path, name)
    assert parents[0].data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert len(children) == planned and all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.metrics[rs.METRIC_EPOCHS_TRAINED] == EPOCHS for c in children)
    assert len({(c.data.params["lr"], c.data.params["dropout"]) for c in children}) == planned


def test_second_ctrl_c_aborts_at_once_leaving_the_same_resumable_state(tmp_path):
    # Two trials, both running when the signals land: the resume trains two, not four.
    spec = _spec(tmp_path, "twice", {"space": {"lr": {"grid": [0.001, 0.01]}, "dropout": {"grid": [0.0]}}})
    driver, log = _start(tmp_path, spec, EPOCH_DELAY)
    wait_while_driving(trial_running(tmp_path, "twice", log), driver, log, "a running trial")
    os.killpg(driver.pid, signal.SIGINT)
    wait_while_driving(lambda: "send it again to abort" in log.read_text(), driver, log, "the first signal's notice")
    assert _interrupt(driver, log, signal.SIGINT, group=True) == EXIT_INTERRUPTED
    assert "SIGINT again: aborting at once" in log.read_text()
    _assert_interrupted(tmp_path, "twice")
    _assert_resume_completes(tmp_path, spec, "twice", planned=2)


def test_sigkill_then_resume_then_ctrl_c_with_trials_pending_then_resume_runs_each_trial_once(tmp_path):
    """One sweep, one trial at a time, cut twice: the driver alone SIGKILLed once a trial has
    finished, then its resume interrupted by Ctrl-C once another has, with trials still pending;
    the second resume finishes it. (One sweep for both interruptions: each sweep costs drivers'
    starts.)"""
    name, planned = "killed", 5
    spec = write_spec(
        tmp_path,
        {"name": name, "training": {"epochs": FOUR_EPOCHS}, "search": {
            "space": {"lr": {"grid": [0.001, 0.002, 0.003, 0.005, 0.01]}, "dropout": {"grid": [0.0]}},
            "max_concurrent_trials": 1}},
    )
    driver, log = _until_a_trial_finished(tmp_path, spec, name)
    started = _processes(driver)  # gcs_server, raylet, agents, trial workers
    assert len(started) >= 3
    os.kill(driver.pid, signal.SIGKILL)  # the driver alone: what it started must go with it
    driver.wait(timeout=30)
    try:  # what outlived the killed driver
        assert_processes_gone(started)
    finally:
        kill_session(driver)
    parents, _ = runs_of(tmp_path, name)
    assert len(parents) == 1 and parents[0].info.status == "RUNNING"  # as the driver left it
    # ... but its dead driver's lease shows it as interrupted, at once.
    (record,) = load_sweeps(client_for(tmp_path), parents[0].info.experiment_id, name)
    assert record.state == rs.SWEEP_INTERRUPTED and record.planned == planned
    printed = int(re.findall(r"trials: (\d+) done", log.read_text())[-1])  # the terminal's last word

    # The next sweep command first uploads what the killed driver journaled: the store then holds
    # every trial the terminal called done (the uploader's last interval was lost with it).
    refused = run_orchestrate(["sweep", str(spec)], cwd=tmp_path, timeout=120)
    assert refused.returncode == 2 and "(interrupted); pass --resume" in refused.stderr
    _, children = runs_of(tmp_path, name)
    finished_before = {c.data.tags[rs.TAG_TRIAL_ID]: c.info.run_id for c in children
                       if c.info.status == "FINISHED"}
    assert 1 <= printed <= len(finished_before) < planned

    # Resumed, then Ctrl-C once one more trial has finished: the next one runs, the last waits.
    driver, log = _start(tmp_path, spec, SHORT_EPOCH_DELAY, "--resume", log_name="resumed.log")
    try:
        wait_while_driving(trials_finished(tmp_path, name, log, len(finished_before) + 1), driver, log,
                           "a trial's end after the resume")
    except BaseException:
        kill_session(driver)
        raise
    assert _interrupt(driver, log, signal.SIGINT, group=True) == EXIT_INTERRUPTED  # Ctrl-C
    assert "--resume" in log.read_text()
    _assert_interrupted(tmp_path, name, epochs=FOUR_EPOCHS)

    # The same parent, each trial once, a trial finished before either cut not re-run: each
    # epoch logged exactly once, on the run it had.
    resumed, children = _assert_resume_completes(tmp_path, spec, name, planned=planned, epochs=FOUR_EPOCHS)
    assert resumed.info.run_id == parents[0].info.run_id
    by_trial = {c.data.tags[rs.TAG_TRIAL_ID]: c.info.run_id for c in children}
    assert all(by_trial[trial] == run for trial, run in finished_before.items())


def test_failed_data_check_writes_nothing_then_ctrl_c_during_the_test_evaluation_records_no_test_metric(
        tmp_path):
    """A sweep whose data check fails writes nothing; the next attempt needs no --resume/--new
    and runs. A Ctrl-C while it evaluates the selected configuration on test leaves no test
    metric; its resume selects and tests once, and `orchestrate best` gives a config that
    `orchestrate train` reproduces. (One sweep for both claims: each costs a driver's start.)"""
    data = tmp_path / "corpus"
    spec = write_spec(
        tmp_path,
        {"name": "files", "training": {"epochs": 1},
         "data": {"corpus": "jsonl", "data_dir": str(data),
                  "files": {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"}},
         "search": {"space": {"lr": {"grid": [0.003]}, "dropout": {"grid": [0.0]}}}},
        new_store=True,
    )
    raw = yaml.safe_load(spec.read_text())
    del raw["data"]["toy"]  # the base spec's toy options do not apply to jsonl
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    failed = run_orchestrate(["sweep", str(spec)], cwd=tmp_path, timeout=120)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "train.jsonl" in failed.stderr and "Traceback" not in failed.stderr
    assert not (tmp_path / "mlruns.db").exists() and not (tmp_path / "ray_results").exists()

    data.mkdir()
    labels = ("entailment", "neutral", "contradiction")
    for split, size in (("train", 60), ("dev", 15), ("test", 15)):
        rows = [{"premise": f"a man plays {i % 7}", "hypothesis": f"someone {labels[i % 3]} {i % 5}",
                 "label": labels[i % 3]} for i in range(size)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # No --resume/--new needed: the failed attempt left no sweep behind.
    driver, log = _start(tmp_path, spec, {"NLI_TEST_EVALUATION_DELAY_S": "30"})
    wait_while_driving(lambda: "selecting on dev" in log.read_text(), driver, log, "the selection")
    assert _interrupt(driver, log, signal.SIGINT, group=True) == EXIT_INTERRUPTED
    _, children = _assert_interrupted(tmp_path, "files", epochs=1)
    assert [c.info.status for c in children] == ["FINISHED"]
    assert "interrupted: 1/1 trials done" in log.read_text()
    # Issue 44: the seed's test accuracy, computed before the signal came, is not shown for a
    # selection that did not complete (and recorded nothing).
    assert not re.search(r"selected on dev .* test \d", log.read_text()), log.read_text()
    _, children = _assert_resume_completes(tmp_path, spec, "files", planned=1, epochs=1)  # selects and tests, once

    # The selected configuration as a training config that `orchestrate train` runs as is:
    # training is deterministic, so it reproduces the selected trial's dev accuracy.
    best = tmp_path / "best.yaml"
    written = orchestrate("best", "files", "--tracking-uri", f"sqlite:///{tmp_path / 'mlruns.db'}",
                    "--out", str(best))
    assert written.returncode == 0, written.output
    trained = run_orchestrate(["train", str(best)], cwd=tmp_path)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    dev = children[0].data.metrics[rs.METRIC_BEST_DEV_ACCURACY]
    assert f"best dev accuracy {dev:.2%}" in trained.stdout + trained.stderr


def _tear_tune_state(folder: Path, name: str) -> list[str]:
    """What a driver killed while Ray saves leaves (issue 27): Tune's experiment files cut to
    0 bytes (tuner.pkl, the searcher's state) or to half (the experiment state). Returns them."""
    (experiment,) = [p for p in (folder / "ray_results").iterdir() if p.name.startswith(f"{name}-")]
    torn = []
    for pattern, keep in (("tuner.pkl", 0), ("basic-variant-state-*.json", 0), ("searcher-state-*.pkl", 0),
                          ("experiment_state-*.json", 0.5)):
        for path in experiment.glob(pattern):
            path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])
            torn.append(path.name)
    return torn


def _finished(count: int) -> str:
    """How the resume from the journal counts the trials it keeps."""
    return f"{count} finished trial{'s' * (count != 1)}"


def _epoch_steps(folder: Path, children: list) -> dict[str, list[int]]:
    client = client_for(folder)
    return {c.data.tags[rs.TAG_TRIAL_ID]: [m.step for m in client.get_metric_history(c.info.run_id, rs.METRIC_DEV_ACCURACY)]
            for c in children}


def _ctrl_c_after_a_trial(folder: Path, spec: Path, name: str) -> None:
    driver, log = _until_a_trial_finished(folder, spec, name)
    assert _interrupt(driver, log, signal.SIGINT, group=True) == EXIT_INTERRUPTED


def test_torn_tune_state_resumes_a_grid_from_the_journal_each_trial_once(tmp_path):
    """A grid sweep's driver SIGKILLed once a trial has finished, its Tune files then torn: the
    resume goes on from the sweep's journal (one line says so, never `Aborted!`), trains only the
    points not finished, the cut trial on its own run; Ctrl-C during it, then a second resume
    (Tune's files now set aside) completes: the planned runs, each FINISHED once, test once."""
    name, planned = "torn", 4
    spec = write_spec(tmp_path, {"name": name, "training": {"epochs": EPOCHS}, "search": {
        "space": {"lr": {"grid": [0.001, 0.002, 0.003, 0.005]}, "dropout": {"grid": [0.0]}},
        "max_concurrent_trials": 1}})
    driver, _ = _until_a_trial_finished(tmp_path, spec, name)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    kill_session(driver)
    torn = _tear_tune_state(tmp_path, name)
    assert "tuner.pkl" in torn and any(n.startswith("experiment_state-") for n in torn)

    driver, log = _start(tmp_path, spec, SHORT_EPOCH_DELAY, "--resume", log_name="resumed.log")
    try:
        wait_while_driving(lambda: "continuing from the sweep's journal" in log.read_text(), driver, log,
                           "the resume from the journal")
        _, children = runs_of(tmp_path, name)
        finished_before = _epoch_steps(tmp_path, [c for c in children if c.info.status == "FINISHED"])
        assert 1 <= len(finished_before) < planned
        wait_while_driving(trials_finished(tmp_path, name, log, len(finished_before) + 1), driver, log,
                           "a trial's end after the resume")
    except BaseException:
        kill_session(driver)
        raise
    assert _interrupt(driver, log, signal.SIGINT, group=True) == EXIT_INTERRUPTED
    output = log.read_text()
    assert "Aborted!" not in output and "tuner.pkl is torn (0 bytes; " in output, output
    assert re.search(rf"{_finished(len(finished_before))} kept, {planned - len(finished_before)} "
                     rf"of {planned} planned trials to run", output), output
    _assert_interrupted(tmp_path, name)

    _, children = _assert_resume_completes(tmp_path, spec, name, planned=planned, from_journal=True)
    # The trials finished before the tear kept their runs and trained no epoch again.
    assert {t: s for t, s in _epoch_steps(tmp_path, children).items() if t in finished_before} == finished_before
    lrs = sorted(float(c.data.params["lr"]) for c in children)
    assert lrs == [0.001, 0.002, 0.003, 0.005]  # every planned point, none twice


@pytest.mark.parametrize("sampler, objectives", [
    ("random", None),
    # a multi-objective study is told each finished configuration's value of every objective
    ("tpe", [{"dev_accuracy": "max"}, {"theta_m": "min"}]),
], ids=["one-metric", "multi-objective"])
def test_torn_tune_state_resumes_a_sampler_from_the_journal_each_configuration_once(tmp_path, sampler, objectives):
    """A sampler's driver SIGKILLed once a trial has finished while another runs, its Tune files
    then torn: --resume goes on from the sweep's journal: the finished trials are kept (no epoch
    trained again) and told to the sampler, the cut trial's configuration runs again first on its
    own run, the sampler draws the rest: the planned runs, each configuration once, test once."""
    name, planned = "torn-sampler", 3
    spec = write_spec(tmp_path, {"name": name, "training": {"epochs": EPOCHS}}, replace_search={
        "sampler": sampler, "num_samples": planned, "space": {"lr": {"uniform": [0.001, 0.01]}}, "seeds": [1],
        "max_concurrent_trials": 1, "resources": {"cpu": 1}, **({"objectives": objectives} if objectives else {})})
    driver, log = _start(tmp_path, spec, EPOCH_DELAY)  # the next trial still runs when the first is seen ended
    try:
        finished, running = trials_finished(tmp_path, name, log, 1), trial_running(tmp_path, name, log)
        wait_while_driving(lambda: finished() and running(), driver, log, "a trial's end and the next one's start")
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        kill_session(driver)
    torn = _tear_tune_state(tmp_path, name)
    assert "tuner.pkl" in torn and any(n.startswith("searcher-state-") for n in torn), torn
    parents, _ = runs_of(tmp_path, name)
    journal = recorded_trials(journal_file(str(tmp_path / "ray_results"), parents[0].info.run_id))
    done = {t for t, trial in journal.items() if trial.status == "FINISHED"}
    cut = {t: trial.params["lr"] for t, trial in journal.items() if trial.status is None}
    assert done and cut and len(journal) < planned, journal  # the driver died with a trial running
    finished_before = _epoch_steps(tmp_path, [c for c in runs_of(tmp_path, name)[1] if c.data.tags[rs.TAG_TRIAL_ID] in done])

    says = (f"{_finished(len(done))} kept, {planned - len(done)} of {planned} planned trials to run; the "
            f"{sampler} sampler is told the {len(done)} finished configuration{'s' * (len(done) != 1)}, "
            "runs the unfinished ones' "
            f"{len(cut)} trials first")
    parent, children = _assert_resume_completes(tmp_path, spec, name, planned=planned, from_journal=True, says=says)
    by_trial = {c.data.tags[rs.TAG_TRIAL_ID]: c for c in children}
    assert {t: s for t, s in _epoch_steps(tmp_path, children).items() if t in done} == finished_before
    assert {t: float(by_trial[t].data.params["lr"]) for t in cut} == cut  # on its own run, same configuration
    assert len({c.data.params["lr"] for c in children}) == planned  # no configuration trained twice
    if objectives:
        assert json.loads(parent.data.tags[rs.TAG_OBJECTIVES]) == [["dev_accuracy", "max"], ["theta_m", "min"]]


def test_deleted_tune_state_resumes_grid_points_times_seeds_from_the_journal(tmp_path):
    """Ctrl-C once a trial has finished, then Tune's experiment files deleted (the trial folders
    stay): --resume trains the remaining points x seeds once each, the finished trial keeps its
    run and epochs, and the selected configuration's two seeds are tested once each."""
    name, planned = "deleted", 4
    spec = write_spec(tmp_path, {"name": name, "training": {"epochs": EPOCHS}, "search": {
        "space": {"lr": {"grid": [0.001, 0.003]}, "dropout": {"grid": [0.0]}}, "seeds": [1, 2],
        "max_concurrent_trials": 1}})
    _ctrl_c_after_a_trial(tmp_path, spec, name)
    _, children = _assert_interrupted(tmp_path, name)
    finished_before = _epoch_steps(tmp_path, [c for c in children if c.info.status == "FINISHED"])
    (experiment,) = (tmp_path / "ray_results").glob(f"{name}-*")
    for pattern in ("tuner.pkl", "experiment_state-*.json", "basic-variant-state-*.json"):
        for path in experiment.glob(pattern):
            path.unlink()

    resumed = run_orchestrate(["sweep", str(spec), "--resume"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "Aborted!" not in resumed.stderr and "tuner.pkl is missing" in resumed.stderr
    assert (f"{_finished(len(finished_before))} kept, {planned - len(finished_before)} of {planned} "
            "planned trials to run") in resumed.stderr
    parents, children = runs_of(tmp_path, name)
    assert parents[0].data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert len(children) == planned and all(c.info.status == "FINISHED" for c in children)
    assert sorted((float(c.data.params["lr"]), int(c.data.params["seed"])) for c in children) == [
        (0.001, 1), (0.001, 2), (0.003, 1), (0.003, 2)]
    steps = _epoch_steps(tmp_path, children)
    assert all(s == list(range(1, EPOCHS + 1)) for s in steps.values())  # no epoch twice
    assert {t: s for t, s in steps.items() if t in finished_before} == finished_before
    tested = [c for c in children if rs.METRIC_TEST_ACCURACY in c.data.metrics]
    assert len(tested) == 2 and len({c.data.params["lr"] for c in tested}) == 1  # one config, its seeds
    client = client_for(tmp_path)
    assert all(len(client.get_metric_history(c.info.run_id, rs.METRIC_TEST_ACCURACY)) == 1 for c in tested)
