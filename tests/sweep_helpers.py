"""Small sweep specs on the generated toy corpus, written to a test's folder."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from mlflow import MlflowClient

REPO_ROOT = Path(__file__).resolve().parents[1]
ORCHESTRATE = str(Path(sys.executable).with_name("orchestrate"))

BASE_SPEC: dict[str, Any] = {
    "name": "tiny",
    "model": {
        "name": "decomposable",
        "variant": "vanilla",
        "args": {"embedding_dim": 16, "projection_dim": 16, "hidden_size": 16, "dropout": 0.0},
    },
    "data": {"corpus": "toy", "toy": {"size": 600, "seed": 0}},
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
    return subprocess.run(
        [ORCHESTRATE, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
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
