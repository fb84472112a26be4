"""The tracking journal (orchestrator/journal/operations.py) and its one uploader (uploader.JournalUploader):
records survive a killed writer whole or not at all; an uploader killed mid-stream and run again
loses and doubles nothing; trial params reach MLflow typed (tag nli.params) as well as flat."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow import MlflowClient

from orchestrator.journal.operations import (
    Journal,
    JournalError,
    Record,
    read_records,
    trial_groups,
)
from orchestrator.journal.recorder import SweepLog, SweepRecorder
from orchestrator.tracking.tracker import Tracker, TrackingUnavailable
from orchestrator.tracking.uploader import JournalUploader, create_parent
from results import run_schema as rs
from results.run_reader import trial_params

pytestmark = pytest.mark.unit

TRIALS, EPOCHS = 24, 6
RECORDS = TRIALS * (EPOCHS + 2)  # start, one record per epoch, finish


def record_sweep(journal: Journal, trials: int = TRIALS, epochs: int = EPOCHS) -> None:
    recorder = SweepRecorder(journal, base_params={"model": "decomposable", "hidden_size": 50,
                                                   "two_way": False}, run_tags={})
    for trial in range(trials):
        trial_id = f"t{trial:03d}"
        recorder.trial_started(trial_id, {"lr": 0.001 * (trial + 1), "seed": 1})
        for epoch in range(1, epochs + 1):
            recorder.trial_result(trial_id, {rs.METRIC_EPOCHS_TRAINED: epoch, "dev_accuracy": epoch / 100, "train_loss": 1 / epoch})
        recorder.trial_completed(trial_id, {"best_dev_accuracy": epochs / 100, rs.METRIC_EPOCHS_TRAINED: epochs,
                                            rs.RESULT_TRIAL_FINISHED: 1}, None)


@pytest.fixture
def sweep(tmp_path):
    """A store with a sweep's parent run, and that sweep's journal (not uploaded)."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    store = Tracker(uri)
    experiment_id, parent = create_parent(store, "journal", "sweep-journal", {})
    journal = Journal(tmp_path / "tracking-journal.jsonl", experiment_id, parent)
    yield uri, store, experiment_id, parent, journal
    journal.close()


def test_a_torn_last_line_is_no_record_and_is_cut_when_the_journal_reopens(sweep):
    _, _, experiment_id, parent, journal = sweep
    record_sweep(journal, trials=2, epochs=3)
    journal.close()
    whole = journal.path.read_bytes()
    with open(journal.path, "ab") as handle:  # a driver killed in the middle of a write
        handle.write(b'{"seq": 11, "kind": "metr')
    assert len(list(read_records(journal.path))) == 10

    reopened = Journal(journal.path, experiment_id, parent)
    assert journal.path.read_bytes() == whole
    assert reopened.appended == 10
    assert {t: p.last_epoch for t, p in reopened.trials.items()} == {"t000": 3, "t001": 3}
    reopened.append("tags", "t001", {"tags": {"x": "1"}})
    reopened.close()
    last = json.loads(journal.path.read_text().splitlines()[-1])
    assert last["seq"] == 11 and last["kind"] == "tags"


def test_a_bad_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"kind": "start"}\n')
    with pytest.raises(JournalError, match=rf"{path}:1: not a journal record"):
        list(read_records(path))


def test_params_reach_mlflow_typed_and_flat(sweep):
    _, store, experiment_id, parent, journal = sweep
    record_sweep(journal, trials=1, epochs=1)
    JournalUploader(store, journal.path).upload_available()
    [run] = store.trial_runs(experiment_id, parent)
    assert run.data.params["lr"] == "0.001" and run.data.params["const.two_way"] == "False"
    typed = trial_params(run)
    assert typed["lr"] == 0.001 and typed["two_way"] is False and typed["hidden_size"] == 50
    # A run written before the typed tag: the flat strings, prefix stripped.
    legacy = store.client.create_run(experiment_id, tags={rs.TAG_ROLE: rs.ROLE_TRIAL})
    store.client.log_param(legacy.info.run_id, "const.hidden_size", "50")
    assert trial_params(store.client.get_run(legacy.info.run_id)) == {"hidden_size": "50"}


