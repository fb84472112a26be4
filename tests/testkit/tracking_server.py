"""`orchestrate server` on a free port, stopped and started again for outage tests; the module
fixtures `logs_dir` and `tracking` (a server on the module's PostgreSQL database) are registered
in conftest.py."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from testkit import BIN
from testkit.ports import free_port
from testkit.processes import Group, http_ok, wait_for


class TrackingServer:
    """`orchestrate server` on a fixed port; stop() and start() again for outage tests."""

    def __init__(self, backend: str, artifacts: Path, logs: Path):
        self.backend = backend
        self.artifacts = artifacts
        self.logs = logs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.group: Group | None = None

    def start(self) -> None:
        argv = [str(BIN / "orchestrate"), "server", "--backend-store-uri", self.backend,
                "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1",
                "--port", str(self.port)]
        self.group = Group(argv, self.logs / "mlflow-server.log")
        wait_for(lambda: http_ok(f"{self.url}/health"), 90, f"MLflow server at {self.url}",
                 groups=[self.group])

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None
        wait_for(lambda: not http_ok(f"{self.url}/health"), 20, "the MLflow server to go away")

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.url)


@pytest.fixture(scope="module")
def logs_dir():
    path = Path(tempfile.mkdtemp(prefix="nli-cluster-logs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tracking(postgres_uri, logs_dir, tmp_path_factory):
    server = TrackingServer(postgres_uri, tmp_path_factory.mktemp("mlartifacts"), logs_dir)
    try:
        server.start()
        yield server
    finally:
        if server.group is not None:
            server.group.stop()
