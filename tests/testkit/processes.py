"""Processes a test starts and ends (by process group, never by name), and waits on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from testkit import BIN, REPO


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


def run_probe(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -c CODE ARGS` with this worktree's code and testkit, in a bare environment (Ray's
    settings only): a process of its own for a claim about process-wide state (signal handlers,
    child processes, what a new process has imported)."""
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


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


def wait_while_driving(condition, driver: subprocess.Popen, log: Path, what: str, timeout: float = 240):
    """Poll until `condition()` is true while the driver lives; its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"driver ended (rc {driver.returncode}) before {what}:\n{log.read_text()}"
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()}")


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL the whole session of `process` (driver, raylet, GCS, workers)."""
    sid = process.pid
    subprocess.run(["pkill", "-9", "-s", str(sid)], check=False)
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def assert_processes_gone(processes: dict[int, int], timeout: float = 30) -> None:
    """Every process of `processes` (pid: start time, as orchestrator.ray_adapter.reaper.descendants gives
    them) has exited within `timeout` seconds."""
    from orchestrator.ray_adapter.reaper import same_process

    deadline = time.monotonic() + timeout
    alive = processes
    while time.monotonic() < deadline:
        alive = {pid: start for pid, start in alive.items() if same_process(pid, start)}
        if not alive:
            return
        time.sleep(0.5)
    raise AssertionError(f"processes left behind: {sorted(alive)}")
