"""Tracking-server outages, in one process and without Ray: an unreachable server stops a sweep
before it launches (quickly, with a clear message); while it is away the journal keeps every
trial event and the uploader falls behind; at the end of a sweep the driver waits for it at most
NLI_TRACKING_MAX_WAIT_S, then says how to upload the journal (`orchestrate sync`). The same
behaviour against a real server and a real cluster is in test_cluster_e2e.py; the journal and
the uploader's idempotence (a killed uploader) in test_journal.py. Also: a resumed trial that
repeats epochs it had already logged does not log them twice."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from testkit.cli import orchestrate
from testkit.ports import free_port
from testkit.specs import quickstart, write_spec

from orchestrator.journal.operations import Journal, journal_file
from orchestrator.journal.recorder import SweepRecorder
from orchestrator.tracking.tracker import (
    Tracker,
    TrackingUnavailable,
    default_max_wait_s,
    default_upload_interval_s,
)
from orchestrator.tracking.uploader import JournalUploader, create_parent
from results import run_schema as rs

REPO = Path(__file__).resolve().parents[1]


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_unreachable_server_is_reported_quickly():
    url = closed_url()
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable) as info:
        Tracker(url).check_reachable()
    # Not the MLflow client's ~4 minutes of retries on a refused connection.
    assert time.monotonic() - started < 15
    assert url in str(info.value) and "orchestrate server" in str(info.value)


def test_sweep_fails_before_launching_while_the_server_is_unreachable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = closed_url()
    write_spec(tmp_path, {"search": {"tracking_uri": url}}, base=quickstart(), file_name="sweep.yaml")
    started = time.monotonic()
    result = orchestrate("sweep", "sweep.yaml")
    assert result.returncode == 2, result.output
    assert f"MLflow tracking store {url} is unreachable" in result.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "ray_results").exists()  # nothing was launched


@pytest.mark.parametrize("variable, seconds, default", [
    ("NLI_TRACKING_MAX_WAIT_S", default_max_wait_s, 120.0),
    ("NLI_TRACKING_UPLOAD_INTERVAL_S", default_upload_interval_s, 2.0),
])
def test_the_uploaders_waits_come_from_the_environment(monkeypatch, variable, seconds, default):
    monkeypatch.delenv(variable, raising=False)
    assert seconds() == default
    monkeypatch.setenv(variable, "7.5")
    assert seconds() == 7.5
    for bad in ("soon", "-1"):
        monkeypatch.setenv(variable, bad)
        with pytest.raises(ValueError, match=variable):
            seconds()


def test_trials_recorded_during_an_outage_are_uploaded_once_the_server_answers(tmp_path, monkeypatch):
    # One HTTP attempt per request: the refused connection fails at once, not after MLflow's retries.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    store = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}")  # where the runs end up
    experiment_id, parent = create_parent(store, "outage", "sweep-outage", {})
    journal = Journal(journal_file(str(tmp_path / "results"), parent), experiment_id, parent)

    away = JournalUploader(Tracker(closed_url()), journal.path, max_wait_s=0.5)
    away.start(journal)
    recorder = SweepRecorder(
        journal, base_params={"model": "decomposable", "variant": "vanilla", "hidden_size": 50},
        run_tags={},
    )
    recorder.trial_started("t1", {"lr": 0.001, "seed": 1})
    for epoch in (1, 2, 3):
        recorder.trial_result("t1", {rs.METRIC_EPOCHS_TRAINED: epoch, "dev_accuracy": 0.5 + epoch / 10, "train_loss": 1.0})
    recorder.trial_completed("t1", {"best_dev_accuracy": 0.8, rs.METRIC_EPOCHS_TRAINED: 3, rs.RESULT_TRIAL_FINISHED: 1}, None)
    lines = journal.path.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["start", "metrics", "metrics", "metrics", "finish"]

    # Still away at the end of the sweep: a clear error that says how to upload later.
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable) as info:
        away.drain()
    assert time.monotonic() - started < 20
    assert f"orchestrate sync {journal.path}" in str(info.value) and "--resume" in str(info.value)
    assert away.behind() == 5 and away.uploaded == 0
    away.stop()

    # Back (here: another uploader over the store that answers): everything is uploaded.
    back = JournalUploader(store, journal.path)
    back.start(journal)
    back.drain()
    back.stop()
    assert back.uploaded == 5 and back.behind() == 0
    [run] = store.trial_runs(experiment_id, parent)
    assert run.info.status == "FINISHED"
    assert run.data.tags[rs.TAG_PARENT_RUN] == parent and run.data.params["lr"] == "0.001"
    assert json.loads(run.data.tags[rs.TAG_PARAMS_JSON])["lr"] == 0.001  # typed, not '0.001'
    history = store.client.get_metric_history(run.info.run_id, rs.METRIC_DEV_ACCURACY)
    assert sorted(m.step for m in history) == [1, 2, 3]
    # Uploading again (e.g. `orchestrate sync` on the same file) duplicates nothing.
    JournalUploader(store, journal.path).upload_available()
    (journal.path.with_name(journal.path.name + ".uploaded")).unlink()  # not even from the start
    assert JournalUploader(store, journal.path).upload_available() == 5
    assert len(store.client.get_metric_history(run.info.run_id, rs.METRIC_DEV_ACCURACY)) == 3
    assert len(store.trial_runs(experiment_id, parent)) == 1
    journal.close()


def test_journal_file_is_local_for_every_kind_of_storage_path(monkeypatch):
    monkeypatch.setenv("NLI_DATA_DIR", "/data")
    assert journal_file("/shared/ray_results", "p1") == Path("/shared/ray_results/tracking-journal-p1.jsonl")
    assert journal_file("file:///shared/r", "p1") == Path("/shared/r/tracking-journal-p1.jsonl")
    assert journal_file("s3://bucket/r", "p1") == Path("/data/tracking-journal/tracking-journal-p1.jsonl")


def test_epochs_a_resumed_trial_repeats_are_logged_once(tmp_path):
    store = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment_id, parent = create_parent(store, "resumed", "sweep-resumed", {})
    path = journal_file(str(tmp_path), parent)

    def driver():
        journal = Journal(path, experiment_id, parent)  # reads what an earlier driver recorded
        uploader = JournalUploader(store, path)
        uploader.start(journal)
        return journal, uploader, SweepRecorder(journal, base_params={"model": "decomposable"}, run_tags={})

    def result(epoch):
        return {rs.METRIC_EPOCHS_TRAINED: epoch, "dev_accuracy": 0.5 + epoch / 10, "epoch_time_s": 1.0}

    journal, uploader, killed = driver()  # logged epochs 1-2, then killed before Tune saved them
    killed.trial_started("t1", {"lr": 0.001})
    for epoch in (1, 2):
        killed.trial_result("t1", result(epoch))
    uploader.drain()
    uploader.stop()
    journal.close()

    journal, uploader, resumed = driver()  # restarts the trial from its last saved checkpoint
    assert journal.trials["t1"].last_epoch == 2
    resumed.trial_started("t1", {"lr": 0.001})
    for epoch in (1, 2, 3):
        resumed.trial_result("t1", result(epoch))
    resumed.trial_completed("t1", {"best_dev_accuracy": 0.8, rs.METRIC_EPOCHS_TRAINED: 3, rs.RESULT_TRIAL_FINISHED: 1}, None)
    uploader.drain()
    uploader.stop()
    journal.close()

    steps = [json.loads(line)["data"].get("step") for line in path.read_text().splitlines()]
    assert [s for s in steps if s is not None] == [1, 2, 3]  # the repeats never reached the journal
    [run] = store.trial_runs(experiment_id, parent)
    assert run.info.status == "FINISHED"
    for key in (rs.METRIC_DEV_ACCURACY, rs.METRIC_EPOCH_TIME):
        assert sorted(m.step for m in store.client.get_metric_history(run.info.run_id, key)) == [1, 2, 3]
