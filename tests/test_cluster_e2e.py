"""Sweeps submitted to a real two-node Ray cluster on 127.0.0.1, logging to a real MLflow tracking
server backed by the local PostgreSQL.

One Ray head (`ray start --head --block`, 2 CPUs) and one worker node (1 CPU), one MLflow server
(`orchestrate server`) and one fresh database nli_test_<random> serve the whole module. Every
process runs in its own process group and is stopped by that group's id, never by name: other
Ray instances on this machine are left alone (no `ray stop`).

Skipped only when PostgreSQL on 127.0.0.1:5432 can be neither reached nor started.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from testkit import BIN
from testkit.cli import orchestrate
from testkit.ports import free_port
from testkit.processes import Group, base_env, wait_for
from testkit.ray_nodes import RayHead, RayWorker, stop_ray_nodes
from testkit.specs import write_quickstart

JOB_TIMEOUT_S = 240

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]


# -- Ray cluster ------------------------------------------------------------------------------
class Cluster:
    def __init__(self, dashboard: str, groups: list[Group]):
        self.address = dashboard
        self.groups = groups

    def jobs(self):
        from orchestrator.ray_adapter.ray_jobs import Jobs

        return Jobs(self.address)


@pytest.fixture(scope="module")
def ray_cluster(postgres_uri, logs_dir):
    """A head (2 CPUs) and a worker node (1 CPU); each node has its own temp dir, as separate
    machines would (a shared one lets a node delete the other's unpacked job working dir)."""
    head = RayHead(num_cpus=2, logs=logs_dir)
    worker = RayWorker(head, num_cpus=1, num_gpus=0, log=logs_dir / "ray-worker.log")
    groups = [head.group, worker.group]
    try:

        def two_nodes() -> bool:
            try:
                with urllib.request.urlopen(f"{head.dashboard}/nodes?view=summary", timeout=5) as response:
                    nodes = json.load(response)["data"]["summary"]
            except (OSError, ValueError, KeyError):
                return False
            return sum(n["raylet"]["state"] == "ALIVE" for n in nodes) >= 2

        wait_for(two_nodes, 90, "the worker node to join", groups=groups)
        yield Cluster(head.dashboard, groups)
    finally:
        stop_ray_nodes(groups)
        shutil.rmtree(head.temp_dir, ignore_errors=True)
        shutil.rmtree(worker.temp_dir, ignore_errors=True)


# -- sweeps -----------------------------------------------------------------------------------
def submit(cluster: Cluster, spec: Path, *extra: str, subprocess_cli: bool = False) -> str:
    """`orchestrate submit`; its first stdout line is the job id."""
    args = ["submit", str(spec), "--address", cluster.address,
            "--env", f"NLI_DATA_DIR={spec.parent / 'data-cache'}", *extra]
    if subprocess_cli:  # the installed console script, as a user runs it
        result = subprocess.run([str(BIN / "orchestrate"), *args], capture_output=True, text=True,
                                env=base_env(), timeout=120)
    else:
        result = orchestrate(*args)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().splitlines()[0]
    assert f"orchestrate logs {job_id}" in result.stderr  # tells how to follow it
    return job_id


def wait_succeeded(cluster: Cluster, job_id: str, timeout_s: float = JOB_TIMEOUT_S) -> str:
    jobs = cluster.jobs()
    try:
        status = jobs.wait(job_id, timeout_s=timeout_s)
    except TimeoutError as exc:
        status = str(exc)
    logs = jobs.logs(job_id)
    if status != "SUCCEEDED":
        print(f"--- logs of job {job_id} ---\n{logs}")
        pytest.fail(f"job {job_id}: {status}; logs:\n{logs[-6000:]}")
    return logs


def sweep_runs(client, name: str, trials: int):
    """The experiment's parent run and its child runs."""
    experiment = client.get_experiment_by_name(name)
    assert experiment is not None, f"no MLflow experiment {name!r}"
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("nli.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("nli.role") == "trial"]
    assert len(parents) == 1, [r.info.run_id for r in parents]
    assert len(children) == trials, f"{len(children)} child runs, expected {trials}"
    return parents[0], children


def assert_complete(client, name: str, trials: int, epochs: int):
    parent, children = sweep_runs(client, name, trials)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["nli.sweep_state"] == "completed"
    assert "sweep.best_dev_accuracy" in parent.data.metrics
    for child in children:
        assert child.info.status == "FINISHED", (child.info.run_id, child.info.status)
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        for metric in ("train_loss", "dev_accuracy", "epoch_time_s"):
            history = client.get_metric_history(child.info.run_id, metric)
            steps = sorted(m.step for m in history)
            assert steps == list(range(1, epochs + 1)), (child.info.run_id, metric, steps)
    return parent, children


def metric_times(client, children) -> list[int]:
    return [m.timestamp for c in children for m in client.get_metric_history(c.info.run_id, "dev_accuracy")]


def trial_runs(client, name: str) -> list:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], "tags.`nli.role` = 'trial'")


