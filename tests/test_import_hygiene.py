"""Importing the project has no side effects that a library user would pay for: the contract
modules load nothing heavy (`orchestrator.sweep.lifecycle` takes the heartbeat interval from
results/sweeps.py without MLflow), and no module writes the environment when it is imported; the
`orchestrate` command sets the process defaults (orchestrator/sweep/environment.py) when it starts, and
they do what they are there for. Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from mlflow import MlflowClient
from testkit import REPO as REPO_ROOT
from testkit.cli import run_orchestrate
from testkit.specs import BASE_SPEC, merge

from orchestrator.sweep.environment import DEFAULTS
from results import run_schema as rs

HEAVY = ("mlflow", "ray", "torch", "pandas", "pyarrow", "optuna", "sqlalchemy")
CONTRACT = ("results.run_schema", "results.sweeps", "results.selection", "results.trial_result",
            "orchestrator.sweep.lifecycle")
# The packages, their command lines, and the modules that used to write the environment.
LIBRARY = ("orchestrator", "results", "orchestrator.cli.orchestrate", "results.results_commands",
           "results.attention_command", "orchestrator.cli.sweeps_commands", "results.run_reader",
           "results.report", "results.attention")
PROGRESS_BAR = "Downloading artifacts"  # MLflow's tqdm bar on stderr
# The child starts without the project's defaults, as a user's shell would (this test process has
# them: conftest.py sets them).
WITHOUT_DEFAULTS = {name: None for name in DEFAULTS}


def _python(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
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


def test_importing_the_packages_changes_no_environment_variable():
    changed = _python(
        "import importlib, json, os\n"
        "before = dict(os.environ)\n"
        f"for name in {LIBRARY!r}: importlib.import_module(name)\n"
        "after = dict(os.environ)\n"
        "print(json.dumps({k: [before.get(k), after.get(k)] for k in before.keys() | after.keys()"
        " if before.get(k) != after.get(k)}))"
    )
    assert changed == {}


def _completed_sweep(folder) -> str:
    """A store holding one completed sweep whose selected run has its training config artifact
    (what `orchestrate best` downloads); returns the tracking URI."""
    uri = f"sqlite:///{folder / 'mlruns.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("done")
    parent = client.create_run(experiment, tags={rs.TAG_ROLE: rs.ROLE_SWEEP}).info.run_id
    child = client.create_run(experiment, tags={rs.TAG_ROLE: rs.ROLE_TRIAL, rs.TAG_PARENT_RUN: parent})
    (folder / "config.yaml").write_text("name: done\n")
    client.log_artifact(child.info.run_id, str(folder / "config.yaml"), rs.ARTIFACT_CHECKPOINT_DIR)
    client.set_terminated(child.info.run_id)
    client.set_tag(parent, rs.TAG_SWEEP_STATE, rs.SWEEP_COMPLETED)
    client.set_tag(parent, rs.TAG_BEST_RUN, child.info.run_id)
    client.set_terminated(parent)
    return uri


def test_orchestrate_sets_the_defaults_when_it_starts(tmp_path):
    """`orchestrate best` downloads an artifact: no MLflow progress bar on stderr, because the
    command set MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false; a user's own setting still wins."""
    uri = _completed_sweep(tmp_path)
    quiet = run_orchestrate(["best", "done", "--tracking-uri", uri], cwd=tmp_path, env=WITHOUT_DEFAULTS)
    assert quiet.returncode == 0, quiet.stderr
    assert "name: done" in quiet.stdout and PROGRESS_BAR not in quiet.stderr, quiet.stderr

    users = run_orchestrate(["best", "done", "--tracking-uri", uri], cwd=tmp_path,
                            env={**WITHOUT_DEFAULTS, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "true"})
    assert users.returncode == 0, users.stderr
    assert PROGRESS_BAR in users.stderr


def test_a_bad_spec_is_refused_before_mlflow_and_ray_load(tmp_path):
    """`orchestrate sweep` reads and checks the spec before it imports the sweep's machinery: a
    bad one is refused (exit 2, the field named) with neither MLflow nor Ray loaded, in about
    half the time the imports take (2.4 s against 5.2-5.8 s here)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(merge(BASE_SPEC, {"training": {"lr": -1}})))
    outcome = _python(
        "import contextlib, io, json, sys\n"
        "from orchestrator.cli.orchestrate import main\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        "    try:\n"
        f"        main(['sweep', {str(bad)!r}])\n"
        "    except SystemExit as exc:\n"
        "        code = exc.code\n"
        "print(json.dumps([code, err.getvalue(),"
        f" sorted({{m.split('.')[0] for m in sys.modules}} & {{'mlflow', 'ray'}})]))"
    )
    assert outcome[0] == 2 and f"{bad}: training.lr" in outcome[1], outcome
    assert outcome[2] == [], outcome
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no store, no Ray results
