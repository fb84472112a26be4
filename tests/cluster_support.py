"""What the cluster tests share: processes in their own process groups (stopped by group id,
never by name), PostgreSQL on 127.0.0.1:5432 with a fresh database per module, `orchestrate
server` on it, quickstart specs that log to it, and the CLI run in-process.

The fixtures (postgres_uri, logs_dir, tracking) are registered in conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from orchestrator.ports import free_port, free_ports

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"


# -- processes --------------------------------------------------------------------------------
def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # job drivers run `orchestrate`
        RAY_AUTH_MODE="disabled",
        # Needed by `ray start --address` (a second node); nodes then register the machine's IP.
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1",
        RAY_USAGE_STATS_ENABLED="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        PYTHONUNBUFFERED="1",
    )
    return env


class Group:
    """A command started in its own session; stop() ends its whole process group."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.argv = argv
        self.log = log
        self._log = open(log, "ab")  # closed in stop()
        self.proc = subprocess.Popen(
            argv, env=env or base_env(), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 5.0) -> None:
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever is left of the group (children outlive a leader that exited)
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.5, groups=()):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        for group in groups:
            if not group.alive():
                pytest.fail(f"{group.argv[:3]} exited while waiting for {what}:\n{group.tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def http_ok(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except OSError:
        return False


# -- Ray --------------------------------------------------------------------------------------
def stop_ray_nodes(groups: list[Group]) -> None:
    """End Ray nodes (`ray start --block` groups) by process group, at once: their processes end
    with the group, and workers (in groups of their own) exit once their raylet is gone. Given
    SIGTERM, `ray start` outlasted a 5 s grace every time."""
    for group in groups:
        group.stop(grace_s=0)


def node_ports(avoid: frozenset[int] = frozenset()) -> list[str]:
    """Distinct free ports for a Ray node's own servers, none in `avoid` (ports given to the
    node's other servers): two nodes (or Ray instances) on one machine must not both take Ray's
    fixed defaults."""
    flags = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
    ports = free_ports(len(flags), host="127.0.0.1", avoid=avoid)
    return [item for flag, port in zip(flags, ports, strict=True) for item in (flag, str(port))]


class RayHead:
    """`ray start --head --block` on 127.0.0.1 in its own process group, with a temp dir of its
    own: `address` (GCS) is what `orchestrate sweep --address` and a worker node join,
    `dashboard` what `orchestrate submit/jobs/logs --address` talk to. With
    `autoscaled_node_types` (the `available_node_types` of a cluster config), its autoscaler
    starts nodes of those types on this machine when asked (Ray's fake multi-node provider, as
    ray.cluster_utils.AutoscalingCluster uses, which would `ray stop --force` every Ray here)."""

    def __init__(self, num_cpus: int, logs: Path, autoscaled_node_types: dict | None = None):
        gcs, dashboard, client = free_ports(3, host="127.0.0.1")
        self.address = f"127.0.0.1:{gcs}"
        self.dashboard = f"http://127.0.0.1:{dashboard}"
        self.temp_dir = tempfile.mkdtemp(prefix="nlirh", dir="/tmp")  # short: Ray's socket paths
        env, autoscaling = base_env(), []
        if autoscaled_node_types is not None:
            config = Path(self.temp_dir) / "autoscaler.json"
            config.write_text(json.dumps(_fake_cluster_config(self.address, num_cpus, autoscaled_node_types)))
            autoscaling = ["--autoscaling-config", str(config)]
            env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
        self.group = Group(
            [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
             "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
             "--ray-client-server-port", str(client), "--num-cpus", str(num_cpus),
             "--num-gpus", "0", "--temp-dir", self.temp_dir, "--disable-usage-stats", *autoscaling,
             *node_ports(avoid=frozenset({gcs, dashboard, client}))],
            logs / "ray-head.log", env=env,
        )
        try:
            wait_for(lambda: http_ok(f"{self.dashboard}/api/version"), 90,
                     f"the Ray dashboard at {self.dashboard}", groups=[self.group])
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_ray_nodes([self.group])
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _fake_cluster_config(gcs_address: str, head_cpus: int, node_types: dict) -> dict:
    """A cluster config whose nodes Ray's fake multi-node provider starts as local processes."""
    return {
        "cluster_name": "nli-test", "max_workers": sum(t["max_workers"] for t in node_types.values()),
        "upscaling_speed": 1, "idle_timeout_minutes": 1, "auth": {"ssh_user": "test"},
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address},
        "available_node_types": {
            **node_types,
            "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
        },
        "head_node_type": "ray.head.default",
        **{key: [] for key in ("cluster_synced_files", "rsync_exclude", "rsync_filter",
                               "initialization_commands", "setup_commands", "head_setup_commands",
                               "worker_setup_commands", "head_start_ray_commands",
                               "worker_start_ray_commands")},
        "file_mounts": {}, "file_mounts_sync_continuously": False,
    }