def logged_epochs(client, name: str) -> int:
    """dev_accuracy values the sweep's trial runs hold (one per epoch and trial)."""
    return sum(len(client.get_metric_history(run.info.run_id, "dev_accuracy"))
               for run in trial_runs(client, name))


# -- tests ------------------------------------------------------------------------------------
def test_quickstart_and_a_second_sweep_at_once_log_every_trial_to_the_shared_server(
        ray_cluster, tracking, tmp_path):
    """Two sweeps submitted together run side by side on the two nodes and share the server
    without losing a run: the quickstart as shipped, submitted with the console script, and a
    smaller one whose storage_path is a URI (as s3://... would be), which Tune and the sweep
    take as given. (One test for both: each job costs a driver's start on the cluster.)"""
    from orchestrator.sweep.spec import grid_points, load_spec

    # The quickstart searching lr x dropout (4 trials; its hidden_size grid would double the time
    # without testing more of the cluster path).
    quickstart, other = "cluster-quickstart", "cluster-concurrent"
    grid = {"lr": [0.001, 0.003], "dropout": [0.0, 0.2]}
    quickstart_spec = write_quickstart(tmp_path / "spec", quickstart, tracking.url, grid=grid)
    other_spec = write_quickstart(tmp_path / "other", other, tracking.url, epochs=2, toy_size=1000,
                            grid=grid, storage_path=f"file://{tmp_path}/other-results")
    loaded = load_spec(quickstart_spec)
    trials, epochs = loaded.num_trials(), loaded.training.epochs
    quickstart_job = submit(ray_cluster, quickstart_spec, subprocess_cli=True)
    other_job = submit(ray_cluster, other_spec)

    listed = orchestrate("jobs", "--address", ray_cluster.address)
    assert listed.returncode == 0 and quickstart_job in listed.stdout, listed.stdout + listed.stderr

    for job_id in (quickstart_job, other_job):
        logs = wait_succeeded(ray_cluster, job_id)
        assert "sweep finished: 4 trials (0 failed)" in logs
        assert "Traceback" not in logs and "unreachable" not in logs, logs[-4000:]
    client = tracking.client()
    parent, children = assert_complete(client, quickstart, trials, epochs)
    assert "sweep.test_accuracy" in parent.data.metrics  # the selected configuration was tested
    names = sorted(loaded.search.space)
    expected = sorted(tuple(str(point[k]) for k in names) for point in grid_points(loaded))
    assert sorted(tuple(c.data.params[k] for k in names) for c in children) == expected
    other_parent, other_children = assert_complete(client, other, trials=4, epochs=2)
    run_ids = {r.info.run_id for r in (parent, *children, other_parent, *other_children)}
    assert len(run_ids) == 10
    # Artifacts went through the server to its destination; Tune results to storage_path.
    assert list(tracking.artifacts.rglob("spec.yaml")), "the spec artifact is not in the server's store"
    assert list((tmp_path / "spec" / "ray_results").glob(f"{quickstart}-*/*/checkpoint_*"))
    assert list((tmp_path / "other-results").glob(f"{other}-*/*/checkpoint_*"))

    shown = orchestrate("logs", quickstart_job, "--address", ray_cluster.address)
    assert shown.returncode == 0 and "sweep finished" in shown.stdout
    followed = orchestrate("logs", quickstart_job, "--address", ray_cluster.address, "--follow")
    assert followed.returncode == 0 and "sweep finished" in followed.stdout
    assert "SUCCEEDED" in followed.stderr


