"""The test-support package keeps collection cheap: importing every testkit module (and what
conftest.py imports) loads no heavy library; the README says so."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import run_suite
from testkit import REPO

HEAVY = ("torch", "mlflow", "ray", "pandas", "hypothesis", "scipy")


def test_importing_the_test_support_loads_no_heavy_library():
    modules = sorted(p.stem for p in (Path(__file__).parent / "testkit").glob("*.py") if p.stem != "__init__")
    code = (
        "import sys; import conftest; "
        + "; ".join(f"import testkit.{name}" for name in modules)
        + f"; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent, env={"PYTHONPATH": f"{REPO}:{Path(__file__).parent}",
                                                          "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert len(modules) >= 10 and done.stdout.strip() == "[]", done.stdout


def test_every_slurm_cluster_test_is_in_the_file_the_suite_runs_on_its_own():
    """The SLURM cluster tests share one cluster (a session fixture) in the pytest process that
    tests/run_suite.py starts for their file alone."""
    using = {path.name for path in (REPO / "tests").glob("test_*.py")
             if re.search(r"def test_\w+\([^)]*\bslurm_cluster\b", path.read_text())}
    assert using == {Path(run_suite.SLURM_FILE).name}
    assert "tests/run_suite.py" in (REPO / "Makefile").read_text()


def _write_mini_suite(folder: Path, failing: str | None = None, sleep_s: float = 0.5,
                      deaf: str | None = None) -> list[str]:
    """A suite of 4 tests, one per part of tests/run_suite.py (a SLURM file test, two others and
    a serial one), each writing its name to started/, sleeping `sleep_s`, then writing its name
    to order.log; the test named `failing` fails, the one named `deaf` ignores Ctrl-C. Returns
    the command that runs it."""
    tests = folder / "tests"
    tests.mkdir()
    (folder / "started").mkdir()
    (folder / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["serial: alone"]\n')
    body = "import os, signal, time\nimport pytest\n\n{mark}def test_{name}():\n" \
           "    if {deaf}:\n        signal.signal(signal.SIGINT, signal.SIG_IGN)\n" \
           "    open(os.path.join({started!r}, '{name}'), 'w').close()\n    time.sleep({sleep_s})\n" \
           "    open(os.environ['ORDER'], 'a').write('{name}\\n')\n    assert {ok}\n"
    for file, name, mark in (("test_slurm_cluster.py", "slurm", ""), ("test_a.py", "a", ""),
                             ("test_b.py", "b", ""), ("test_timed.py", "timed", "@pytest.mark.serial\n")):
        (tests / file).write_text(body.format(name=name, mark=mark, ok=name != failing, sleep_s=sleep_s,
                                              started=str(folder / "started"), deaf=name == deaf))
    return [sys.executable, str(REPO / "tests" / "run_suite.py")]


def _mini_suite(folder: Path, failing: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(_write_mini_suite(folder, failing), cwd=folder, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "ORDER": str(folder / "order.log")})


@pytest.mark.parametrize("failing", [None, "slurm", "a", "timed"])
def test_the_suite_runner_runs_its_three_parts_and_fails_when_a_test_fails(tmp_path, failing):
    done = _mini_suite(tmp_path, failing)
    ran = (tmp_path / "order.log").read_text().split()
    assert sorted(ran[:3]) == ["a", "b", "slurm"]  # the SLURM file beside the rest
    assert (done.returncode == 0) == (failing is None), done.stdout[-3000:]
    # the serial test alone, after the others, and only when they passed
    assert ran[3:] == ([] if failing in ("slurm", "a") else ["timed"])
    assert f"--- {run_suite.SLURM_FILE}, run beside the tests above ---" in done.stdout


@pytest.mark.parametrize("deaf", [None, "slurm"], ids=["both-stop", "a-part-ignores-it"])
def test_ctrl_c_stops_both_parts_of_the_suite_and_runs_no_serial_test(tmp_path, deaf):
    """A Ctrl-C (SIGINT to the terminal's process group) reaches the runner and both pytest
    processes: all end (within a minute; seconds on a quiet machine), the run fails, nothing of the
    serial part runs. A part that does not stop within run_suite.GRACE_S is killed."""
    import signal
    import time

    from testkit.processes import assert_processes_gone

    from orchestrator.ray_adapter.reaper import descendants

    def as_a_shell_starts_it() -> None:
        # Ctrl-C as a terminal delivers it: this pytest process may have inherited SIGINT ignored
        # or blocked (it did in full-suite runs), and a child would inherit that in turn.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    log = tmp_path / "run.log"
    with log.open("w") as output:
        runner = subprocess.Popen(_write_mini_suite(tmp_path, sleep_s=60, deaf=deaf), cwd=tmp_path, stdout=output,
                                  stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=as_a_shell_starts_it,
                                  env={**os.environ, "ORDER": str(tmp_path / "order.log")})
    try:
        # Once the three tests of both parts are running: on a loaded machine xdist's workers
        # may take longer than any fixed wait to start.
        deadline = time.monotonic() + 120
        while {p.name for p in (tmp_path / "started").iterdir()} != {"slurm", "a", "b"}:
            assert time.monotonic() < deadline and runner.poll() is None, log.read_text()
            time.sleep(0.2)
        started = descendants(runner.pid)
        assert len(started) >= 2, started
        os.killpg(runner.pid, signal.SIGINT)
        try:
            code = runner.wait(timeout=60)  # seconds when quiet; xdist's shutdown is slower under load
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 60 s after the Ctrl-C:\n{log.read_text()}")
        assert code != 0, log.read_text()
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    assert_processes_gone(started)
    assert not (tmp_path / "order.log").exists()  # no test finished, the serial one never started
    assert f"--- {run_suite.SLURM_FILE}, run beside the tests above ---" in log.read_text()


def test_the_development_page_names_as_many_serial_tests_as_there_are():
    """docs/development.md: "... then the 5 tests marked `serial` alone"."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "serial", "tests"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:]
    collected = int(re.search(r"^(\d+)/\d+ tests collected", done.stdout, re.M).group(1))
    assert f"then the {collected} tests marked `serial`" in (REPO / "docs" / "development.md").read_text().replace("\n", " ")


def test_a_seeded_store_is_a_new_store_that_mlflow_opens_without_migrating(tmp_path):
    """write_spec puts an empty store copy in the test's folder (saving each sweep MLflow's
    schema migrations); MLflow must take it as its own, pointing at that folder, and a store
    already there is kept."""
    from mlflow import MlflowClient
    from testkit.specs import write_spec
    from testkit.store import client_for

    write_spec(tmp_path / "seeded", {"name": "seeded"})
    write_spec(tmp_path / "new", {"name": "new"}, new_store=True)
    assert not (tmp_path / "new" / "mlruns.db").exists()
    client = client_for(tmp_path / "seeded")
    assert client.get_experiment("0").artifact_location == str(tmp_path / "seeded" / "mlruns" / "0")
    experiment = client.create_experiment("seeded")
    client.create_run(experiment)
    write_spec(tmp_path / "seeded", {"name": "again"})  # the store with a run is not replaced
    assert len(client_for(tmp_path / "seeded").search_runs([experiment])) == 1
    fresh = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'fresh.db'}")
    fresh.search_experiments()
    assert _schema(tmp_path / "fresh.db") == _schema(tmp_path / "seeded" / "mlruns.db")


def _schema(store: Path) -> tuple:
    """Tables, their columns and indexes, and the migration version (not the DDL text, in which
    MLflow's migrations order a table's constraints differently from one process to the next)."""
    with contextlib.closing(sqlite3.connect(store)) as db:
        names = [row[0] for row in db.execute("SELECT name FROM sqlite_master ORDER BY name")]
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        columns = {t: db.execute(f"PRAGMA table_info('{t}')").fetchall() for t in tables}
        return names, columns, db.execute("SELECT version_num FROM alembic_version").fetchall()
