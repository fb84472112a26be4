"""`orchestrate server --basic-auth`: MLflow's basic-auth app with the admin taken from the
environment. Requests without credentials are refused; a sweep whose environment holds
MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD logs its runs; no password is printed."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from sweep_helpers import ORCHESTRATE, run_orchestrate, write_spec

from nli_models.training import TRIAL_CONFIG_FILE
from orchestrator.ports import free_port
from results import run_schema as rs

pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs Flask-WTF")

USER, PASSWORD = "nli-admin", "pw-Ab3%xyz-long-enough"


def _get(url: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:  # not listening yet
        return 0


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """One server for the module's tests (each start costs seconds of imports and migrations)."""
    tmp_path = tmp_path_factory.mktemp("auth-server")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [ORCHESTRATE, "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts"), "--port", str(port), "--basic-auth"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 180
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    while _get(search, (USER, PASSWORD)) != 200:
        assert process.poll() is None, (tmp_path / "server.log").read_text()
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(1)
    yield url
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=30)
    log.close()
    assert PASSWORD not in (tmp_path / "server.log").read_text()


def test_basic_auth_needs_credentials_in_the_environment(tmp_path):
    for password in ("", "short"):
        result = run_orchestrate(
            ["server", "--backend-store-uri", f"sqlite:///{tmp_path / 's.db'}", "--basic-auth",
             "--artifacts-destination", str(tmp_path / "a")],
            cwd=tmp_path, timeout=120,
            env={"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": password},
        )
        assert result.returncode == 2, result.stderr
        assert "MLFLOW_TRACKING_PASSWORD" in result.stderr and "Traceback" not in result.stderr


def test_basic_auth_refuses_requests_without_credentials(auth_server):
    search = f"{auth_server}/api/2.0/mlflow/experiments/search?max_results=1"
    assert _get(search) == 401
    assert _get(search, (USER, "wrong")) == 401
    assert _get(search, (USER, PASSWORD)) == 200


def test_sweep_logs_with_credentials_from_the_environment(auth_server, tmp_path):
    spec = write_spec(tmp_path, {
        "name": "authed", "training": {"epochs": 1},
        "search": {"space": {"lr": {"grid": [0.003]}, "dropout": {"grid": [0.0]}},
                   "tracking_uri": auth_server},
    })
    without = run_orchestrate(["sweep", str(spec)], cwd=tmp_path, timeout=300,
                              env={"MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""})
    assert without.returncode != 0
    assert "Traceback" not in without.stderr
    result = run_orchestrate(
        ["sweep", str(spec)], cwd=tmp_path,
        env={"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD,
             "NLI_DATA_DIR": str(tmp_path / "data-cache")},
    )
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    # MLflow's own "View run ... at" lines (one pair per run it ends on a server) are suppressed:
    # the sweep prints its own links.
    assert "View run" not in result.stdout, result.stdout
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(
        f"{auth_server}/api/2.0/mlflow/runs/search", method="POST",
        data=json.dumps({"experiment_ids": [], "max_results": 10}).encode(),
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
    )
    experiments = json.load(urllib.request.urlopen(urllib.request.Request(
        f"{auth_server}/api/2.0/mlflow/experiments/get-by-name?experiment_name=authed",
        headers={"Authorization": f"Basic {token}"}), timeout=10))
    request.data = json.dumps({"experiment_ids": [experiments["experiment"]["experiment_id"]]}).encode()
    runs = json.load(urllib.request.urlopen(request, timeout=10))["runs"]
    assert sorted(r["info"]["status"] for r in runs) == ["FINISHED", "FINISHED"]
    # The trial's checkpoint went up through the server's artifact proxy, with the credentials.
    [trial] = [r for r in runs if {"key": rs.TAG_ROLE, "value": rs.ROLE_TRIAL} in r["data"]["tags"]]
    path = f"{trial['info']['artifact_uri'].split('mlflow-artifacts:/', 1)[1]}/{rs.ARTIFACT_CHECKPOINT_DIR}"
    listed = json.load(urllib.request.urlopen(urllib.request.Request(
        f"{auth_server}/api/2.0/mlflow-artifacts/artifacts?path={urllib.parse.quote(path)}",
        headers={"Authorization": f"Basic {token}"}), timeout=10))
    assert TRIAL_CONFIG_FILE in [f["path"] for f in listed["files"]], listed
