"""`orchestrate server`: the MLflow tracking server sweeps log to over HTTP.

A lean `mlflow server`: one uvicorn worker, MLflow's job executor off (no huey consumers), runs in
a database backend (PostgreSQL on a cluster) with artifacts proxied by the server to a folder on
shared storage or an object store (s3://, gs://, ...). The backend is checked before the server
starts, so a wrong URI or a stopped database is one clear line instead of a traceback.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "sqlite")
DRIVER_HINTS = {
    "postgresql": ("psycopg2", "pip install psycopg2-binary"),
    "mysql": ("pymysql", "pip install pymysql"),
}


class ServerError(RuntimeError):
    exit_code = 1


class ServerInputError(ServerError):
    exit_code = 2


def mask_uri(uri: str) -> str:
    """The URI with its password replaced by ***, for messages."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


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


def server_command(
    backend_store_uri: str,
    artifacts_destination: str,
    host: str = "127.0.0.1",
    port: int = 5000,
    workers: int = 1,
    allowed_hosts: str | None = None,
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
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true"),
    }
    return argv, env


def tracking_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}"


def wait_until_up(url: str, timeout_s: float = 60.0, alive=lambda: True) -> None:
    """Poll GET {url}/health until the server answers; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            return
        except (urllib.error.URLError, OSError):
            if not alive():
                raise ServerError(f"the MLflow server for {url} exited during startup") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"MLflow server at {url} not up after {timeout_s:.0f}s") from None
            time.sleep(0.3)
