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
from testkit.cli import ORCHESTRATE, run_orchestrate
from testkit.ports import free_port
from testkit.processes import http_status
from testkit.specs import write_spec

from nli_models.training import TRIAL_CONFIG_FILE
from results import run_schema as rs

pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs Flask-WTF")

USER, PASSWORD = "nli-admin", "pw-Ab3%xyz-long-enough"


def _start_server(folder, *options: str, env: dict | None = None):
    """`orchestrate server` on a new SQLite store in `folder` (TMPDIR there too), in its own
    session; (process, url, log path) once it answers (with the admin's credentials)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (folder / "tmp").mkdir()
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD,
           "TMPDIR": str(folder / "tmp"), **(env or {})}
    log_path = folder / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [ORCHESTRATE, "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
             "--artifacts-destination", str(folder / "artifacts"), "--port", str(port), *options],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + 180
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    while http_status(search, (USER, PASSWORD)) != 200:
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(1)
    return process, url, log_path


def _stop_server(process, signum) -> int:
    os.killpg(process.pid, signum)
    return process.wait(timeout=60)


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """One server for the module's tests (each start costs seconds of imports and migrations)."""
    folder = tmp_path_factory.mktemp("auth-server")
    process, url, log = _start_server(folder, "--basic-auth")
    # While it runs, its private folder holds the auth app's settings (the database URI).
    [scratch] = list((folder / "tmp").glob("nli-auth-*"))
    assert oct(scratch.stat().st_mode & 0o777) == "0o700"
    yield url
    _stop_server(process, signal.SIGTERM)
    assert PASSWORD not in log.read_text()
    assert list((folder / "tmp").iterdir()) == []  # issue 27: no nli-auth-* folder left behind


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
    assert http_status(search) == 401
    assert http_status(search, (USER, "wrong")) == 401
    assert http_status(search, (USER, PASSWORD)) == 200


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


def test_basic_auth_server_stopped_by_ctrl_c_leaves_no_folder_and_no_server(tmp_path):
    process, url, _ = _start_server(tmp_path, "--basic-auth")
    assert len(list((tmp_path / "tmp").glob("nli-auth-*"))) == 1
    _stop_server(process, signal.SIGINT)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert http_status(f"{url}/health") == 0  # nothing listens any more


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "head.cluster.example"])
def test_a_server_others_can_reach_needs_authentication(tmp_path, host):
    """Issue 27: `--host 0.0.0.0` started a server any machine could write to."""
    result = run_orchestrate(
        ["server", "--backend-store-uri", f"sqlite:///{tmp_path / 's.db'}", "--host", host,
         "--artifacts-destination", str(tmp_path / "a")], cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: --host {host} listens beyond this machine")
    assert "--basic-auth" in result.stderr and "--no-auth" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # neither the store nor the artifacts folder


def test_no_auth_runs_an_open_server_with_a_warning(tmp_path):
    process, url, log = _start_server(tmp_path, "--host", "0.0.0.0", "--no-auth")
    try:
        assert http_status(f"{url}/api/2.0/mlflow/experiments/search?max_results=1") == 200  # open
        assert "warning: --no-auth: the server on 0.0.0.0 has no authentication" in log.read_text()
    finally:
        _stop_server(process, signal.SIGTERM)
    both = run_orchestrate(["server", "--backend-store-uri", f"sqlite:///{tmp_path / 'x.db'}",
                            "--basic-auth", "--no-auth"], cwd=tmp_path, timeout=120)
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_credentials_in_an_http_tracking_uri_are_used_and_never_printed(auth_server, tmp_path):
    """Issue 27: `http://user:pw@host:port` of a live server was "unreachable: Name or service
    not known" (urllib took `user:pw@host` for the host); `validate` printed the password in its
    overrides line and the sweep's parent run kept it in its nli.overrides tag."""
    host = auth_server.removeprefix("http://")
    uri = f"http://{USER}:{urllib.parse.quote(PASSWORD, safe='')}@{host}"
    no_env = {"MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""}
    spec = write_spec(tmp_path, {
        "name": "uri-credentials", "training": {"epochs": 1},
        "search": {"space": {"lr": {"grid": [0.003]}, "dropout": {"grid": [0.0]}}},
    })
    override = f"search.tracking_uri={uri}"
    validated = run_orchestrate(["validate", str(spec), "--no-data", "--set", override],
                                cwd=tmp_path, env=no_env, timeout=120)
    assert validated.returncode == 0, validated.stderr
    assert f"overrides: search.tracking_uri=http://{USER}:***@{host}" in validated.stdout
    swept = run_orchestrate(["sweep", str(spec), "--set", override], cwd=tmp_path,
                            env={**no_env, "NLI_DATA_DIR": str(tmp_path / "data-cache")})
    assert swept.returncode == 0, swept.stderr
    listed = run_orchestrate(["sweeps", "uri-credentials", "--tracking-uri", uri], cwd=tmp_path,
                             env=no_env, timeout=120)
    assert listed.returncode == 0 and "completed" in listed.stdout, listed.stdout + listed.stderr
    for result in (listed, validated, swept):
        output = result.stdout + result.stderr
        assert PASSWORD not in output and urllib.parse.quote(PASSWORD, safe="") not in output
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    found = json.load(urllib.request.urlopen(urllib.request.Request(
        f"{auth_server}/api/2.0/mlflow/experiments/get-by-name?experiment_name=uri-credentials",
        headers={"Authorization": f"Basic {token}"}), timeout=10))
    request = urllib.request.Request(
        f"{auth_server}/api/2.0/mlflow/runs/search", method="POST",
        data=json.dumps({"experiment_ids": [found["experiment"]["experiment_id"]]}).encode(),
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
    runs = json.load(urllib.request.urlopen(request, timeout=10))["runs"]
    [parent] = [r for r in runs if {"key": rs.TAG_ROLE, "value": rs.ROLE_SWEEP} in r["data"]["tags"]]
    tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
    assert json.loads(tags[rs.TAG_OVERRIDES]) == [f"search.tracking_uri=http://{USER}:***@{host}"]
    assert all(PASSWORD not in v and "%25" not in v for v in tags.values())  # description too
    assert "](#/experiments/" in tags[rs.TAG_MLFLOW_NOTE]  # relative: no host, no credentials
    # The links the sweep prints are the server's own, without the credentials.
    assert f"{auth_server}/#/experiments/" in swept.stdout + swept.stderr