class RayWorker:
    """`ray start --address HEAD --block`: one more node (`num_gpus` logical GPUs) in its own
    process group, with a temp dir of its own, as a separate machine would have (a shared one
    lets a node delete the other's unpacked job working dir)."""

    def __init__(self, head: RayHead, num_cpus: int, num_gpus: int, log: Path):
        self.temp_dir = tempfile.mkdtemp(prefix="nlirw", dir="/tmp")
        self.group = Group(
            [str(BIN / "ray"), "start", "--address", head.address, "--block", "--node-ip-address",
             "127.0.0.1", "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus),
             "--temp-dir", self.temp_dir, *node_ports()],
            log,
        )

    def stop(self) -> None:
        stop_ray_nodes([self.group])
        shutil.rmtree(self.temp_dir, ignore_errors=True)


# -- PostgreSQL -------------------------------------------------------------------------------
def _pg_connect(database: str = "postgres"):
    import psycopg2

    return psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=database, connect_timeout=5)


def _ensure_postgres() -> str | None:
    """None when PostgreSQL answers (starting the local cluster if needed), else the reason."""
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install psycopg2-binary)"
    try:
        _pg_connect().close()
        return None
    except Exception as exc:
        first = str(exc).strip()
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not versions or not shutil.which("pg_ctlcluster"):
        return f"PostgreSQL not reachable at {PG_HOST}:{PG_PORT} ({first}) and no local cluster to start"
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"],
        capture_output=True, timeout=60,
    )
    try:
        _pg_connect().close()
        return None
    except Exception as exc:
        return (f"PostgreSQL not reachable at {PG_HOST}:{PG_PORT} and "
                f"`pg_ctlcluster {versions[-1]} main start` did not help: {exc}")


def new_database():
    """A new, empty database on the local PostgreSQL (trust auth), dropped afterwards; the test
    skips with the reason where PostgreSQL cannot be had."""
    reason = _ensure_postgres()
    if reason:
        pytest.skip(reason)
    name = f"nli_test_{uuid.uuid4().hex[:10]}"
    connection = _pg_connect()
    connection.autocommit = True
    connection.cursor().execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        connection.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        connection.close()


postgres_uri = pytest.fixture(scope="module", name="postgres_uri")(new_database)
fresh_postgres = pytest.fixture(name="fresh_postgres")(new_database)  # one per test


# -- MLflow tracking server -------------------------------------------------------------------
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


# -- sweeps -----------------------------------------------------------------------------------
def write_spec(folder: Path, name: str, tracking_url: str, *, epochs: int = 4,
               grid: dict | None = None, toy_size: int | None = None,
               storage_path: str | None = None) -> Path:
    """A copy of search_spaces/quickstart.yaml logging to `tracking_url`, results in `folder`."""
    spec = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    spec["name"] = name
    if toy_size is not None:
        spec["data"]["toy"]["size"] = toy_size
    spec["training"]["epochs"] = epochs
    if grid is not None:
        spec["search"]["space"] = {k: {"grid": v} for k, v in grid.items()}
    spec["search"]["tracking_uri"] = tracking_url
    spec["search"]["storage_path"] = storage_path or str(folder / "ray_results")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def orchestrate(*args: str) -> Result:
    """`orchestrate ARGS` in this process (click's runner; a subprocess costs seconds of imports)."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    env = {"RAY_ADDRESS": None, "RAY_API_SERVER_ADDRESS": None, "MLFLOW_TRACKING_URI": None}
    result = CliRunner(env=env).invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Result(result.exit_code, result.stdout, result.stderr)


def http_status(url: str, auth: tuple[str, str] | None = None) -> int:
    """The HTTP status a GET of `url` gets (with basic-auth credentials when given); 0 when
    nothing answers (not listening yet, or any more)."""
    import base64
    import urllib.error

    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0
