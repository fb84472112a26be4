"""Where the test suite's CPU goes, by kind of process, from Linux process accounting (Debian's
`acct`: the kernel writes one record per process as it exits, so nothing is sampled or missed):

    accton /tmp/pacct; make test; accton off        # as root
    dump-acct /tmp/pacct > /tmp/pacct.txt
    .venv/bin/python -m benchmarks.suite_accounting /tmp/pacct.txt

A record names the process by its first 15 characters (`comm`) and its parent by pid, so a kind
is read from the name and, for the many processes named `python`, from the nearest named
ancestor. Pids come round again within a run (pid_max is 32,768 on these machines, and a run
starts tens of thousands of processes and threads), so a parent is the record of that pid whose
lifetime holds the child's start. Processes still running when accounting stops (the machine's
services, the shell that ran the suite) are not in it.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import md_table

# dump-acct prints CPU and elapsed times in the kernel's accounting ticks, AHZ = 100 on Linux, and
# the start to the second.
TICKS_PER_S = 100.0
START_FORMAT = "%a %b %d %H:%M:%S %Y"
NAME_WIDTH = 16
SLACK_S = 2.0

RAY_OWN = ("gcs_server", "raylet", "ray::DashboardA", "ray::RuntimeEnv", "ray-dashboard-")
# Kinds in the order the table lists them; the first rule that matches a process wins.
DRIVERS = "orchestrate drivers"
PYTHON_UNDER_DRIVERS = "python under a driver (Ray's dashboard, log and autoscaler monitors; the reaper)"
TRIALS = "trial workers (ray::ImplicitFunc)"
OTHER_RAY_WORKERS = "other Ray workers (ray::IDLE, job supervisors)"
RAY_SERVICES = "Ray's services (GCS, raylet, dashboard and runtime-env agents)"
MLFLOW = "MLflow servers and their workers"
SLURM_JOBS = "SLURM jobs' processes"
BROWSER = "Chromium and ChromeDriver"
PYTHON_OTHER = "other python (pytest and its workers, test helpers, in-process Ray's monitors)"
OTHER = "everything else"
KINDS = (DRIVERS, PYTHON_UNDER_DRIVERS, TRIALS, OTHER_RAY_WORKERS, RAY_SERVICES, MLFLOW, SLURM_JOBS,
         BROWSER, PYTHON_OTHER, OTHER)


@dataclass(frozen=True)
class Process:
    name: str
    cpu_s: float
    pid: int
    ppid: int
    start: float  # seconds since the epoch, to the second
    end: float


Index = dict[int, list[Process]]  # a pid's records, in the order the processes exited


def parse(text: str) -> list[Process]:
    """dump-acct's lines: name|version|utime|stime|etime|uid|gid|mem|io|pid|ppid|flags|exit|tty|start,
    the name padded to NAME_WIDTH (a process may put a "|" in its name)."""
    processes = []
    for line in text.splitlines():
        fields = [line[:NAME_WIDTH].strip(), *(f.strip() for f in line[NAME_WIDTH + 1:].split("|"))]
        if line[NAME_WIDTH:NAME_WIDTH + 1] != "|" or len(fields) < 15 or not fields[1].startswith("v"):
            continue
        cpu = (float(fields[2]) + float(fields[3])) / TICKS_PER_S
        start = time.mktime(time.strptime(fields[14], START_FORMAT))
        end = start + float(fields[4]) / TICKS_PER_S
        processes.append(Process(fields[0], cpu, int(fields[9]), int(fields[10]), start, end))
    return processes


def kind(process: Process, by_pid: Index) -> str:
    name = process.name
    if name == "orchestrate":
        return DRIVERS
    if name == "ray::ImplicitFu":
        return TRIALS
    if name.startswith(RAY_OWN):
        return RAY_SERVICES
    if name.startswith("ray::"):
        return OTHER_RAY_WORKERS
    if name.startswith("chrom"):
        return BROWSER
    ancestors = _ancestors(process, by_pid)
    if name == "mlflow" or (name == "python" and ancestors[:1] == ["mlflow"]):
        return MLFLOW
    if "slurm_script" in (name, *ancestors):
        return SLURM_JOBS
    if name == "python":
        return PYTHON_UNDER_DRIVERS if ancestors[:1] == ["orchestrate"] else PYTHON_OTHER
    return OTHER


def _parent(process: Process, by_pid: Index) -> Process | None:
    """The record of the parent's pid that was alive when `process` started; the latest such
    when several were. The kernel writes a start as the exit's wall clock less the elapsed time,
    in whole seconds, so a child can seem to start a second before its parent: SLACK_S each side
    (a pid comes round after minutes, not seconds)."""
    alive = [p for p in by_pid.get(process.ppid, ()) if p is not process
             and p.start - SLACK_S <= process.start <= p.end + SLACK_S]
    return max(alive, key=lambda p: p.start, default=None)


def _ancestors(process: Process, by_pid: Index) -> list[str]:
    """Names of the recorded ancestors, nearest first (a parent that outlived accounting ends it)."""
    names, seen = [], {id(process)}
    parent = _parent(process, by_pid)
    while parent is not None and id(parent) not in seen:
        names.append(parent.name)
        seen.add(id(parent))
        parent = _parent(parent, by_pid)
    return names


def summary(processes: list[Process]) -> list[tuple[str, int, float]]:
    """(kind, processes, CPU-s) for each kind that has a process, in KINDS order."""
    by_pid: Index = defaultdict(list)
    for process in processes:
        by_pid[process.pid].append(process)
    count: dict[str, int] = defaultdict(int)
    cpu: dict[str, float] = defaultdict(float)
    for process in processes:
        k = kind(process, by_pid)
        count[k] += 1
        cpu[k] += process.cpu_s
    return [(k, count[k], cpu[k]) for k in KINDS if count[k]]


def table(processes: list[Process]) -> str:
    rows = summary(processes)
    total = sum(cpu for _, _, cpu in rows)
    body = [(k, n, f"{cpu:.1f}", f"{100 * cpu / total:.1f}%") for k, n, cpu in rows]
    body.append(("all", sum(n for _, n, _ in rows), f"{total:.1f}", "100%"))
    return md_table(("kind", "processes", "CPU-s", "share"), body)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.suite_accounting DUMP_ACCT_OUTPUT", file=sys.stderr)
        return 2
    dump = Path(argv[0])
    if not dump.is_file():
        # repr: a name with a control character (a newline, an escape) is shown, not obeyed
        print(f"error: {str(dump)!r} is not a file (dump-acct's output is expected)", file=sys.stderr)
        return 2
    processes = parse(dump.read_text(errors="replace"))
    if not processes:
        print(f"error: {str(dump)!r} holds no dump-acct record (name|v3|utime|stime|...)", file=sys.stderr)
        return 2
    print(table(processes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