def test_parent_metrics_go_up_at_their_step_and_a_record_without_one_at_step_0(sweep):
    """An extension's second test evaluation (orchestrator/sweep/extend.py) is the parent's summary
    at step 1; a record that names no step (every journal before it) stays at step 0."""
    _, store, _, parent, journal = sweep
    log = SweepLog(journal)
    log.add(metrics={rs.METRIC_SWEEP_TEST_ACCURACY: 0.5})
    log.add(metrics={rs.METRIC_SWEEP_TEST_ACCURACY: 0.75}, step=1)
    first, second = (json.loads(line)["data"] for line in journal.path.read_text().splitlines())
    assert "step" not in first and second["step"] == 1
    JournalUploader(store, journal.path).upload_available()
    history = store.client.get_metric_history(parent, rs.METRIC_SWEEP_TEST_ACCURACY)
    assert sorted((m.step, m.value) for m in history) == [(0, 0.5), (1, 0.75)]
    assert store.client.get_run(parent).data.metrics[rs.METRIC_SWEEP_TEST_ACCURACY] == 0.75


def test_a_run_created_by_an_uploader_that_died_before_its_params_is_repaired(sweep):
    _, store, experiment_id, parent, journal = sweep
    record_sweep(journal, trials=1, epochs=2)
    # What an uploader killed between create_run and logging the params leaves behind.
    store.client.create_run(experiment_id, tags={
        rs.TAG_ROLE: rs.ROLE_TRIAL, rs.TAG_PARENT_RUN: parent, rs.TAG_TRIAL_ID: "t000"})
    assert JournalUploader(store, journal.path).upload_available() == 4
    [run] = store.trial_runs(experiment_id, parent)
    assert run.data.params["lr"] == "0.001" and run.info.status == "FINISHED"


def test_an_uploader_killed_mid_stream_loses_and_doubles_nothing(sweep):
    """`orchestrate sync` (the uploader) is SIGKILLed while it uploads a 96-trial journal, then
    run again, twice: every trial has exactly one run, FINISHED, with every epoch once."""
    # 96 trials: batched, 24 uploaded in under a second on an idle machine, before the cursor's
    # first write (every 0.2 s) could be seen, so the kill came after the end.
    trials = 96
    records = trials * (EPOCHS + 2)
    uri, store, experiment_id, parent, journal = sweep
    record_sweep(journal, trials=trials)
    journal.close()
    command = [sys.executable, "-m", "orchestrator.cli.orchestrate", "sync", str(journal.path), "--tracking-uri", uri]
    cursor = journal.path.with_name(journal.path.name + ".uploaded")
    sync = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    uploaded = 0
    while uploaded == 0 and sync.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        if cursor.exists():
            uploaded = json.loads(cursor.read_text())["records"]
    os.killpg(sync.pid, signal.SIGKILL)
    sync.wait()
    assert 0 < uploaded < records, f"not killed mid-stream ({uploaded} of {records} uploaded)"
    client = MlflowClient(uri)
    partial = store.trial_runs(experiment_id, parent)
    assert 0 < len(partial) and sum(r.info.status == "FINISHED" for r in partial) < trials

    for expected in (r"uploaded [1-9]\d* operations", r"uploaded 0 operations"):
        rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
        assert re.search(expected, rerun.stdout), rerun.stdout

    runs = store.trial_runs(experiment_id, parent)
    assert sorted(r.data.tags[rs.TAG_TRIAL_ID] for r in runs) == [f"t{t:03d}" for t in range(trials)]
    for run in runs:
        assert run.info.status == "FINISHED", run.data.tags[rs.TAG_TRIAL_ID]
        assert run.data.params["lr"] and json.loads(run.data.tags[rs.TAG_PARAMS_JSON])["seed"] == 1
        for key in (rs.METRIC_DEV_ACCURACY, rs.METRIC_TRAIN_LOSS):
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert sorted(steps) == list(range(1, EPOCHS + 1)), (run.data.tags[rs.TAG_TRIAL_ID], key, steps)
        assert len(client.get_metric_history(run.info.run_id, rs.METRIC_BEST_DEV_ACCURACY)) == 1


