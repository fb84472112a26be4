"""Shared fixtures: environment for Ray/MLflow, the shared-data location, a local Ray instance,
the prepared toy corpus and torch on one thread. Nothing heavy is imported here (collecting the
suite loads what the test modules themselves import); the helpers are in the testkit package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from testkit import SEAMS

# The cluster tests' PostgreSQL database and MLflow server (module-scoped), and the one-node SLURM
# cluster (session-scoped).
from testkit.postgres import fresh_postgres, postgres_uri  # noqa: F401
from testkit.slurm import slurm_cluster  # noqa: F401
from testkit.toy import TOY
from testkit.tracking_server import logs_dir, tracking  # noqa: F401

from orchestrator.sweep.environment import configure_environment

configure_environment()
# The test-only seams in this process and in every process it starts (a local Ray's workers,
# Ray nodes, subprocesses that inherit the environment): tests/seams/sitecustomize.py.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SEAMS), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(SEAMS))
import sitecustomize  # noqa: E402, F401 (installs the seams in this process)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "snli_1.0" / "snli_1.0_dev.jsonl").exists():
        pytest.skip(f"real corpora not found at {SHARED_DATA} (only on the project's dev machines)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def ray_session():
    """One real local Ray instance for a module's in-process sweep tests (starting one takes
    seconds), started and stopped as a sweep does it (init_ray: a private instance even when
    another Ray cluster runs on this machine). Per module, not per session: an idle instance
    still uses about 4.5% of a core (benchmarks/README.md, "sweep_cpu"), and a worker's session
    lasts to the end of the suite."""
    import ray

    from orchestrator.ray_adapter.ray_runtime import init_ray, shutdown_ray

    init_ray()
    yield ray
    shutdown_ray()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy corpus of testkit.toy.TOY, prepared once per module."""
    from nli_models.data import prepare_data

    return prepare_data(TOY, cache_dir=tmp_path_factory.mktemp("prepared"))


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module: tiny models gain nothing from a second thread and lose
    much when the 2 cores are busy."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """Run in a fresh folder: the default MLflow store and Ray results land there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    os.environ.setdefault("NLI_DATA_DIR", str(tmp_path / "data-cache"))
    return tmp_path
