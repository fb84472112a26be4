"""The cluster commands without a cluster: addresses, what a submission ships, and the errors
(exit 2 for bad input, checked before anything is contacted; exit 1 naming an unreachable
address). Real submissions are in test_cluster_e2e.py."""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path

import pytest
from testkit.cli import orchestrate
from testkit.ports import free_port
from testkit.specs import quickstart, write_spec

from orchestrator.cluster.tracking_server import mask_uri, server_command
from orchestrator.ray_adapter import ray_jobs
from orchestrator.ray_adapter.ray_jobs import JobInputError, build_submission, resolve_address

REPO = Path(__file__).resolve().parents[1]


def spec_file(folder: Path, **search) -> Path:
    return write_spec(folder, {"search": search}, base=quickstart(), local_store=False, file_name="sweep.yaml")


# -- addresses --------------------------------------------------------------------------------
def test_address_flag_then_environment_then_default(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    assert resolve_address(None) == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:8265")
    assert resolve_address(None) == "http://10.0.0.5:8265"
    assert resolve_address("https://head.example:443/") == "https://head.example:443"
    for bad in ("ray://head:10001", "auto", "ftp://head:8265", "http://head:notaport"):
        with pytest.raises(JobInputError) as info:
            resolve_address(bad)
        assert info.value.exit_code == 2 and bad.rstrip("/") in str(info.value)


def test_unreachable_cluster_exits_1_naming_the_address(tmp_path):
    address = f"http://127.0.0.1:{free_port()}"
    spec = spec_file(tmp_path / "spec", tracking_uri="http://127.0.0.1:5000")
    for args in (["jobs"], ["logs", "some-job"], ["stop", "some-job"], ["submit", str(spec)]):
        started = time.monotonic()
        result = orchestrate(*args, "--address", address)
        assert result.returncode == 1, (args, result.stderr)
        assert f"cannot reach the Ray cluster's dashboard at {address}" in result.stderr
        assert "Traceback" not in result.stderr
        assert time.monotonic() - started < 30
    # RAY_ADDRESS is the default address (and named in the message).
    result = orchestrate("jobs", env={"RAY_ADDRESS": address})
    assert result.returncode == 1 and address in result.stderr


def test_bad_submissions_exit_2_before_contacting_the_cluster(tmp_path):
    address = f"http://127.0.0.1:{free_port()}"  # would be exit 1 if it were contacted
    with_server = spec_file(tmp_path / "a", tracking_uri="http://127.0.0.1:5000")
    without = spec_file(tmp_path / "b")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nmodel: {name: no_such_model}\n")
    cases = [
        (["submit", str(tmp_path / "missing.yaml")], "not found"),
        (["submit", str(with_server), "--resume", "--new"], "exclude each other"),
        (["submit", str(broken)], "no_such_model"),
        (["submit", str(without)], "--tracking-uri"),  # sqlite:///mlruns.db would be lost
        (["submit", str(with_server), "--tracking-uri", "http://other:5000"], "contradicts"),
        (["submit", str(with_server), "--env", "NOT AN ASSIGNMENT"], "NAME=VALUE"),
    ]
    for args, message in cases:
        result = orchestrate(*args, "--address", address)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    result = orchestrate("submit", str(with_server), "--address", "ray://head:10001")
    assert result.returncode == 2 and "not a Ray dashboard address" in result.stderr


# -- what a job ships -------------------------------------------------------------------------
def test_submission_from_the_project_ships_the_project(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "http://elsewhere:8265")
    submission = build_submission(
        REPO / "search_spaces" / "quickstart.yaml", tracking_uri="http://127.0.0.1:5000",
        new=True, env=["NLI_DATA_DIR=/mnt/shared/data"], cwd=REPO,
    )
    # The spec's real path in the shipped folder (search_spaces/ links to the package's specs).
    shipped = (REPO / "search_spaces" / "quickstart.yaml").resolve().relative_to(REPO).as_posix()
    assert submission.entrypoint == f"orchestrate sweep {shipped} --new"
    runtime_env = submission.runtime_env
    assert runtime_env["working_dir"] == str(REPO)
    for excluded in (".venv", ".git", "ray_results", "mlruns.db", "__pycache__"):
        assert excluded in runtime_env["excludes"]
    env = runtime_env["env_vars"]
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert env["RAY_AUTH_MODE"] and env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["NLI_DATA_DIR"] == "/mnt/shared/data"
    assert "RAY_ADDRESS" not in env  # the submitter's dashboard URL means nothing on the cluster
    assert submission.metadata["nli.spec_name"] == "quickstart"
    assert submission.submission_id.startswith("quickstart-")
    assert any("storage_path" in w for w in submission.warnings)  # results would stay on the head


def test_spec_outside_a_project_ships_only_its_folder(tmp_path):
    spec = spec_file(tmp_path / "specs", tracking_uri="http://h:5000",
                     storage_path="s3://bucket/ray_results")
    (tmp_path / "big.bin").write_bytes(b"x")
    submission = build_submission(spec, resume=True, cwd=tmp_path)  # tmp_path has no pyproject
    assert submission.runtime_env["working_dir"] == str(spec.parent)
    assert submission.entrypoint == "orchestrate sweep sweep.yaml --resume"
    assert submission.warnings == []
    assert submission.tracking_uri == "http://h:5000"


def test_ray_packs_the_working_dir_without_the_excluded_paths(tmp_path):
    """The excludes, applied by Ray's own packaging (what submit_job uploads)."""
    from ray._private.runtime_env.packaging import create_package

    root = tmp_path / "project"
    for name in ("sweep.yaml", "pkg/module.py", ".venv/bin/python", "ray_results/exp/state.json",
                 "mlruns.db", "pkg/__pycache__/module.cpython-311.pyc", ".git/HEAD",
                 "nli.egg-info/PKG-INFO", "tracking-spool-abc.jsonl",
                 "tracking-journal-abc.jsonl", "tracking-journal-abc.jsonl.uploaded",
                 "tracking-journal-abc.jsonl.files/3/spec.yaml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    target = tmp_path / "package.zip"
    create_package(str(root), target, include_gitignore=True, excludes=ray_jobs.WORKING_DIR_EXCLUDES)
    names = {n.rstrip("/") for n in zipfile.ZipFile(target).namelist()}
    assert {"sweep.yaml", "pkg/module.py"} <= names
    assert not any(n.split("/")[0] in (".venv", "ray_results", ".git", "nli.egg-info") for n in names), names
    assert not any("__pycache__" in n or n.endswith((".db", ".jsonl", ".uploaded")) for n in names), names
    assert not any(".jsonl.files" in n for n in names), names  # files the journal points to


def test_an_oversized_upload_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_jobs, "MAX_UPLOAD_MB", 1)
    spec = spec_file(tmp_path, tracking_uri="http://h:5000")
    with open(tmp_path / ".venv-like", "wb") as handle:  # not excluded: counted
        handle.truncate(2 * 2**20)
    with pytest.raises(JobInputError, match="more than 1 MiB"):
        build_submission(spec, cwd=tmp_path)
    (tmp_path / ".venv").mkdir()
    os.replace(tmp_path / ".venv-like", tmp_path / ".venv" / "big")  # excluded: not counted
    build_submission(spec, cwd=tmp_path)


# -- tracking server and sync -----------------------------------------------------------------
def test_server_command_is_lean_and_masks_passwords():
    argv, env = server_command("postgresql://u:secret@db:5432/mlflow", "/shared/art", "0.0.0.0", 5001)
    assert argv[1] == "server" and Path(argv[0]).name == "mlflow"
    assert argv[argv.index("--workers") + 1] == "1"
    assert argv[argv.index("--port") + 1] == "5001"
    assert argv[argv.index("--artifacts-destination") + 1] == "/shared/art"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert mask_uri("postgresql://u:secret@db:5432/mlflow") == "postgresql://u:***@db:5432/mlflow"


def test_server_gives_every_request_thread_a_database_connection(monkeypatch):
    """SQLAlchemy's default pool (5 + 10) under uvicorn's 40 request threads left 32 clients at
    once waiting 30 s for a connection (benchmarks/README.md, "scale_tracking"). log_batch nests
    sessions, so the overflow doubles the pool. A user's value wins."""
    monkeypatch.delenv("MLFLOW_SQLALCHEMYSTORE_POOL_SIZE", raising=False)
    monkeypatch.delenv("MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW", raising=False)
    _, env = server_command("postgresql://u@db:5432/mlflow", "/shared/art")
    assert env["MLFLOW_SQLALCHEMYSTORE_POOL_SIZE"] == "40"
    assert env["MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW"] == "40"
    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOL_SIZE", "7")
    _, env = server_command("postgresql://u@db:5432/mlflow", "/shared/art")
    assert env["MLFLOW_SQLALCHEMYSTORE_POOL_SIZE"] == "7"


def test_server_rejects_bad_backends_with_clear_errors(tmp_path):
    result = orchestrate("server", "--backend-store-uri", "http://not-a-database", "--artifacts-destination",
                 str(tmp_path / "art"))
    assert result.returncode == 2 and "expected a database URI" in result.stderr
    uri = f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/mlflow"
    result = orchestrate("server", "--backend-store-uri", uri, "--artifacts-destination", str(tmp_path / "art"))
    assert result.returncode == 1, result.stderr
    assert "is unreachable" in result.stderr and "hunter2" not in result.stderr
    result = orchestrate("server", "--artifacts-destination", str(tmp_path / "art"))
    assert result.returncode == 2 and "--backend-store-uri" in result.stderr


def test_sync_input_errors(tmp_path):
    assert orchestrate("sync", str(tmp_path / "none.jsonl"), "--tracking-uri", "http://h:1").returncode == 2
    journal = tmp_path / "journal.jsonl"
    journal.write_text("not json\n")
    result = orchestrate("sync", str(journal))
    assert result.returncode == 2 and "--tracking-uri" in result.stderr
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    result = orchestrate("sync", str(journal), "--tracking-uri", store)
    assert result.returncode == 2 and f"{journal}:1: not a JSON line" in result.stderr
    record = {"kind": "metrics", "trial_id": "t", "data": {}, "time_ms": 0,
              "experiment_id": "0", "parent_run_id": "p"}
    journal.write_text(json.dumps({**record, "kind": "delete"}) + "\n")
    result = orchestrate("sync", str(journal), "--tracking-uri", store)
    assert result.returncode == 2 and "kind 'delete'" in result.stderr and "start, metrics" in result.stderr
    journal.write_text(json.dumps(record) + "\n")
    started = time.monotonic()
    result = orchestrate("sync", str(journal), "--tracking-uri", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 1 and "unreachable" in result.stderr
    assert time.monotonic() - started < 30
