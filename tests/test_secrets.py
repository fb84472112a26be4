"""Issue 27 item 3: one masking rule for every command's output and every record, through the
real `orchestrate` process (the live server with credentials in its URI: test_server_auth)."""

from __future__ import annotations

import json

import pytest
from test_slurm import spec_file
from testkit.cli import run_orchestrate

from nli_models.errors import mask_secrets, without_passwords
from orchestrator.cluster import slurm, slurm_jobs, slurm_script

pytestmark = pytest.mark.unit

PASSWORD = "S3cret-pw"


def test_errors_of_jobs_logs_and_stop_mask_the_address_password(tmp_path):
    address = f"http://bob:{PASSWORD}@127.0.0.1:1"
    for command in (["jobs"], ["logs", "some-job"], ["stop", "some-job"]):
        result = run_orchestrate([*command, "--address", address], cwd=tmp_path, timeout=120,
                                 env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
        assert result.returncode == 1, result.stderr
        assert "error: cannot reach the Ray cluster's dashboard at http://bob:***@127.0.0.1:1" \
            in result.stderr
        assert PASSWORD not in result.stdout + result.stderr


def test_validate_train_and_slurm_dry_run_print_no_password(tmp_path):
    store = f"postgresql://bob:{PASSWORD}@db.example:5432/mlflow"
    spec = spec_file(tmp_path, tracking_uri=None)
    validated = run_orchestrate(["validate", str(spec), "--no-data", "--set",
                                 f"search.tracking_uri={store}"], cwd=tmp_path, timeout=120)
    assert validated.returncode == 0, validated.stderr
    assert "overrides: search.tracking_uri=postgresql://bob:***@db.example:5432/mlflow" \
        in validated.stdout
    dry_run = run_orchestrate(["submit", str(spec), "--slurm", "--dry-run", "--tracking-uri", store],
                              cwd=tmp_path, timeout=120)
    assert dry_run.returncode == 0, dry_run.stderr
    assert "export MLFLOW_TRACKING_URI=postgresql://bob:***@db.example:5432/mlflow" in dry_run.stdout
    bad = run_orchestrate(["validate", str(spec), "--no-data", "--set", "training.lr=-1", "--set",
                           f"search.tracking_uri={store}"], cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "bob:***@" in bad.stderr  # the error names the overrides
    for result in (validated, dry_run, bad):
        assert PASSWORD not in result.stdout + result.stderr


def test_the_job_record_keeps_no_password(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    uri = f"http://bob:{PASSWORD}@mlflow.example:5000"
    job = slurm_script.build_batch_job(spec_file(tmp_path, tracking_uri=uri),
                                slurm.SlurmOptions(slurm.Allocation(1, 2, 0)))
    assert PASSWORD in job.script  # the job itself needs the credentials
    slurm_jobs.record(job, "42")
    [line] = slurm_jobs.record_path().read_text().splitlines()
    assert json.loads(line)["tracking_uri"] == "http://bob@mlflow.example:5000"
    assert PASSWORD not in line


def test_masking_rule():
    assert mask_secrets("a postgresql+psycopg2://u:p@h/db b") == "a postgresql+psycopg2://u:***@h/db b"
    assert without_passwords("http://u:p%40x@h:1/") == "http://u@h:1/"
    assert mask_secrets("http://h:5000/x@y") == "http://h:5000/x@y"  # no userinfo: as is
