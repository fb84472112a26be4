"""`orchestrate server`: the MLflow tracking server sweeps log to over HTTP.

A lean `mlflow server`: one uvicorn worker, MLflow's job executor off (no huey consumers), runs in
a database backend (PostgreSQL on a cluster) with artifacts proxied by the server to a folder on
shared storage or an object store (s3://, gs://, ...). The backend is checked before the server
starts, so a wrong URI or a stopped database is one clear line instead of a traceback.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from nli_models.errors import InputError, mask_secrets

DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "sqlite")
DRIVER_HINTS = {
    "postgresql": ("psycopg2", "pip install psycopg2-binary"),
    "mysql": ("pymysql", "pip install pymysql"),
}


class ServerError(RuntimeError):
    exit_code = 1


class ServerInputError(ServerError, InputError):
    """Bad input to `orchestrate server` (an option, the store's URI): exit code 2."""

    exit_code = 2


mask_uri = mask_secrets  # one masking rule for every message (nli_models.errors)

USERNAME_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"


def is_loopback(host: str) -> bool:
    """Only this machine can connect to a server listening on `host`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it resolves to an interface others may reach


def check_exposure(host: str, basic_auth: bool, no_auth: bool) -> str | None:
    """ServerInputError for a server other machines could reach with no authentication unless
    --no-auth says so explicitly; then the warning to print (None when there is nothing to say)."""
    if basic_auth and no_auth:
        raise ServerInputError("--basic-auth and --no-auth exclude each other")
    if basic_auth or is_loopback(host):
        return None
    if not no_auth:
        raise ServerInputError(
            f"--host {host} listens beyond this machine: without authentication anyone who can "
            "reach it reads and writes every run and artifact. Pass --basic-auth (the admin from "
            f"{USERNAME_ENV} / {PASSWORD_ENV}), or --no-auth on a network only you use"
        )
    return (f"--no-auth: the server on {host} has no authentication; every machine that reaches "
            "it can read and write every run and artifact")


def run_until_stopped(argv: list[str], env: dict[str, str], scratch: Path) -> int:
    """Run the server as a child (its own process group) and remove `scratch` (the auth app's ini
    file, which names the database with its password) when it ends: SIGINT, SIGTERM and SIGHUP
    are passed on to the server, which stops; then the folder goes. Returns its exit code (128 +
    the signal's number when a signal ended it, as a shell reports it)."""
    try:
        process = subprocess.Popen(argv, env=env, start_new_session=True)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise

    def forward(signum, _frame) -> None:
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        code = process.wait()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 128 - code if code < 0 else code


def basic_auth_settings(backend_store_uri: str, folder: Path) -> dict[str, str]:
    """Environment of `mlflow server --app-name basic-auth`: the admin is the user named by
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (the variables MLflow clients, and so
    sweeps, send as credentials); users live in the backend database (own tables and migration
    table); users other than the admin may read every experiment and change only their own."""
    username, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if not username or not password:
        raise ServerInputError(
            f"--basic-auth: set {USERNAME_ENV} and {PASSWORD_ENV} (the admin's credentials; "
            "sweeps log with the same variables) in the environment, not on the command line"
        )
    if len(password) < 12:
        raise ServerInputError(f"--basic-auth: {PASSWORD_ENV} must be at least 12 characters "
                               "(MLflow's rule for the admin password)")
    config = folder / "basic_auth.ini"
    config.write_text(
        "[mlflow]\n"
        "default_permission = READ\n"
        # configparser interpolates '%' (URL-encoded passwords): written as '%%'.
        f"database_uri = {backend_store_uri.replace('%', '%%')}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    config.chmod(0o600)  # the database URI may hold the database's password
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_AUTH_ADMIN_USERNAME": username,
        "MLFLOW_AUTH_ADMIN_PASSWORD": password,
        # CSRF protection of the auth app needs a key that all workers share.
        "MLFLOW_FLASK_SERVER_SECRET_KEY": os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY")
        or secrets.token_hex(32),
    }


def check_backend(uri: str, timeout_s: int = 10) -> None:
    """Connect to the backend store once; ServerInputError/ServerError with the reason."""
    scheme = urlsplit(uri).scheme.split("+", 1)[0]
    if scheme not in DATABASE_SCHEMES:
        raise ServerInputError(
            f"--backend-store-uri {mask_uri(uri)}: expected a database URI "
            "(postgresql://USER@HOST:5432/DB, mysql://..., sqlite:////abs/path.db)"
        )
    if scheme in DRIVER_HINTS and "+" not in urlsplit(uri).scheme:
        module, hint = DRIVER_HINTS[scheme]
        try:
            __import__(module)
        except ImportError:
            raise ServerInputError(f"{mask_uri(uri)} needs the {module} driver: {hint}") from None
    import sqlalchemy

    connect_args = {"connect_timeout": timeout_s} if scheme in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=connect_args)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:  # OperationalError, ArgumentError, ...
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise ServerError(f"backend store {mask_uri(uri)} is unreachable: {reason}") from None


def artifacts_location(destination: str) -> str:
    """A URI (s3://bucket/prefix, ...) as given; a local folder made absolute and created."""
    if "://" in destination and not destination.startswith("file://"):
        return destination
    path = Path(destination.removeprefix("file://")).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServerInputError(f"--artifacts-destination {destination}: {exc}") from None
    return str(path)


def mlflow_executable() -> str:
    beside = Path(sys.executable).with_name("mlflow")
    if beside.exists():
        return str(beside)
    found = shutil.which("mlflow")
    if not found:
        raise ServerError("the mlflow command is not installed in this environment")
    return found


SERVER_THREADS = 40  # anyio's default thread limiter, which runs uvicorn's WSGI requests


def server_command(
    backend_store_uri: str,
    artifacts_destination: str,
    host: str = "127.0.0.1",
    port: int = 5000,
    workers: int = 1,
    allowed_hosts: str | None = None,
    auth: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the lean `mlflow server`."""
    argv = [
        mlflow_executable(),
        "server",
        "--backend-store-uri", backend_store_uri,
        "--artifacts-destination", artifacts_destination,
        "--serve-artifacts",
        "--host", host,
        "--port", str(port),
        "--workers", str(workers),
    ]
    if allowed_hosts:
        argv += ["--allowed-hosts", allowed_hosts]
    if auth is not None:
        argv += ["--app-name", "basic-auth"]
    env = {
        **os.environ,
        **(auth or {}),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true"),
        # A database connection for every request thread of a worker (uvicorn runs the WSGI app
        # on anyio's 40 threads), and as many again on demand: MLflow's log_batch holds a session
        # while it opens others for params and metrics, so with as many connections as threads
        # every thread could hold one and wait for a second. With SQLAlchemy's default 5 + 10,
        # 32 clients at once waited for a connection until the pool's 30 s timeout (400s,
        # ~2 batches/s; benchmarks/README.md, "scale_tracking"). A user's own values win.
        "MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": os.environ.get("MLFLOW_SQLALCHEMYSTORE_POOL_SIZE", str(SERVER_THREADS)),
        "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": os.environ.get(
            "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW", str(SERVER_THREADS)
        ),
    }
    return argv, env


def tracking_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}"


def host_names() -> list[str]:
    """The names other machines use for this one: its host name, short name and FQDN."""
    hostname = socket.gethostname()
    return list(dict.fromkeys(n for n in (hostname, hostname.split(".")[0], socket.getfqdn()) if n))


def allowed_hosts(extra: str | None) -> str:
    """--allowed-hosts of `mlflow server`. MLflow checks every request's Host header (DNS-rebinding
    protection) and by default accepts only localhost and private IP literals, so a job given
    --tracking-uri http://login01:5000 (Host: login01:5000) gets 403. Allowed: MLflow's defaults,
    this machine's names and the user's (comma-separated) entries, each with any port."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    given = [h.strip() for h in (extra or "").split(",") if h.strip()]
    if "*" in given:
        return "*"
    names = []
    for name in host_names() + given:
        names += [name] if "*" in name or name.count(":") == 1 else [name, f"{name}:*"]
    return ",".join(dict.fromkeys(get_default_allowed_hosts() + names))


def url_for_jobs(host: str, port: int) -> str:
    """The --tracking-uri to give jobs: this machine's name when the server listens on every
    interface (a compute node cannot use 127.0.0.1), else the address it listens on."""
    if host in ("0.0.0.0", "::", ""):
        fqdn = socket.getfqdn()
        return f"http://{fqdn if '.' in fqdn else socket.gethostname()}:{port}"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"
