"""Kills what a driver started once the driver is gone, however it went (SIGKILL included).

Ray's head processes share the driver's fate (PR_SET_PDEATHSIG), but the agents the raylet starts
(dashboard agent, runtime-env agent) outlive a killed driver. `python -m orchestrator.ray_adapter.reaper PID`
runs beside the driver in a session of its own (a Ctrl-C to the driver's process group does not
end it), notes the driver's descendants every second, and once the driver is gone kills those
still alive (the same process: pid and start time). Linux only (/proc); elsewhere it just exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 1.0


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces
    return int(fields[1]), int(fields[19])


def same_process(pid: int, start: int) -> bool:
    """Whether `pid` is still the process that started at `start` (not a reused pid)."""
    stat = _stat(pid)
    return stat is not None and stat[1] == start


def signal_pending(pid: int, signum: int) -> bool:
    """Whether `signum` was sent to `pid` and waits there, blocked (/proc's pending sets)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    bit = 1 << (signum - 1)
    return any(line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & bit
               for line in status.splitlines())


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of `root`: pid -> start time."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents.setdefault(stat[0], []).append(int(entry.name))
            starts[int(entry.name)] = stat[1]
    found: dict[int, int] = {}
    stack = list(parents.get(root, []))
    while stack:
        pid = stack.pop()
        found[pid] = starts[pid]
        stack.extend(parents.get(pid, []))
    return found


def start_reaper() -> subprocess.Popen | None:
    """Watch this process from a reaper; None where /proc is missing."""
    if not Path("/proc/self/stat").exists():
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.ray_adapter.reaper", str(os.getpid())],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def watch(driver: int) -> None:
    me = os.getpid()
    known: dict[int, int] = {}
    while os.getppid() == driver:
        known.update({pid: start for pid, start in descendants(driver).items() if pid != me})
        known = {pid: start for pid, start in known.items() if same_process(pid, start)}
        time.sleep(POLL_S)
    for pid, start in known.items():
        if same_process(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    watch(int(sys.argv[1]))