def test_server_outage_mid_sweep_loses_nothing(ray_cluster, tracking, tmp_path):
    """The tracking server is stopped while two sweeps train, and restarted (same port, same
    database) once the shorter one has ended. `retry` keeps its metrics queued and resends them
    until the server is back. `spool` (max wait 1 s) ends while the server is still away, with
    its own outcome, and says so; `orchestrate sync` then uploads everything its journal recorded. Both send each
    request once (MLFLOW_HTTP_REQUEST_MAX_RETRIES=0), so the retries are the sweep's own."""
    retry, spooler = "cluster-outage-retry", "cluster-outage-spool"
    retry_epochs, spool_epochs = 30, 20
    retry_spec = write_quickstart(tmp_path / retry, retry, tracking.url, epochs=retry_epochs,
                            grid={"lr": [0.001, 0.003], "dropout": [0.1]}, toy_size=1000)
    spool_spec = write_quickstart(tmp_path / spooler, spooler, tracking.url, epochs=spool_epochs,
                            grid={"lr": [0.003], "dropout": [0.1]}, toy_size=1000)
    once = ("--env", "MLFLOW_HTTP_REQUEST_MAX_RETRIES=0")
    retry_job = submit(ray_cluster, retry_spec, *once)
    spool_job = submit(ray_cluster, spool_spec, *once, "--env", "NLI_TRACKING_MAX_WAIT_S=1")
    # Stop the server once `retry` has logged an epoch and `spool` has its first trial run (all
    # its direct MLflow calls before Tune are done; its epochs are still to come).
    client = tracking.client()

    def both_training() -> bool:
        for job_id in (retry_job, spool_job):
            status = ray_cluster.jobs().status(job_id)
            if status != "PENDING" and status != "RUNNING":
                pytest.fail(f"job {job_id} ended ({status}) before the outage:\n"
                            f"{ray_cluster.jobs().logs(job_id)[-4000:]}")
        return logged_epochs(client, retry) >= 1 and bool(trial_runs(client, spooler))

    wait_for(both_training, 180, "both sweeps to train", poll_s=0.3)

    down_ms = int(time.time() * 1000)
    tracking.stop()
    jobs = ray_cluster.jobs()
    assert jobs.wait(spool_job, timeout_s=JOB_TIMEOUT_S) == "SUCCEEDED"  # it ended during the outage
    tracking.start()  # same port, same PostgreSQL database
    up_ms = int(time.time() * 1000)

    # retry: every epoch arrives once the server is back, including those of the outage.
    logs = wait_succeeded(ray_cluster, retry_job)
    assert "sweep finished: 2 trials (0 failed)" in logs
    assert "trial events are kept in" in logs and "answers again" in logs  # the uploader fell behind
    _, children = assert_complete(client, retry, trials=2, epochs=retry_epochs)
    during = [t for t in metric_times(client, children) if down_ms <= t <= up_ms]
    assert during, "no epoch of the sweep ended while the server was down"

    # spool: the job ended with instructions; what its journal holds is missing until `sync`.
    logs = jobs.logs(spool_job)
    spools = list((tmp_path / spooler / "ray_results").glob("tracking-journal-*.jsonl"))
    assert len(spools) == 1, logs[-4000:]
    spool = spools[0]
    assert "is still unreachable after the sweep" in logs, logs[-4000:]
    assert f"orchestrate sync {spool} --tracking-uri {tracking.url}" in logs
    assert logged_epochs(client, spooler) < spool_epochs, "nothing was missing before sync"

    bad = orchestrate("sync", str(spool), "--tracking-uri", f"http://127.0.0.1:{free_port()}")
    assert bad.returncode == 1 and "unreachable" in bad.stderr, bad.stderr
    synced = orchestrate("sync", str(spool), "--tracking-uri", tracking.url)
    assert synced.returncode == 0, synced.stderr
    assert re.search(r"uploaded \d+ operations", synced.stdout)
    trials = trial_runs(client, spooler)
    assert len(trials) == 1 and trials[0].info.status == "FINISHED"
    history = client.get_metric_history(trials[0].info.run_id, "dev_accuracy")
    assert sorted(m.step for m in history) == list(range(1, spool_epochs + 1))
    assert any(down_ms <= m.timestamp <= up_ms for m in history)


def test_stop_ends_a_running_job(ray_cluster, tracking, tmp_path):
    spec = write_quickstart(tmp_path / "spec", "cluster-stop", tracking.url, epochs=200, toy_size=1000,
                      grid={"lr": [0.001], "dropout": [0.1]})
    job_id = submit(ray_cluster, spec)
    wait_for(lambda: ray_cluster.jobs().status(job_id) == "RUNNING", 60, f"job {job_id} to run")
    stopped = orchestrate("stop", job_id, "--address", ray_cluster.address)
    assert stopped.returncode == 0, stopped.stderr
    assert "stop requested" in stopped.stdout
    assert ray_cluster.jobs().wait(job_id, timeout_s=60) == "STOPPED"
    again = orchestrate("stop", job_id, "--address", ray_cluster.address)
    assert again.returncode == 0 and "was not running" in again.stdout

    unknown = orchestrate("logs", "no-such-job", "--address", ray_cluster.address)
    assert unknown.returncode == 2 and "no job 'no-such-job'" in unknown.stderr
