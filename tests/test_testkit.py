"""The test-support package keeps collection cheap: importing every testkit module (and what
conftest.py imports) loads no heavy library; the README says so."""

from __future__ import annotations

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
