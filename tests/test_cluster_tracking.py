"""Tracking-server outages, in one process and without Ray: an unreachable server stops a sweep
before it launches (quickly, with a clear message); the sender spools after its bounded wait
(NLI_TRACKING_MAX_WAIT_S); what was spooled is uploaded as soon as the server answers again.
The same behaviour against a real server and a real cluster is in test_cluster_e2e.py. Also: a
resumed trial that repeats epochs it had already logged does not log them twice."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.tracking import (
    SweepRecorder,
    Tracker,
    TrackingUnavailable,
    default_max_wait_s,
    spool_file,
)
from results import run_schema as rs

REPO = Path(__file__).resolve().parents[1]


def closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_unreachable_server_is_reported_quickly():
    url = closed_url()
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable) as info:
        Tracker(url).check_reachable()
    # Not the MLflow client's ~4 minutes of retries on a refused connection.
    assert time.monotonic() - started < 15
    assert url in str(info.value) and "orchestrate server" in str(info.value)


def test_sweep_fails_before_launching_while_the_server_is_unreachable(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from orchestrator.cli import main

    monkeypatch.chdir(tmp_path)
    spec = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    url = closed_url()
    spec["search"].update(tracking_uri=url, storage_path=str(tmp_path / "ray_results"))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    started = time.monotonic()
    result = CliRunner().invoke(main, ["sweep", "sweep.yaml"])
    assert result.exit_code == 2, result.output
    assert f"MLflow tracking store {url} is unreachable" in result.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "ray_results").exists()  # nothing was launched


def test_max_wait_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("NLI_TRACKING_MAX_WAIT_S", raising=False)
    assert default_max_wait_s() == 120.0
    monkeypatch.setenv("NLI_TRACKING_MAX_WAIT_S", "7.5")
    assert default_max_wait_s() == 7.5
    for bad in ("soon", "-1"):
        monkeypatch.setenv("NLI_TRACKING_MAX_WAIT_S", bad)
        with pytest.raises(ValueError, match="NLI_TRACKING_MAX_WAIT_S"):
            default_max_wait_s()


def test_spooled_trials_are_uploaded_once_the_server_answers(tmp_path, monkeypatch):
    # One HTTP attempt per send: the refused connection fails at once, not after MLflow's retries.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("NLI_TRACKING_MAX_WAIT_S", "0.5")
    store = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}")  # where the runs end up
    experiment_id = store.experiment_id("outage")
    parent = store.start_sweep(experiment_id, "sweep-outage", {})

    recorder = SweepRecorder(
        Tracker(closed_url()), experiment_id, parent,
        base_params={"model": "decomposable", "variant": "vanilla", "hidden_size": 50},
        run_tags={}, spool_path=tmp_path / "results" / f"tracking-spool-{parent}.jsonl",
    )
    assert recorder.max_wait_s == 0.5
    recorder.trial_started("t1", {"lr": 0.001, "seed": 1})
    for epoch in (1, 2, 3):
        recorder.trial_result("t1", {"epoch": epoch, "dev_accuracy": 0.5 + epoch / 10, "train_loss": 1.0})
    recorder.trial_completed("t1", {"best_dev_accuracy": 0.8, "epoch": 3, "trial_finished": 1}, None)
    recorder.flush(timeout=60)
    assert recorder.spooled
    lines = recorder.spool_path.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["start", "metrics", "metrics", "metrics", "finish"]

    # Still away at the end of the sweep: a clear error that says how to upload later.
    with pytest.raises(TrackingUnavailable) as info:
        recorder.upload_spool(wait_s=0)
    assert f"orchestrate sync {recorder.spool_path}" in str(info.value)

    # Back (here: the recorder's store answers again): everything is uploaded, run ids known.
    recorder.tracker = store
    assert recorder.upload_spool(wait_s=0) == 5
    run_id = recorder.run_ids["t1"]
    run = store.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[rs.TAG_PARENT_RUN] == parent and run.data.params["lr"] == "0.001"
    history = store.client.get_metric_history(run_id, rs.METRIC_DEV_ACCURACY)
    assert sorted(m.step for m in history) == [1, 2, 3]
    # Uploading again (e.g. `orchestrate sync` on the same file) duplicates nothing.
    assert recorder.upload_spool(wait_s=0) == 5
    assert len(store.client.get_metric_history(run_id, rs.METRIC_DEV_ACCURACY)) == 3
    assert len(store.trial_runs(experiment_id, parent)) == 1


def test_spool_file_is_local_for_every_kind_of_storage_path(monkeypatch):
    monkeypatch.setenv("NLI_DATA_DIR", "/data")
    assert spool_file("/shared/ray_results", "p1") == Path("/shared/ray_results/tracking-spool-p1.jsonl")
    assert spool_file("file:///shared/r", "p1") == Path("/shared/r/tracking-spool-p1.jsonl")
    assert spool_file("s3://bucket/r", "p1") == Path("/data/tracking-spool/tracking-spool-p1.jsonl")


def test_epochs_a_resumed_trial_repeats_are_logged_once(tmp_path):
    store = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment_id = store.experiment_id("resumed")
    parent = store.start_sweep(experiment_id, "sweep-resumed", {})

    def recorder():
        return SweepRecorder(store, experiment_id, parent, base_params={"model": "decomposable"},
                             run_tags={}, spool_path=tmp_path / "spool.jsonl")

    def result(epoch):
        return {"epoch": epoch, "dev_accuracy": 0.5 + epoch / 10, "epoch_time_s": 1.0}

    killed = recorder()  # the driver logged epochs 1-2, then was killed before Tune saved them
    killed.trial_started("t1", {"lr": 0.001})
    for epoch in (1, 2):
        killed.trial_result("t1", result(epoch))
    killed.flush(timeout=60)

    resumed = recorder()  # the resumed sweep restarts the trial from its last saved checkpoint
    resumed.trial_started("t1", {"lr": 0.001})
    for epoch in (1, 2, 3):
        resumed.trial_result("t1", result(epoch))
    resumed.trial_completed("t1", {"best_dev_accuracy": 0.8, "epoch": 3, "trial_finished": 1}, None)
    resumed.flush(timeout=60)

    [run] = store.trial_runs(experiment_id, parent)
    assert run.info.status == "FINISHED"
    for key in (rs.METRIC_DEV_ACCURACY, rs.METRIC_EPOCH_TIME):
        assert sorted(m.step for m in store.client.get_metric_history(run.info.run_id, key)) == [1, 2, 3]
