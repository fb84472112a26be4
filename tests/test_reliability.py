"""Issue 14 faults, driven through the real `orchestrate` process: a poisoned checkpoint runs
nothing, a diverging trial is stopped and never selected, a new SQLite store survives sweeps
that start together, and a retried trial says so on its run.

The sweeps whose claim is about the store, not about Ray (diverging, sweeps at once), join one
Ray instance of the module (`orchestrate sweep --address`, fixture ray_head): three private Ray
instances starting at once on 2 busy cores time out ("The current node timed out during
startup"), and each start costs seconds of CPU that say nothing about the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient
from testkit.cli import ORCHESTRATE, run_orchestrate, start_orchestrate
from testkit.ports import free_port
from testkit.processes import kill_session, wait_while_driving
from testkit.ray_nodes import RayHead
from testkit.specs import write_spec
from testkit.store import runs_of, trial_running
from testkit.toy import tiny_config

from nli_models.training import CHECKPOINT_FILE, TRIAL_CONFIG_FILE
from results import run_schema as rs

TINY = tiny_config()


class _Payload:
    """Unpickling this would run a shell command that creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _poison(path: Path, marker: Path) -> None:
    """A checkpoint as an attacker would log it: the usual keys, one of them a payload."""
    torch.save({"model": _Payload(marker), "optimizer": {}, "state": {}, "rng": {}}, path)


def _env(tmp_path: Path) -> dict:
    return {"NLI_DATA_DIR": str(tmp_path / "data-cache")}


@pytest.fixture(scope="module")
def ray_head(logs_dir):
    """One Ray instance (2 CPUs, its own process group, stopped by group id) for the module."""
    head = RayHead(num_cpus=2, logs=logs_dir)
    yield head
    head.stop()


