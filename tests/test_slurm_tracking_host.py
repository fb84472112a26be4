"""The README's SLURM server recipe with a host name (issue 29): `orchestrate server --host
0.0.0.0` accepts requests addressed by this machine's name (MLflow refuses Host headers it was not
told with 403, and /health does not show it), prints the --tracking-uri to give jobs, and
`submit --slurm --dry-run` probes the API with the Host header a job sends: a name the server
refuses is exit 1 naming the cause and the fix. No SLURM needed: the probe runs before sbatch."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time

import pytest
from test_slurm import spec_file
from testkit.cli import ORCHESTRATE, run_orchestrate
from testkit.ports import free_port
from testkit.processes import http_status

from orchestrator.cluster.tracking_server import allowed_hosts, host_names

SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """The recipe's server (--host 0.0.0.0; --no-auth as this test's network is the machine
    itself) on a new SQLite store; (the URL it prints for jobs, its port)."""
    folder = tmp_path_factory.mktemp("host-server")
    port = free_port()
    log_path = folder / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [ORCHESTRATE, "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
             "--artifacts-destination", str(folder / "artifacts"), "--host", "0.0.0.0",
             "--port", str(port), "--no-auth"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while http_status(f"http://127.0.0.1:{port}{SEARCH}") != 200:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(1)
        printed = re.search(r"--tracking-uri (http://\S+?)\.? ", log_path.read_text())
        assert printed, log_path.read_text()
        yield printed.group(1), port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_the_server_accepts_this_machines_name_and_submit_probes_it(open_server, tmp_path):
    url, port = open_server
    # The URL printed for jobs names this machine, and the API (not only /health) answers it.
    assert url == f"http://{socket.gethostname()}:{port}" or url == f"http://{socket.getfqdn()}:{port}"
    assert http_status(url + SEARCH) == 200
    spec = spec_file(tmp_path, tracking_uri=None)
    result = run_orchestrate(["submit", str(spec), "--slurm", "--dry-run", "--tracking-uri", url],
                             cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"export MLFLOW_TRACKING_URI={url}" in result.stdout
    assert "does not answer" not in result.stderr and "refuses" not in result.stderr


def test_submit_names_a_refused_host_header_and_the_fix(open_server, tmp_path):
    """127.0.0.2 reaches the server (all of 127/8 is loopback) but is no name it accepts:
    /health answers, the API is 403, and submit says why before anything is queued."""
    _, port = open_server
    url = f"http://127.0.0.2:{port}"
    assert http_status(f"{url}/health") == 200 and http_status(url + SEARCH) == 403
    spec = spec_file(tmp_path, tracking_uri=None)
    for dry_run in (("--dry-run",), ()):
        result = run_orchestrate(["submit", str(spec), "--slurm", *dry_run, "--tracking-uri", url],
                                 cwd=tmp_path, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
        assert result.returncode == 1, result.stderr
        error = result.stderr.strip().splitlines()[-1]
        assert f"refuses the Host header '127.0.0.2:{port}'" in error
        assert "`orchestrate server --host 0.0.0.0` on 127.0.0.2" in error
        assert "`--allowed-hosts 127.0.0.2`" in error
    assert "Nothing was submitted" in error
    assert not (tmp_path / "cache").exists()  # no job recorded


def test_allowed_hosts_adds_this_machines_names_to_mlflows_defaults():
    hosts = allowed_hosts("login01,mlflow.example:443").split(",")
    for name in host_names():
        assert name in hosts and f"{name}:*" in hosts
    assert {"localhost:*", "127.0.0.1:*", "10.*", "login01", "login01:*", "mlflow.example:443"} <= set(hosts)
    assert "mlflow.example:443:*" not in hosts
    assert allowed_hosts("*") == "*"
