"""`orchestrate ui` serves the MLflow UI for the configured store on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient
from testkit.ports import free_port


@pytest.mark.check
def test_ui_serves_the_store(tmp_path):
    port = free_port()
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    MlflowClient(uri).search_experiments()  # an existing (empty) store
    orchestrate = str(Path(sys.executable).with_name("orchestrate"))
    log = (tmp_path / "ui.log").open("w")
    process = subprocess.Popen(
        [orchestrate, "ui", "--tracking-uri", uri, "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 90
        body = None
        while time.monotonic() < deadline and body is None:
            assert process.poll() is None, (tmp_path / "ui.log").read_text()
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=5", timeout=2
                ) as response:
                    body = response.read().decode()
            except OSError:
                time.sleep(0.5)
        assert body is not None, "the UI did not answer in time"
        assert '"Default"' in body  # the store's default experiment, served over HTTP
        assert f"http://127.0.0.1:{port}" in (tmp_path / "ui.log").read_text()
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        log.close()


def test_ui_on_a_store_that_does_not_exist_creates_nothing(tmp_path):
    """A mistyped store is an error naming it (exit 2), not an empty UI over a new empty store."""
    orchestrate = str(Path(sys.executable).with_name("orchestrate"))
    missing = tmp_path / "sweeps" / "mlruns.db"
    (tmp_path / "sweeps").mkdir()
    result = subprocess.run(
        [orchestrate, "ui", "--tracking-uri", f"sqlite:///{missing}", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and str(missing) in result.stderr
    assert "--tracking-uri" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert list((tmp_path / "sweeps").iterdir()) == []