def test_poisoned_checkpoint_is_refused_by_train_resume(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(TINY))
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    marker = tmp_path / "code-ran"
    _poison(checkpoints / CHECKPOINT_FILE, marker)
    result = run_orchestrate(
        ["train", str(config), "--checkpoint-dir", str(checkpoints), "--resume"],
        cwd=tmp_path, env=_env(tmp_path), timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"error: {checkpoints / CHECKPOINT_FILE}: refused to load" in result.stderr
    assert not marker.exists()


def test_poisoned_checkpoint_artifact_is_refused_by_attention(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("attacked")).info.run_id
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / TRIAL_CONFIG_FILE).write_text(yaml.safe_dump(TINY))
    marker = tmp_path / "code-ran"
    _poison(artifact / CHECKPOINT_FILE, marker)
    client.log_artifacts(run_id, str(artifact), rs.ARTIFACT_CHECKPOINT_DIR)
    (tmp_path / "tmp").mkdir()
    result = run_orchestrate(
        ["attention", run_id, "--tracking-uri", uri, "--out", str(tmp_path / "plots")],
        cwd=tmp_path, env={**_env(tmp_path), "TMPDIR": str(tmp_path / "tmp")}, timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"run {run_id}: checkpoint/{CHECKPOINT_FILE}: refused to load" in result.stderr
    assert not marker.exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # the download folder is gone
    assert not (tmp_path / "plots").exists()


def test_diverging_trial_is_stopped_recorded_and_never_selected(ray_head, tmp_path):
    # lr 1e10 is a finite number (the spec accepts it); the loss is NaN within two steps.
    spec = write_spec(
        tmp_path,
        {
            "name": "diverging",
            "training": {"epochs": 3},
            "search": {"space": {"lr": {"grid": [1e10, 0.003]}, "dropout": {"grid": [0.0]}}},
        },
    )
    result = run_orchestrate(["sweep", str(spec), "--address", ray_head.address], cwd=tmp_path,
                             env=_env(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "2 trials (0 failed), 1 diverged" in output
    parents, children = runs_of(tmp_path, "diverging")
    by_lr = {c.data.params["lr"]: c for c in children}
    bad, good = by_lr["10000000000.0"], by_lr["0.003"]
    assert bad.info.status == "FAILED"
    assert bad.data.tags[rs.TAG_DIVERGED] == "true"
    assert "at epoch 1, step" in bad.data.tags[rs.TAG_ERROR]
    assert bad.data.metrics[rs.METRIC_DIVERGED_EPOCH] == 1
    assert bad.data.metrics[rs.METRIC_DIVERGED_STEP] >= 1
    # Stopped at once: no epoch was reported, the trial did not run its three epochs.
    assert rs.METRIC_DEV_ACCURACY not in bad.data.metrics
    assert rs.METRIC_TEST_ACCURACY not in bad.data.metrics
    assert rs.TAG_SELECTED not in bad.data.tags
    assert good.info.status == "FINISHED" and good.data.tags[rs.TAG_SELECTED] == "true"
    assert parents[0].data.tags[rs.TAG_BEST_RUN] == good.info.run_id


def _three_sweeps_at_once(tmp_path: Path, prefix: str, tracking_uri: str, ray_address: str) -> None:
    """Three one-trial `orchestrate sweep` (experiments PREFIX0-2, a folder each) started at the
    same instant on `tracking_uri`, joining the Ray instance at `ray_address`: each exits 0 and
    records its parent and trial FINISHED."""
    processes = []
    for i in range(3):
        folder = tmp_path / f"w{i}"
        folder.mkdir()
        spec = write_spec(folder, {
            "name": f"{prefix}{i}", "training": {"epochs": 1},
            "search": {"space": {"lr": {"grid": [0.003]}, "dropout": {"grid": [0.0]}},
                       "tracking_uri": tracking_uri},
        })
        processes.append(subprocess.Popen(
            [ORCHESTRATE, "sweep", str(spec), "--address", ray_address], cwd=folder, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, **_env(folder)},
        ))
    for process in processes:
        _out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
    client = MlflowClient(tracking_uri=tracking_uri)
    for i in range(3):
        experiment = client.get_experiment_by_name(f"{prefix}{i}")
        runs = client.search_runs([experiment.experiment_id])
        assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]


def test_sweeps_starting_together_on_a_new_sqlite_store_all_succeed(tmp_path):
    """Without the creation lock, processes opening a new store together race MLflow's schema
    migration and the store is broken for good. Four processes open it the way a sweep does."""
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    names = [f"together{i}" for i in range(4)]
    _open_together(store, names, tmp_path)
    assert set(names) <= {e.name for e in MlflowClient(tracking_uri=store).search_experiments()}


def test_concurrent_sweeps_on_a_new_sqlite_store(ray_head, tmp_path):
    """The user's view: three `orchestrate sweep` started at the same instant on a new store."""
    _three_sweeps_at_once(tmp_path, "race", f"sqlite:///{tmp_path / 'mlruns.db'}", ray_head.address)


def _trial_worker_pids(session: int) -> list[int]:
    """Ray worker processes of the sweep's session that run a trial (Tune's function trainable)."""
    found = subprocess.run(["ps", "-s", str(session), "-o", "pid=,args="], capture_output=True, text=True)
    return [int(line.split()[0]) for line in found.stdout.splitlines()
            if "ray::" in line and ("ImplicitFunc" in line or "Trainable" in line)]


def test_sigkilled_trial_worker_leaves_its_trace_on_the_run(tmp_path):
    spec = write_spec(tmp_path, {
        "name": "killed-worker",
        "training": {"epochs": 4},
        "search": {"space": {"lr": {"grid": [0.003]}, "dropout": {"grid": [0.0]}}, "max_failures": 1},
    })
    log = tmp_path / "sweep.log"
    # Epochs slowed by a sleep, not by more data: the worker is still training when the test has
    # seen epoch 1 recorded, at no cost in CPU.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NLI_EPOCH_DELAY_S", "4")
        process = start_orchestrate(["sweep", str(spec)], cwd=tmp_path, log=log)
    try:
        # One epoch recorded: the trial has a checkpoint to resume from.
        wait_while_driving(trial_running(tmp_path, "killed-worker", log, epochs_logged=1), process, log,
                           "the trial's first epoch", timeout=300)
        workers = _trial_worker_pids(process.pid)
        assert workers, subprocess.run(["ps", "-s", str(process.pid), "-o", "pid=,args="],
                                       capture_output=True, text=True).stdout
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert process.wait(timeout=400) == 0, log.read_text()
    finally:
        if process.poll() is None:
            kill_session(process)
    _, children = runs_of(tmp_path, "killed-worker")
    tags = children[0].data.tags
    assert children[0].info.status == "FINISHED"
    assert tags[rs.TAG_RETRIES] == "1"
    assert int(tags[rs.TAG_RESUMED_FROM_EPOCH]) >= 1
    assert "died" in tags[rs.TAG_RETRY_CAUSE].lower() or "killed" in tags[rs.TAG_RETRY_CAUSE].lower(), tags


# -- the same against PostgreSQL ------------------------------------------------------------------


def _open_together(uri: str, names: list[str], cwd: Path) -> None:
    script = (
        "import sys\nfrom orchestrator.tracking.tracker import Tracker\nfrom orchestrator.tracking.uploader import create_parent\n"
        "t = Tracker(sys.argv[1]); t.check_reachable(); print(create_parent(t, sys.argv[2], 'sweep', {})[0])\n"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", script, uri, name], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in names
    ]
    for process in processes:
        _out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        assert "Traceback" not in err


def test_sweeps_starting_together_on_a_new_postgres_store_all_succeed(fresh_postgres, tmp_path):
    names = [f"pg{i}" for i in range(4)]
    _open_together(fresh_postgres, names, tmp_path)
    found = {e.name for e in MlflowClient(tracking_uri=fresh_postgres).search_experiments()}
    assert set(names) <= found


def test_sweeps_starting_together_on_a_new_server_over_postgres(ray_head, fresh_postgres, tmp_path):
    """`orchestrate server` creates its database before it answers; sweeps started at once
    against it (as soon as it answers) all record their runs."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_orchestrate(
        ["server", "--backend-store-uri", fresh_postgres, "--artifacts-destination",
         str(tmp_path / "artifacts"), "--port", str(port)],
        cwd=tmp_path, log=tmp_path / "server.log",
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        _three_sweeps_at_once(tmp_path, "served", url, ray_head.address)
    finally:
        kill_session(server)