def test_the_uploader_in_a_sweep_tails_the_journal_and_reports_how_far_behind_it_is(sweep):
    _, store, experiment_id, parent, journal = sweep
    uploader = JournalUploader(store, journal.path)
    uploader.start(journal)
    record_sweep(journal, trials=3, epochs=2)
    uploader.drain()
    assert uploader.behind() == 0 and uploader.uploaded == journal.appended == 12
    uploader.stop()
    assert len(store.trial_runs(experiment_id, parent)) == 3
    assert Path(str(journal.path) + ".uploaded").exists()


def test_a_journal_line_that_is_no_record_stops_the_sweeps_wait_with_its_place(sweep):
    _, store, _, _, journal = sweep
    uploader = JournalUploader(store, journal.path, max_wait_s=0.5)
    uploader.start(journal)
    record_sweep(journal, trials=1, epochs=1)  # lines 1-3
    with open(journal.path, "a") as handle:  # e.g. a second writer that broke the format
        handle.write("garbage\n")
    journal.append("tags", "t000", {"tags": {}})
    with pytest.raises(TrackingUnavailable, match=rf"{journal.path}:4: not a JSON line"):
        uploader.drain()
    uploader.stop()


class CountingClient:
    """An MlflowClient that counts its calls by method and keeps the arguments of log_batch;
    ``fail_log_batch`` makes that call (1-based) raise once, as a store that went away would."""

    def __init__(self, client: MlflowClient, fail_log_batch: int | None = None):
        self.client, self.fail_log_batch = client, fail_log_batch
        self.calls: Counter[str] = Counter()
        self.batches: list[dict] = []

    def __getattr__(self, name: str):
        method = getattr(self.client, name)

        def counted(*args, **kwargs):
            self.calls[name] += 1
            if name == "log_batch":
                if self.calls[name] == self.fail_log_batch:
                    raise ConnectionError("the store went away")
                self.batches.append(kwargs)
            return method(*args, **kwargs)

        return counted


def counting(store: Tracker, **options) -> CountingClient:
    store.client = CountingClient(store.client, **options)
    return store.client


