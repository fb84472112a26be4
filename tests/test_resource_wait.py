"""A sweep that no node can hold yet asks the Ray autoscaler for one and waits a bounded time
(issue 24, item 3), on a local multi-node cluster whose GPUs are logical."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.cli import run_orchestrate, start_orchestrate
from testkit.processes import kill_session, wait_while_driving
from testkit.ray_nodes import RayHead, RayWorker
from testkit.specs import write_spec
from testkit.store import runs_so_far

from results import run_schema as rs

pytestmark = pytest.mark.ray
GPU_TRIAL = {"training": {"epochs": 1}, "search": {
    "space": {"lr": {"grid": [0.01]}, "dropout": {"grid": [0.0]}}, "resources": {"cpu": 1, "gpu": 1}}}


@pytest.fixture(scope="module")
def cpu_head(logs_dir):
    """A cluster of one node with 1 CPU and no GPU, started by hand (no autoscaler)."""
    head = RayHead(num_cpus=1, logs=logs_dir)
    yield head
    head.stop()


def test_a_plain_cluster_fails_at_once_and_a_wait_is_bounded(cpu_head, tmp_path):
    spec = write_spec(tmp_path, GPU_TRIAL)
    at_once = run_orchestrate(["sweep", str(spec), "--address", cpu_head.address], cwd=tmp_path)
    assert at_once.returncode == 2, at_once.stderr
    assert "error: search.resources: a trial asks for 1 CPU and 1 GPU, but no node" in at_once.stderr
    assert "waiting" not in at_once.stderr  # no autoscaler here: nothing to wait for
    waited = run_orchestrate(["sweep", str(spec), "--address", cpu_head.address], cwd=tmp_path,
                             env={"NLI_RESOURCES_WAIT_S": "4"})  # as --wait-for-resources 4
    assert waited.returncode == 2, waited.stderr
    assert "waiting for a node with 1 CPU and 1 GPU (asked the Ray autoscaler): 0s of 4s" in waited.stderr
    assert ("a trial asks for 1 CPU and 1 GPU, but no node of the Ray cluster has that much after "
            "waiting 4s for the autoscaler to start one (--wait-for-resources) (largest node: 1 CPU, "
            "0 GPU)") in waited.stderr
    assert "Traceback" not in waited.stderr
    assert runs_so_far(tmp_path, "tiny") == ([], [])  # nothing recorded


def test_the_sweep_runs_once_a_gpu_node_joins(cpu_head, tmp_path, logs_dir):
    spec = write_spec(tmp_path, GPU_TRIAL)
    log = tmp_path / "sweep.log"
    driver = start_orchestrate(["sweep", str(spec), "--address", cpu_head.address,
                                "--wait-for-resources", "300"], cwd=tmp_path, log=log)
    worker = None
    try:
        wait_while_driving(lambda: "waiting for a node with 1 CPU and 1 GPU" in log.read_text(),
                           driver, log, "the driver to wait for a GPU node", timeout=120)
        worker = RayWorker(cpu_head, num_cpus=1, num_gpus=1, log=logs_dir / "ray-gpu-worker.log")
        assert driver.wait(timeout=400) == 0, log.read_text()
    finally:
        if driver.poll() is None:
            kill_session(driver)
        if worker is not None:
            worker.stop()
    parents, children = runs_so_far(tmp_path, "tiny")
    assert parents[0].data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert [c.info.status for c in children] == ["FINISHED"]
    # Ray gave the trial a (logical) GPU; torch here has no CUDA, so it trained on the CPU.
    assert children[0].data.tags[rs.TAG_DEVICE] == "cpu"


def test_an_autoscaling_cluster_is_asked_for_a_gpu_node(tmp_path, logs_dir):
    """No --wait-for-resources: the autoscaler's presence makes the sweep wait (600 s by
    default), and its request makes the autoscaler launch a node of the type that fits. (Ray's
    fake provider then keeps removing its nodes as failed launches on this machine, so the
    sweep's run on the new node is the hand-added node's test above.)"""
    gpu_nodes = {"gpu_worker": {"resources": {"CPU": 1, "GPU": 1}, "node_config": {},
                                "min_workers": 0, "max_workers": 1}}
    head = RayHead(num_cpus=1, logs=logs_dir, autoscaled_node_types=gpu_nodes)
    monitor_logs = Path(head.temp_dir) / "session_latest" / "logs"
    spec = write_spec(tmp_path, GPU_TRIAL)
    log = tmp_path / "sweep.log"
    driver = start_orchestrate(["sweep", str(spec), "--address", head.address], cwd=tmp_path, log=log)
    try:
        wait_while_driving(
            lambda: "waiting for a node with 1 CPU and 1 GPU (asked the Ray autoscaler): 0s of 600s"
            in log.read_text(), driver, log, "the driver to ask for a GPU node", timeout=180)
        wait_while_driving(
            lambda: any("Adding 1 node(s) of type gpu_worker" in path.read_text(errors="replace")
                        for path in monitor_logs.glob("monitor*")),
            driver, log, "the autoscaler to launch a gpu_worker", timeout=120)
    finally:
        kill_session(driver)
        head.stop()
