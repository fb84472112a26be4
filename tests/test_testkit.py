"""The test-support package keeps collection cheap: importing every testkit module (and what
conftest.py imports) loads no heavy library; the README says so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def test_make_test_keeps_a_files_tests_on_one_worker_and_every_slurm_cluster_test_in_one_file():
    """The README: `make test` spreads the suite over workers by file and runs the `serial` tests
    alone after; the SLURM cluster tests share one cluster only if one worker runs them all."""
    makefile = (REPO / "Makefile").read_text()
    parallel, alone = (line.strip() for line in makefile.splitlines() if "-m pytest" in line and "tests" in line)
    assert "-n $(TEST_WORKERS) --dist loadfile" in parallel and '-m "not serial"' in parallel
    assert alone.endswith("-m serial tests")
    using = {path.name for path in (REPO / "tests").glob("test_*.py")
             if re.search(r"def test_\w+\([^)]*\bslurm_cluster\b", path.read_text())}
    assert using == {"test_slurm_cluster.py"}


def test_the_readme_names_as_many_serial_tests_as_there_are():
    """README: "all but 5 tests on 2 pytest-xdist workers ... then the 5 tests marked `serial`"."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "serial", "tests"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:]
    collected = int(re.search(r"^(\d+)/\d+ tests collected", done.stdout, re.M).group(1))
    assert f"then the {collected} tests marked `serial`" in (REPO / "README.md").read_text().replace("\n  ", " ")
