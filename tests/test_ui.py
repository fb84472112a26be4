"""`orchestrate ui` serves the MLflow UI for the configured store on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from orchestrator.ports import free_port


def test_ui_serves_the_store(tmp_path):
    port = free_port()
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
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
