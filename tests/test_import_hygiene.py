"""Importing the project has no side effects that a library user would pay for: the contract
modules load nothing heavy (`orchestrator.lifecycle` takes the heartbeat interval from
results/sweeps.py without MLflow). Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sweep_helpers import REPO_ROOT

HEAVY = ("mlflow", "ray", "torch", "pandas", "pyarrow", "optuna", "sqlalchemy")
CONTRACT = ("results.run_schema", "results.sweeps", "results.selection", "results.trial_result",
            "orchestrator.lifecycle")


def _python(code: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_contract_modules_load_no_heavy_library():
    loaded = _python(
        "import importlib, json, sys\n"
        f"for name in {CONTRACT!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    assert loaded == []