def epoch_steps(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    return {key: sorted(m.step for m in client.get_metric_history(run_id, key))
            for key in (rs.METRIC_DEV_ACCURACY, rs.METRIC_TRAIN_LOSS)}


def test_records_are_grouped_by_trial_in_journal_order():
    kinds = [("a", "start"), ("b", "start"), ("a", "metrics"), ("b", "metrics"), ("a", "metrics"),
             ("a", "finish"), ("a", "artifacts"), ("b", "tags"), ("b", "metrics"), ("a", "start"),
             ("a", "metrics")]
    records = [Record(kind, trial, {}, 0, "e", "p") for trial, kind in kinds]
    assert trial_groups(records) == [[0, 2, 4, 5], [1, 3], [6], [7], [8], [9, 10]]


def test_many_epochs_of_a_trial_go_up_in_few_requests_each_epoch_whole(sweep):
    """600 epochs of one trial (1,200 metrics): one search, the run, two log_batch calls within
    MLflow's limits (an epoch never split between them), its status; every epoch once."""
    uri, store, experiment_id, parent, journal = sweep
    record_sweep(journal, trials=1, epochs=600)
    client = counting(store)
    assert JournalUploader(store, journal.path).upload_available() == 602
    assert client.calls == {"search_runs": 1, "create_run": 1, "log_batch": 2, "set_terminated": 1}
    for batch in client.batches:
        assert len(batch["metrics"]) <= 1000 and len(batch["params"]) <= 100 and len(batch["tags"]) <= 100
        assert len(batch["metrics"]) + len(batch["params"]) + len(batch["tags"]) <= 1000
    calls_of_step = {}
    for index, batch in enumerate(client.batches):
        for metric in batch["metrics"]:
            calls_of_step.setdefault(metric.step, set()).add(index)
    assert all(len(calls) == 1 for calls in calls_of_step.values())
    [run] = store.trial_runs(experiment_id, parent)
    assert run.info.status == "FINISHED"
    assert epoch_steps(MlflowClient(uri), run.info.run_id) == {
        rs.METRIC_DEV_ACCURACY: list(range(1, 601)), rs.METRIC_TRAIN_LOSS: list(range(1, 601))}


def test_the_store_is_searched_once_per_sweep_not_per_trial(sweep):
    """A second upload of the whole journal (no cursor) reads what the store holds with one search
    and, finding every record on it, sends nothing."""
    _, store, experiment_id, parent, journal = sweep
    record_sweep(journal)
    first = counting(store)
    JournalUploader(store, journal.path).upload_available()
    assert first.calls["search_runs"] == 1 and first.calls["create_run"] == TRIALS
    journal.path.with_name(journal.path.name + ".uploaded").unlink()
    again = counting(store)
    assert JournalUploader(store, journal.path).upload_available() == RECORDS
    assert again.calls == {"search_runs": 1}
    assert len(store.trial_runs(experiment_id, parent)) == TRIALS


def test_a_batch_that_fails_half_way_is_finished_by_the_next_uploader(sweep):
    """The store goes away after the first of a trial's two log_batch calls: the cursor stays
    before the trial, and the next uploader (another process, knowing only the store) sends the
    epochs the run lacks, none twice."""
    uri, store, experiment_id, parent, journal = sweep
    record_sweep(journal, trials=1, epochs=600)
    counting(store, fail_log_batch=2)
    with pytest.raises(ConnectionError):
        JournalUploader(store, journal.path).upload_available()
    [run] = store.trial_runs(experiment_id, parent)
    on_run = epoch_steps(MlflowClient(uri), run.info.run_id)[rs.METRIC_DEV_ACCURACY]
    assert on_run == list(range(1, len(on_run) + 1)) and 0 < len(on_run) < 600
    assert not journal.path.with_name(journal.path.name + ".uploaded").exists()

    fresh = Tracker(uri)
    resumed = counting(fresh)
    assert JournalUploader(fresh, journal.path).upload_available() == 602
    assert resumed.calls == {"search_runs": 1, "log_batch": 1, "set_terminated": 1}
    assert epoch_steps(MlflowClient(uri), run.info.run_id) == {
        rs.METRIC_DEV_ACCURACY: list(range(1, 601)), rs.METRIC_TRAIN_LOSS: list(range(1, 601))}
    assert MlflowClient(uri).get_run(run.info.run_id).info.status == "FINISHED"


def test_the_sweeps_uploader_sends_what_comes_within_its_interval_together_and_drain_does_not_wait(sweep):
    """A trial's start goes up at once; its six epochs and its end, appended one by one right
    after, wait for the next pass (an interval later) and go up together: one log_batch, not one
    per record. drain() sends them at once, not when the interval is over."""
    uri, store, experiment_id, parent, journal = sweep
    client = counting(store)
    uploader = JournalUploader(store, journal.path, interval_s=600)
    uploader.start(journal)
    recorder = SweepRecorder(journal, base_params={"model": "decomposable"}, run_tags={})
    recorder.trial_started("t000", {"lr": 0.001, "seed": 1})
    deadline = time.monotonic() + 60
    while uploader.uploaded < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert uploader.uploaded == 1 and client.calls["create_run"] == 1
    for epoch in range(1, EPOCHS + 1):
        recorder.trial_result("t000", {rs.METRIC_EPOCHS_TRAINED: epoch, "dev_accuracy": epoch / 100, "train_loss": 1 / epoch})
    checkpoint = journal.path.parent / "checkpoint_000006"
    checkpoint.mkdir()
    (checkpoint / "weights.pt").write_bytes(b"\0" * 64)
    recorder.trial_completed("t000", {"best_dev_accuracy": 0.06, rs.METRIC_EPOCHS_TRAINED: EPOCHS, rs.RESULT_TRIAL_FINISHED: 1},
                             str(checkpoint))
    time.sleep(0.5)  # an uploader woken by every append would have sent them by now
    assert uploader.uploaded == 1 and uploader.behind() == EPOCHS + 2

    begun = time.monotonic()
    uploader.drain()
    assert time.monotonic() - begun < 60 and uploader.behind() == 0
    uploader.stop()  # does not wait for the interval either
    assert not uploader._thread.is_alive()
    assert client.calls == {"search_runs": 1, "create_run": 1, "log_batch": 2, "set_terminated": 1}
    # the start's params; then two metrics per epoch and the end's two (best dev accuracy, epochs)
    assert [len(batch["metrics"]) for batch in client.batches] == [0, 2 * EPOCHS + 2]
    [run] = store.trial_runs(experiment_id, parent)
    assert run.info.status == "FINISHED"
    assert epoch_steps(MlflowClient(uri), run.info.run_id) == {
        rs.METRIC_DEV_ACCURACY: list(range(1, EPOCHS + 1)), rs.METRIC_TRAIN_LOSS: list(range(1, EPOCHS + 1))}
    # The checkpoint went to the run's artifact location as created: no get_run to look it up.
    listed = MlflowClient(uri).list_artifacts(run.info.run_id, rs.ARTIFACT_CHECKPOINT_DIR)
    assert [a.path for a in listed] == [f"{rs.ARTIFACT_CHECKPOINT_DIR}/weights.pt"]


def test_a_retry_of_a_trial_that_never_started_rides_on_its_start(sweep):
    """Tune retries a trial whose actor was lost while pending (its node removed): there is no
    run to tag yet. The retry's tags go up with the run's start instead of a tags record that
    the uploader could not place (it stopped the sweep as 'store unreachable' before)."""
    uri, store, experiment_id, parent, journal = sweep
    recorder = SweepRecorder(journal, base_params={"model": "decomposable"}, run_tags={})
    recorder.trial_retried("t000", 1, "node removed", 0)
    assert journal.appended == 0
    recorder.trial_started("t000", {"lr": 0.001, "seed": 1})
    recorder.trial_result("t000", {rs.METRIC_EPOCHS_TRAINED: 1, "dev_accuracy": 0.5, "train_loss": 1.0})
    recorder.trial_retried("t000", 2, "worker died", 1)  # a started trial: its own record
    recorder.trial_completed("t000", {"best_dev_accuracy": 0.5, rs.METRIC_EPOCHS_TRAINED: 1, rs.RESULT_TRIAL_FINISHED: 1}, None)
    records = [r for _, r in read_records(journal.path)]
    assert [r.kind for r in records] == ["start", "metrics", "tags", "finish"]
    assert records[0].data["tags"][rs.TAG_RETRY_CAUSE] == "node removed"
    JournalUploader(store, journal.path).upload_available()
    [run] = store.trial_runs(experiment_id, parent)
    tags = MlflowClient(uri).get_run(run.info.run_id).data.tags
    assert tags[rs.TAG_RETRIES] == "2" and tags[rs.TAG_RETRY_CAUSE] == "worker died"
    assert run.info.status == "FINISHED"
