"""What the scale benchmarks share: a fresh PostgreSQL database, `orchestrate server` on it (in
its own process group, stopped by group id), metric rows counted straight from the database,
the driver process's CPU and memory (/proc), least-squares fits over N, and a cProfile of
every thread of a driver ($NLI_SCALE_PROFILE)."""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Skip
from orchestrator.cluster.ports import free_port
from results.tracking_uri import probe_http

PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"


# -- PostgreSQL --------------------------------------------------------------------------------
def _pg_connect(database: str = "postgres"):
    import psycopg2

    return psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=database, connect_timeout=5)


class Database:
    """A new, empty database on the local PostgreSQL (trust auth); drop() removes it."""

    def __init__(self):
        try:
            connection = _pg_connect()
        except Exception as exc:
            raise Skip(f"PostgreSQL not reachable at {PG_HOST}:{PG_PORT} ({exc}); start it "
                       "(`pg_ctlcluster 15 main start`) to run the scale benchmarks") from None
        self.name = f"nli_bench_{uuid.uuid4().hex[:10]}"
        connection.autocommit = True
        connection.cursor().execute(f"CREATE DATABASE {self.name}")
        connection.close()
        self.uri = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.name}"

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        connection = _pg_connect(self.name)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, args)
                return cursor.fetchall()
        finally:
            connection.close()

    def metric_rows(self, experiment_name: str, key: str) -> dict[str, tuple[int, int]]:
        """Per trial (tag nli.trial_id; else the run's name): (rows of metric `key`, distinct
        steps). One row per epoch means rows == distinct steps == epochs reported."""
        rows = self.query(
            """SELECT COALESCE(t.value, r.name), COUNT(m.step), COUNT(DISTINCT m.step)
               FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id
               LEFT JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'nli.trial_id'
               LEFT JOIN metrics m ON m.run_uuid = r.run_uuid AND m.key = %s
               WHERE e.name = %s GROUP BY COALESCE(t.value, r.name)""",
            (key, experiment_name),
        )
        return {name: (int(n), int(distinct)) for name, n, distinct in rows}

    def drop(self) -> None:
        connection = _pg_connect()
        connection.autocommit = True
        connection.cursor().execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        connection.close()


# -- the tracking server -----------------------------------------------------------------------
class Server:
    """`orchestrate server` (this checkout's code) over `backend`; stop() and start() again on
    the same port for a restart."""

    def __init__(self, backend: str, folder: Path, workers: int = 1):
        self.backend, self.folder, self.workers = backend, folder, workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> float:
        """Starts the server; returns the seconds until /health answered."""
        started = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
        argv = [sys.executable, "-m", "orchestrator.cli.orchestrate", "server", "--backend-store-uri", self.backend,
                "--artifacts-destination", str(self.folder / "artifacts"), "--host", "127.0.0.1",
                "--port", str(self.port)]
        if self.workers != 1:
            argv += ["--workers", str(self.workers)]
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "server.log", "ab") as log_file:
            self.proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        while probe_http(self.url) is not None:  # the CLI's reachability probe (GET /health)
            if self.proc.poll() is not None or time.perf_counter() - started > timeout_s:
                tail = (self.folder / "server.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"`orchestrate server` did not come up at {self.url}:\n{tail}")
            time.sleep(0.2)
        return time.perf_counter() - started

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # what is left of the group (gunicorn/uvicorn workers outlive a leader)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None


# -- the driver process ------------------------------------------------------------------------
def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds() -> float:
    """User + system CPU of this process (all its threads; not its children)."""
    times = os.times()
    return times.user + times.system


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(group_id: int) -> float:
    """User + system CPU of the live processes of a process group (e.g. the tracking server and
    its workers), from /proc."""
    total = 0
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == group_id:  # pgrp
            total += int(fields[11]) + int(fields[12])
    return total / _CLOCK_TICKS


def thread_cpu_seconds(thread: threading.Thread) -> float | None:
    """User + system CPU of one live thread of this process (/proc/self/task); None once it ended."""
    try:
        stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


class Sampler:
    """Every `interval` s in a thread: `probe()` (e.g. the uploader's backlog), kept with the
    time of the sample when it is not None."""

    def __init__(self, probe, interval: float = 0.5):
        self.probe, self.interval = probe, interval
        self.samples: list[tuple[float, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            value = self.probe()
            if value is not None:
                self.samples.append((time.time(), value))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# -- fits --------------------------------------------------------------------------------------
def linear_fit(xs, ys) -> dict[str, float]:
    """Least squares y = intercept + slope * x, with R² (nan with fewer than 2 distinct x)."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(set(x.tolist())) < 2:
        return {"slope": float("nan"), "intercept": float("nan"), "r2": float("nan")}
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((residual**2).sum()) / total if total > 0 else 1.0
    return {"slope": float(slope), "intercept": float(intercept), "r2": r2}


def power_fit(xs, ys) -> dict[str, float]:
    """Least squares in log-log: y = a * x^b (b ~ 1: linear growth, b ~ 0: constant)."""
    x, y = np.log(np.asarray(xs, dtype=float)), np.log(np.maximum(np.asarray(ys, dtype=float), 1e-12))
    if len(set(x.tolist())) < 2:
        return {"a": float("nan"), "b": float("nan")}
    b, log_a = np.polyfit(x, y, 1)
    return {"a": float(np.exp(log_a)), "b": float(b)}


# -- profiles ----------------------------------------------------------------------------------
PROFILE_ENV = "NLI_SCALE_PROFILE"


@contextlib.contextmanager
def profiled(path: Path):
    """cProfile of this process's Python threads while the block runs: the calling thread and
    every thread started meanwhile (the uploader, the heartbeat), each with its own profiler (one
    profiles one thread) timing the CPU its thread uses (time.thread_time: a thread waiting on a
    lock or a socket costs nothing), merged into one pstats file at ``path``. A thread still running at the
    end is left out, and a note lists it in the log."""
    profiles: list[tuple[threading.Thread, cProfile.Profile]] = []
    original_run = threading.Thread.run

    def run(thread: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        profiles.append((thread, profile))
        profile.enable()
        try:
            original_run(thread)
        finally:
            profile.disable()

    main = cProfile.Profile(time.thread_time)
    threading.Thread.run = run
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.Thread.run = original_run
        stats = pstats.Stats(main)
        running = [thread.name for thread, _ in profiles if thread.is_alive()]
        for thread, profile in profiles:
            if not thread.is_alive():
                stats.add(profile)
        path.parent.mkdir(parents=True, exist_ok=True)
        stats.dump_stats(str(path))
        if running:
            print(f"{path}: threads still running, not in the profile: {', '.join(running)}", file=sys.stderr)
