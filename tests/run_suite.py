"""`make test`: the whole suite in three parts; the exit status is non-zero when a test fails.

1. tests/test_slurm_cluster.py, in a pytest process of its own, beside part 2: its tests mostly
   wait on SLURM's clock (time limits are whole minutes, checked every 30 s; a requeued job is
   held), using little CPU, and share one cluster (a session fixture).
2. Every other test not marked `serial`, on TEST_WORKERS (default 2) pytest-xdist workers, a
   file's tests on one worker (its module fixtures are built once). xdist_group marks would do
   nothing under pytest 9, hence a process of its own for part 1.
3. The `serial` tests, which check a measured time, alone on the machine after both.

Part 1's output is printed after part 2's. A Ctrl-C reaches both pytest processes (the same
process group), and each stops as pytest does, within GRACE_S; a part still running then is
killed with all it started (a process that ignores SIGINT, a test's or a library's, would
otherwise hold the run until its tests end).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

from orchestrator.ray_adapter.reaper import descendants

SLURM_FILE = "tests/test_slurm_cluster.py"
GRACE_S = 20.0


def pytest(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", *args], **popen)


def stop(parts: list[subprocess.Popen]) -> None:
    """After a Ctrl-C: each part may stop as pytest does until GRACE_S have passed; then it and
    every process it started are killed."""
    deadline = time.monotonic() + GRACE_S
    for part in parts:
        try:
            part.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for pid in [*descendants(part.pid), part.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            part.wait()


def main() -> int:
    workers = os.environ.get("TEST_WORKERS", "2")
    with tempfile.TemporaryFile("w+") as slurm_output:
        slurm = pytest("-m", "not serial", SLURM_FILE, stdout=slurm_output, stderr=subprocess.STDOUT)
        rest = pytest("-n", workers, "--dist", "loadfile", "-m", "not serial", "--ignore", SLURM_FILE,
                      "--durations", "15", "tests")  # the slowest, for whoever trims the suite
        try:
            failed = int(any([rest.wait(), slurm.wait()]))  # both waited for
        except KeyboardInterrupt:  # both got the Ctrl-C: let them stop as pytest does
            stop([rest, slurm])
            failed = 130
        finally:
            slurm_output.seek(0)
            print(f"\n--- {SLURM_FILE}, run beside the tests above ---", flush=True)
            sys.stdout.write(slurm_output.read())
            sys.stdout.flush()
    if failed:
        return failed
    serial = pytest("-m", "serial", "tests")
    try:
        return serial.wait()
    except KeyboardInterrupt:
        stop([serial])
        return serial.returncode or 130


if __name__ == "__main__":
    sys.exit(main())
