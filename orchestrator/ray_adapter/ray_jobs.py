"""The only module that talks to Ray's job API (ray.job_submission): a sweep submitted to a
running Ray cluster as a job whose driver runs `orchestrate sweep SPEC` on the head node. Also
the cluster's one other Ray call outside Tune: this node's address (node_ip, for SLURM's nodes).

The job ships the spec's folder (or the project, when the spec lies under the current folder) as
its runtime_env working_dir, so the cluster runs the submitter's code and spec; trials log to the
tracking server named by --tracking-uri / search.tracking_uri / MLFLOW_TRACKING_URI.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
import shlex
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from nli_models.errors import InputError, without_passwords
from orchestrator.sweep.environment import DEFAULTS

if TYPE_CHECKING:
    from nli_models.config import Overrides

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
ADDRESS_ENVS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # Ray's own precedence
CONNECT_TIMEOUT_S = 10.0
MAX_UPLOAD_MB = 100
# Never uploaded with a job: environments, VCS data, local results and tracking stores, caches.
WORKING_DIR_EXCLUDES = [
    ".venv",
    "venv",
    ".git",
    "ray_results",
    "mlruns",
    "mlruns.db",
    "mlartifacts",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "*.egg-info",
    "tracking-spool-*.jsonl",
    "tracking-journal-*.jsonl*",
]
# Ray/MLflow defaults the job driver gets (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is the cluster's
# business: its nodes already run with whatever it needs).
JOB_ENV_DEFAULTS = [k for k in DEFAULTS if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# The metadata a submitted job carries (Ray keeps it with the job; `orchestrate jobs` reads it).
JOB_SPEC = "nli.spec"  # the spec's path inside the job's working_dir
JOB_SPEC_NAME = "nli.spec_name"
JOB_TRACKING_URI = "nli.tracking_uri"  # without its password
JOB_STORAGE_PATH = "nli.storage_path"
JOB_PLANNED_TRIALS = "nli.planned_trials"


class ClusterError(RuntimeError):
    """A job command failed; `exit_code` 1: the cluster (or the request to it) failed."""

    exit_code = 1


class ClusterUnreachable(ClusterError):
    exit_code = 1


class JobInputError(ClusterError, InputError):
    """Bad input from the user (spec, options, unknown job id): exit code 2."""

    exit_code = 2


# -- addresses ------------------------------------------------------------------------------
def node_ip() -> str:
    """The address other nodes reach this one on (Ray's own choice for `ray start`)."""
    from ray.util import get_node_ip_address

    return get_node_ip_address()


def resolve_address(address: str | None = None) -> str:
    """The dashboard URL jobs go to: `address`, else RAY_API_SERVER_ADDRESS / RAY_ADDRESS, else
    http://127.0.0.1:8265. `HEAD:8265` becomes http://HEAD:8265."""
    source = "--address"
    if not address:
        for name in ADDRESS_ENVS:
            if os.environ.get(name):
                address, source = os.environ[name], name
                break
        else:
            return DEFAULT_ADDRESS
    address = address.strip().rstrip("/")
    if address in ("auto", "local") or address.startswith("ray://"):
        raise JobInputError(
            f"{source}={address!r} is not a Ray dashboard address; jobs are submitted to the "
            "head node's dashboard, e.g. --address http://HEAD:8265"
        )
    if "://" not in address:
        address = f"http://{address}"
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise JobInputError(
            f"{source}={address!r}: expected the dashboard URL http(s)://HOST:PORT (e.g. "
            f"{DEFAULT_ADDRESS})"
        )
    try:
        parts.port  # noqa: B018 (validates the port)
    except ValueError as exc:
        raise JobInputError(f"{source}={address!r}: {exc}") from None
    return address


@contextmanager
def _without_address_env() -> Iterator[None]:
    """Ray's client lets RAY_ADDRESS override the address it is given; we resolved it already."""
    saved = {name: os.environ.pop(name) for name in ADDRESS_ENVS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _unreachable(address: str, reason: str) -> ClusterUnreachable:
    return ClusterUnreachable(
        f"cannot reach the Ray cluster's dashboard at {address} ({reason}). Start the cluster "
        "(`ray up ray_cluster.yaml`, or `ray start --head`), forward its dashboard port "
        "(`ray dashboard ray_cluster.yaml`), or pass --address / set RAY_ADDRESS to "
        "http://HEAD:8265."
    )


def connect(address: str | None = None):
    """A JobSubmissionClient for the dashboard at `address` (see resolve_address)."""
    address = resolve_address(address)
    parts = urlsplit(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:  # fail fast: requests would wait for the OS connect timeout on a dropped packet
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise _unreachable(address, str(exc) or exc.__class__.__name__) from None
    from ray.job_submission import JobSubmissionClient

    try:
        with _without_address_env():
            return JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, a non-dashboard server, an old Ray
        raise _unreachable(address, str(exc) or exc.__class__.__name__) from None


# -- building a submission ------------------------------------------------------------------
@dataclass
class Submission:
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    submission_id: str
    spec_name: str
    tracking_uri: str
    warnings: list[str] = field(default_factory=list)


def parse_env(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise JobInputError(f"--env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env


def _is_local_relative_store(uri: str) -> bool:
    """A store that would live inside the job's throw-away working directory."""
    if uri.startswith("sqlite:///"):
        return not uri[len("sqlite:///"):].startswith("/")
    if uri.startswith("file:"):
        return not urlsplit(uri).path.startswith("/")
    return "://" not in uri and not uri.startswith("/") and uri not in ("databricks", "databricks-uc")


def _working_dir(spec_path: Path, working_dir: str | None, cwd: Path) -> Path:
    """--working-dir; else the current folder when it is a project (pyproject.toml) holding the
    spec, so the cluster runs this checkout's code; else the spec's own folder."""
    if working_dir:
        root = Path(working_dir).resolve()
        if not root.is_dir():
            raise JobInputError(f"--working-dir {working_dir}: not a folder")
    elif (cwd / "pyproject.toml").is_file() and spec_path.is_relative_to(cwd):
        root = cwd
    else:
        root = spec_path.parent
    if not spec_path.is_relative_to(root):
        raise JobInputError(f"{spec_path} is not inside the working directory {root} it ships with")
    return root


def _upload_size(root: Path, limit: int) -> int:
    """Bytes under `root` that the job would upload (stops counting past `limit`)."""
    total = 0
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in WORKING_DIR_EXCLUDES)]
        for name in files:
            if any(fnmatch.fnmatch(name, p) for p in WORKING_DIR_EXCLUDES):
                continue
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
            if total > limit:
                return total
    return total


def _check_upload_size(root: Path) -> None:
    size = _upload_size(root, MAX_UPLOAD_MB * 2**20)
    if size > MAX_UPLOAD_MB * 2**20:
        raise JobInputError(
            f"the job would upload more than {MAX_UPLOAD_MB} MiB from {root}; put the spec in "
            "a folder of its own, run from the project folder, or pass --working-dir "
            "(data sets belong on the cluster's storage, not in the upload)"
        )


def _job_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:40] or "sweep"


def override_arguments(overrides: Overrides | None) -> list[str]:
    """`--set`/`--data-dir` as the job's sweep command takes them (paths as given: they name
    folders on the cluster, which need not exist here)."""
    if not overrides:
        return []
    options = [part for text in overrides.assignments for part in ("--set", text)]
    if overrides.data_dir is not None:
        options += ["--data-dir", overrides.data_dir]
    return options


def load_submitted_spec(
    spec_path: str | Path,
    resume: bool,
    new: bool,
    overrides: Overrides | None,
    tracking_uri: str | None,
    error: type[JobInputError] = JobInputError,
):
    """(path, spec) of a spec about to be submitted to a cluster (Ray Jobs or SLURM), validated
    here with its overrides; `error` (exit code 2) names what is wrong before anything is sent."""
    from nli_models.config import ConfigError
    from orchestrator.sweep.spec import load_spec

    if resume and new:
        raise error("--resume and --new exclude each other")
    path = Path(spec_path)
    if not path.is_file():
        raise error(f"spec {spec_path} not found")
    try:
        return path, load_spec(path, overrides, tracking_uri)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        raise error(str(exc)) from None


def build_submission(
    spec_path: str | Path,
    *,
    tracking_uri: str | None = None,
    resume: bool = False,
    new: bool = False,
    working_dir: str | None = None,
    env: tuple[str, ...] | list[str] = (),
    submission_id: str | None = None,
    cwd: str | Path | None = None,
    overrides: Overrides | None = None,
) -> Submission:
    """Validate the spec (with the overrides) here, before anything reaches the cluster, and
    describe the job; the overrides travel in the job's `orchestrate sweep` command."""
    path, spec = load_submitted_spec(spec_path, resume, new, overrides, tracking_uri)
    path = path.resolve()
    root = _working_dir(path, working_dir, Path(cwd or os.getcwd()).resolve())
    _check_upload_size(root)
    uri = spec.tracking_uri
    if _is_local_relative_store(uri):
        raise JobInputError(
            f"tracking store {uri} would be created inside the job's temporary working "
            "directory on the cluster and lost; pass --tracking-uri http://HEAD:5000 (the "
            "server `orchestrate server` runs on the head node), or set search.tracking_uri / "
            "MLFLOW_TRACKING_URI"
        )

    env_vars = {k: os.environ.get(k, DEFAULTS[k]) for k in JOB_ENV_DEFAULTS}
    env_vars.update({"MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"})
    env_vars.update(parse_env(env))

    warnings = []
    if not spec.search.storage_path:
        warnings.append(
            "search.storage_path is not set: Ray Tune results and checkpoints go to ray_results "
            "in the job's working directory on the head node. On a multi-node cluster set it to "
            "shared storage (an NFS/EFS path mounted on every node, or s3://bucket/prefix)"
            + ("; --resume may not find the earlier sweep's results" if resume else "")
        )

    relative = path.relative_to(root).as_posix()
    command = ["orchestrate", "sweep", relative]
    if resume:
        command.append("--resume")
    if new:
        command.append("--new")
    command += override_arguments(overrides)
    job_id = submission_id or f"{_job_slug(spec.name)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    return Submission(
        entrypoint=shlex.join(command),
        runtime_env={
            "working_dir": str(root),
            "excludes": list(WORKING_DIR_EXCLUDES),
            "env_vars": env_vars,
        },
        metadata={
            JOB_SPEC: relative,
            JOB_SPEC_NAME: spec.name,
            JOB_TRACKING_URI: without_passwords(uri),
            JOB_STORAGE_PATH: spec.search.storage_path or "",
            JOB_PLANNED_TRIALS: str(spec.num_trials()),
        },
        submission_id=job_id,
        spec_name=spec.name,
        tracking_uri=uri,
        warnings=warnings,
    )


# -- talking to the job API -----------------------------------------------------------------
def _request_error(address: str, exc: Exception, job_id: str | None = None) -> ClusterError:
    text = str(exc)
    if job_id is not None and ("404" in text or "does not exist" in text):
        return JobInputError(f"no job {job_id!r} on the Ray cluster at {address}")
    if isinstance(exc, ConnectionError) or exc.__class__.__module__.startswith(("requests", "aiohttp")):
        return _unreachable(address, text or exc.__class__.__name__)
    return ClusterError(f"Ray cluster at {address}: {text}")


class Jobs:
    """The sweep jobs of one Ray cluster."""

    def __init__(self, address: str | None = None):
        self.address = resolve_address(address)
        self.client = connect(self.address)

    def submit(self, submission: Submission) -> str:
        try:
            return self.client.submit_job(
                entrypoint=submission.entrypoint,
                runtime_env=submission.runtime_env,
                metadata=submission.metadata,
                submission_id=submission.submission_id,
            )
        except Exception as exc:
            raise _request_error(self.address, exc) from None

    def list(self) -> list[Any]:
        try:
            jobs = self.client.list_jobs()
        except Exception as exc:
            raise _request_error(self.address, exc) from None
        return sorted(jobs, key=lambda j: j.start_time or 0)

    def info(self, job_id: str):
        try:
            return self.client.get_job_info(job_id)
        except Exception as exc:
            raise _request_error(self.address, exc, job_id) from None

    def status(self, job_id: str) -> str:
        return str(self.info(job_id).status.value)

    def logs(self, job_id: str) -> str:
        self.info(job_id)  # an unknown id is bad input, not a server error
        try:
            return self.client.get_job_logs(job_id)
        except Exception as exc:
            raise _request_error(self.address, exc, job_id) from None

    def follow(self, job_id: str, write: Callable[[str], None]) -> str:
        """Stream the job's logs until it ends; returns its final status."""
        self.info(job_id)

        async def tail() -> None:
            async for lines in self.client.tail_job_logs(job_id):
                write(lines)

        try:
            asyncio.run(tail())
        except Exception as exc:
            raise _request_error(self.address, exc, job_id) from None
        return self.wait(job_id, timeout_s=30)

    def stop(self, job_id: str, timeout_s: float = 30) -> tuple[bool, str]:
        """Ask the job to stop; returns (whether it was running, its status after waiting)."""
        self.info(job_id)
        try:
            stopped = self.client.stop_job(job_id)
        except Exception as exc:
            raise _request_error(self.address, exc, job_id) from None
        try:
            return stopped, self.wait(job_id, timeout_s=timeout_s)
        except TimeoutError:
            return stopped, self.status(job_id)

    def wait(self, job_id: str, timeout_s: float, poll_s: float = 1.0) -> str:
        """Poll until the job is SUCCEEDED, FAILED or STOPPED; TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status(job_id)
            if status in TERMINAL:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {status} after {timeout_s:.0f}s")
            time.sleep(poll_s)
