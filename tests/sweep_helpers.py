"""Small sweep specs on the generated toy corpus, written to a test's folder."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from mlflow import MlflowClient
from toy_configs import decomposable, toy_data

from orchestrator.reaper import same_process
from results import run_schema as rs

REPO_ROOT = Path(__file__).resolve().parents[1]
ORCHESTRATE = str(Path(sys.executable).with_name("orchestrate"))

BASE_SPEC: dict[str, Any] = {
    "name": "tiny",
    "model": decomposable(dim=16, dropout=0.0),
    "data": toy_data(600),
    "training": {"optimizer": "adam", "lr": 0.003, "batch_size": 32, "epochs": 3},
    "search": {
        "sampler": "grid",
        "space": {"lr": {"grid": [0.001, 0.01]}, "dropout": {"grid": [0.0, 0.2]}},
        "seeds": [1],
        "max_concurrent_trials": 2,
        "resources": {"cpu": 1},
    },
}


def merge(base: dict, override: dict) -> dict:
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def write_spec(folder: Path, override: dict | None = None, replace_search: dict | None = None) -> Path:
    spec = merge(BASE_SPEC, override or {})
    if override and "model" in override:  # another model's arguments do not mix with these
        spec["model"] = copy.deepcopy(override["model"])
    if replace_search is not None:
        spec["search"] = replace_search
    spec["search"].setdefault("tracking_uri", f"sqlite:///{folder / 'mlruns.db'}")
    spec["search"].setdefault("storage_path", str(folder / "ray_results"))
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def client_for(folder: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlruns.db'}")


def runs_of(folder: Path, experiment: str) -> tuple[list, list]:
    """(parent runs, child runs) of an experiment."""
    client = client_for(folder)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("nli.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("nli.role") == "trial"]
    return parents, children


def runs_so_far(folder: Path, experiment: str) -> tuple[list, list]:
    """runs_of, or no runs while the store or the experiment does not exist yet."""
    try:
        return runs_of(folder, experiment)
    except Exception:
        return [], []


def store_ready(log: Path) -> bool:
    """The driver logging to `log` has created its store: reading it before races with MLflow's
    schema migration."""
    return "parent run" in log.read_text()


def trial_running(folder: Path, experiment: str, log: Path, epochs_logged: int = 0):
    """A condition: a trial run is RUNNING (with at least one epoch logged if `epochs_logged`)."""
    def check() -> bool:
        if not store_ready(log):
            return False
        _, children = runs_so_far(folder, experiment)
        return any(
            c.info.status == "RUNNING"
            and (not epochs_logged or rs.METRIC_DEV_ACCURACY in c.data.metrics)
            for c in children
        )
    return check


def trials_finished(folder: Path, experiment: str, log: Path, count: int):
    """A condition: at least `count` trial runs are FINISHED."""
    def check() -> bool:
        if not store_ready(log):
            return False
        _, children = runs_so_far(folder, experiment)
        return sum(c.info.status == "FINISHED" for c in children) >= count
    return check


def wait_while_driving(condition, driver: subprocess.Popen, log: Path, what: str, timeout: float = 240):
    """Poll until `condition()` is true while the driver lives; its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"driver ended (rc {driver.returncode}) before {what}:\n{log.read_text()}"
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()}")


def start_orchestrate(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """`orchestrate ARGS` in its own session, so the test can kill it and every process it
    started (the local Ray instance included) by process group. Output goes to `log` (a pipe
    nobody reads would block the driver once full)."""
    with log.open("w") as handle:
        return subprocess.Popen(
            [ORCHESTRATE, *args],
            cwd=cwd,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_orchestrate(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 400):
    """`orchestrate ARGS` with this process's environment and `env` (a None value unsets)."""
    return subprocess.run(
        [ORCHESTRATE, *args],
        cwd=cwd,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL the whole session of `process` (driver, raylet, GCS, workers)."""
    sid = process.pid
    subprocess.run(["pkill", "-9", "-s", str(sid)], check=False)
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def assert_processes_gone(processes: dict[int, int], timeout: float = 30) -> None:
    """Every process of `processes` (pid: start time, as orchestrator.reaper.descendants gives
    them) has exited within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    alive = processes
    while time.monotonic() < deadline:
        alive = {pid: start for pid, start in alive.items() if same_process(pid, start)}
        if not alive:
            return
        time.sleep(0.5)
    raise AssertionError(f"processes left behind: {sorted(alive)}")
