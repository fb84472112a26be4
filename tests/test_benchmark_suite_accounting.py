"""`python -m benchmarks.suite_accounting`: the suite's CPU by kind of process, read from
dump-acct's lines (their format as Debian's acct 6.6 prints them). The records are made up; nothing
is run under accounting here (turning it on is machine-wide and needs root)."""

from __future__ import annotations

import subprocess
import sys

from testkit import REPO

from benchmarks.suite_accounting import (
    DRIVERS,
    MLFLOW,
    OTHER,
    PYTHON_OTHER,
    PYTHON_UNDER_DRIVERS,
    RAY_SERVICES,
    SLURM_JOBS,
    TRIALS,
    parse,
    summary,
    table,
)


def _record(name: str, utime: float, stime: float, pid: int, ppid: int, start: str = "14:20:11",
            elapsed: float = 1000.0) -> str:
    return (f"{name:<16}|v3|{utime:9.2f}|{stime:9.2f}|{elapsed:9.2f}|     0|     0|  2920.00|   946.00|"
            f"{pid:8d}|{ppid:8d}|     |       0|__      |Fri Nov 27 {start} 2026")


# pytest worker 10 -> orchestrate 11 -> (python 12, raylet 13 -> ray::ImplicitFu 14);
# mlflow 20 -> python 21; slurm_script 30 -> bash 31 -> python 32; python 40 whose parent
# outlived accounting; a process that named itself "a|b" (41) under the worker.
RECORDS = [  # name, user and system CPU (hundredths of a second), pid, parent pid
    ("orchestrate", 650.0, 50.0, 11, 10), ("python", 30.0, 10.0, 12, 11), ("raylet", 5.0, 4.0, 13, 11),
    ("ray::ImplicitFu", 346.0, 57.0, 14, 13), ("mlflow", 577.0, 65.0, 20, 10), ("python", 240.0, 26.0, 21, 20),
    ("slurm_script", 0.0, 0.0, 30, 1), ("bash", 1.0, 0.0, 31, 30), ("python", 700.0, 100.0, 32, 31),
    ("python", 2377.0, 49.0, 40, 1), ("a|b", 0.0, 1.0, 41, 10), ("python", 14000.0, 600.0, 10, 5),
]
DUMP = "\n".join(["some line dump-acct does not print", *(_record(*record) for record in RECORDS)])


def test_cpu_is_user_plus_system_in_hundredths_and_other_lines_are_skipped():
    processes = parse(DUMP)
    assert len(processes) == 12
    driver = next(p for p in processes if p.name == "orchestrate")
    assert (driver.cpu_s, driver.pid, driver.ppid) == (7.0, 11, 10)
    assert driver.end - driver.start == 10.0  # elapsed, in hundredths
    assert processes[-2].name == "a|b" and processes[-2].pid == 41


def test_python_is_told_apart_by_its_nearest_recorded_ancestor():
    rows = {kind: (count, round(cpu, 2)) for kind, count, cpu in summary(parse(DUMP))}
    assert rows[DRIVERS] == (1, 7.0)
    assert rows[PYTHON_UNDER_DRIVERS] == (1, 0.4)  # python 12, a child of the driver
    assert rows[RAY_SERVICES] == (1, 0.09)
    assert rows[TRIALS] == (1, 4.03)
    assert rows[MLFLOW] == (2, 9.08)  # the server (6.42) and its worker (2.66)
    assert rows[SLURM_JOBS] == (3, 8.01)  # slurm_script, its bash (0.01), python two levels below (8.0)
    assert rows[PYTHON_OTHER] == (2, 170.26)  # the orphan (24.26) and the pytest worker (146.0)
    assert rows[OTHER] == (1, 0.01)  # "a|b"


def test_a_pid_that_comes_round_again_is_the_parent_alive_when_the_child_started():
    """Pids wrap at pid_max (32,768 on these machines) within a suite run. A record's start is
    to the second and can read a second before its parent's."""
    dump = "\n".join([
        _record("mlflow", 100.0, 0.0, 50, 10, start="14:00:00", elapsed=6000.0),
        _record("python", 200.0, 0.0, 52, 50, start="14:00:10"),
        _record("orchestrate", 300.0, 0.0, 50, 10, start="14:30:00", elapsed=6000.0),
        _record("python", 400.0, 0.0, 51, 50, start="14:29:59"),  # read a second early
    ])
    rows = {kind: (count, round(cpu, 2)) for kind, count, cpu in summary(parse(dump))}
    assert rows == {MLFLOW: (2, 3.0), DRIVERS: (1, 3.0), PYTHON_UNDER_DRIVERS: (1, 4.0)}


def test_the_table_sums_every_process_once():
    text = table(parse(DUMP))
    total = sum(p.cpu_s for p in parse(DUMP))
    assert f"| all | 12 | {total:.1f} | 100% |" in text and "| orchestrate drivers | 1 | 7.0 | 3.5% |" in text
    assert text.count("\n") == 2 + 8  # header, rule, 8 kinds seen, the total


def test_a_missing_or_foreign_file_is_exit_2_naming_it(tmp_path):
    def run(path):
        return subprocess.run([sys.executable, "-m", "benchmarks.suite_accounting", str(path)], cwd=REPO,
                              capture_output=True, text=True, timeout=60)

    missing = run(tmp_path / "nope.txt")
    assert missing.returncode == 2 and "nope.txt' is not a file" in missing.stderr
    control = run(tmp_path / "a\nb\x1b[2J")  # shown escaped, on one line
    assert control.returncode == 2 and "a\\nb\\x1b[2J' is not a file" in control.stderr
    assert control.stderr.count("\n") == 1 and "\x1b" not in control.stderr
    foreign = tmp_path / "pacct"
    foreign.write_bytes(b"\x00\x03\xff\xfe binary accounting, not dump-acct's output")
    wrong = run(foreign)
    assert wrong.returncode == 2 and f"{str(foreign)!r} holds no dump-acct record" in wrong.stderr
    assert not wrong.stdout
