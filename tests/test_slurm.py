"""`orchestrate submit --slurm` without a cluster: the batch script it renders (--dry-run), how the
spec's per-trial resources map onto an allocation (`validate --slurm-nodes ...`), and bad input
refused with exit 2 before anything is submitted or recorded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from testkit.cli import orchestrate, run_orchestrate

from orchestrator.cluster.slurm import Allocation, trials_at_once
from orchestrator.sweep.spec import load_spec

pytestmark = pytest.mark.unit

SERVER = "http://mlflow.cluster.example:5000"


def spec_file(folder: Path, *, name: str = "slurm-unit", tracking_uri: str | None = SERVER,
              resources: dict | None = None, max_concurrent: int | None = 2,
              grid: dict | None = None) -> Path:
    spec = {
        "name": name,
        "model": {"name": "decomposable", "variant": "vanilla",
                  "args": {"embedding_dim": 8, "projection_dim": 8, "hidden_size": 8}},
        "data": {"corpus": "toy", "toy": {"size": 300, "seed": 0}},
        "training": {"optimizer": "adam", "lr": 0.001, "batch_size": 32, "epochs": 1},
        "search": {
            "sampler": "grid",
            "space": {k: {"grid": v} for k, v in (grid or {"lr": [0.001, 0.003]}).items()},
            "seeds": [1],
            "resources": resources or {"cpu": 1},
            "storage_path": str(folder / "ray_results"),
        },
    }
    if max_concurrent is not None:
        spec["search"]["max_concurrent_trials"] = max_concurrent
    if tracking_uri is not None:
        spec["search"]["tracking_uri"] = tracking_uri
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(autouse=True)
def private_record(tmp_path, monkeypatch):
    """The record of submissions lives in this test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "nli-orchestrator" / "slurm-jobs.jsonl"


def test_dry_run_prints_the_batch_script_with_every_option(tmp_path, private_record):
    spec = spec_file(tmp_path, resources={"cpu": 2, "gpu": 0.5}, max_concurrent=None,
                     grid={"lr": [0.001, 0.003, 0.01, 0.03]})
    result = orchestrate(
        "submit", str(spec), "--slurm", "--dry-run", "--nodes", "2", "--gpus-per-node", "1",
        "--cpus-per-task", "8", "--partition", "gpu", "--time", "1-00:00:00", "--account", "nlp",
        "--qos", "high", "--sbatch=--mem=32G", "--sbatch", "#SBATCH --constraint=a100",
        "--requeue", "--signal-before", "300", "--log-dir", str(tmp_path / "logs"),
        "--env", "HF_HOME=/scratch/hf",
    )
    assert result.returncode == 0, result.stderr
    script = result.stdout
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert directives == [
        "#SBATCH --job-name=nli-slurm-unit",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1-00:00:00",
        "#SBATCH --account=nlp",
        "#SBATCH --qos=high",
        f"#SBATCH --output={tmp_path / 'logs'}/%x-%j.out",
        "#SBATCH --open-mode=append",
        f"#SBATCH --chdir={Path.cwd()}",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --requeue",
        "#SBATCH --mem=32G",
        "#SBATCH --constraint=a100",
    ]
    assert f"export MLFLOW_TRACKING_URI={SERVER}" in script
    assert "export HF_HOME=/scratch/hf" in script
    assert f"SPEC={spec.resolve()}" in script
    assert f"PYTHON={sys.executable}" in script
    assert "GPUS_PER_NODE=1" in script and "REQUEUE=1" in script
    # The sweep prints no `orchestrate sweep ... --resume` of its own: the job prints its submit.
    assert "export NLI_RESUME_HINT=0" in script
    assert "scontrol requeue" in script and "--resume" in script
    assert "ray stop" not in script  # it would end every Ray of the user on the node
    # 2 nodes x min(8 CPU / 2, 1 GPU / 0.5) = 4 trials at once.
    assert "runs 4 trials at once (2 per node: 1 GPU / 0.5 per trial)" in result.stderr
    # Nothing was submitted, so nothing is recorded.
    assert not private_record.exists()
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_resume_new_and_default_flags_reach_the_sweep(tmp_path):
    spec = spec_file(tmp_path)
    flags = {}
    for extra in ((), ("--resume",), ("--new",)):
        result = orchestrate("submit", str(spec), "--slurm", "--dry-run", *extra)
        assert result.returncode == 0, result.stderr
        flags[extra] = next(line for line in result.stdout.splitlines() if line.startswith("SWEEP_FLAGS="))
        assert "#SBATCH --no-requeue" in result.stdout
    assert flags == {(): "SWEEP_FLAGS=()", ("--resume",): "SWEEP_FLAGS=(--resume)",
                     ("--new",): "SWEEP_FLAGS=(--new)"}
    # Defaults: one node, CPUs for max_concurrent_trials (2) trials of 1 CPU, output here.
    result = orchestrate("submit", str(spec), "--slurm", "--dry-run")
    assert "#SBATCH --nodes=1" in result.stdout and "#SBATCH --cpus-per-task=2" in result.stdout
    assert f"#SBATCH --output={Path.cwd()}/%x-%j.out" in result.stdout


@pytest.mark.parametrize(
    ("extra", "spec_options", "message"),
    [
        ((), {"tracking_uri": None}, "SQLite's locking is unreliable"),
        (("--tracking-uri", "sqlite:////shared/mlruns.db"), {"tracking_uri": None}, "is a file"),
        (("--sbatch=--nodes=3",), {}, "--nodes is set by the batch script; use `orchestrate submit --nodes`"),
        (("--sbatch", "-o out.txt"), {}, "-o is set by the batch script"),
        (("--sbatch", "mem=4G"), {}, "expected one sbatch option"),
        (("--time", "ten minutes"), {}, "--time 'ten minutes': expected minutes"),
        (("--time", "1", "--signal-before", "60"), {}, "is not shorter than --time"),
        ((), {"resources": {"cpu": 1, "gpu": 0.5}}, "pass --gpus-per-node"),
        (("--cpus-per-task", "1"), {"resources": {"cpu": 2}}, "raise --cpus-per-task"),
        (("--address", "http://head:8265"), {}, "--address: Ray Jobs options; not with --slurm"),
        (("--resume", "--new"), {}, "exclude each other"),
        (("--max-requeues", "2"), {}, "--max-requeues 2: only with --requeue"),
        (("--requeue", "--max-requeues", "21"), {}, "'--max-requeues': 21 is not in the range 0<=x<=20"),
    ],
)
def test_bad_slurm_submissions_exit_2_and_submit_nothing(tmp_path, private_record, extra,
                                                         spec_options, message, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = spec_file(tmp_path, **spec_options)
    # Not a dry run: had the input passed, sbatch would have been called.
    result = orchestrate("submit", str(spec), "--slurm", *extra)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not private_record.exists()


def test_slurm_options_need_slurm(tmp_path):
    result = orchestrate("submit", str(spec_file(tmp_path)), "--nodes", "2", "--requeue",
                         "--address", "http://127.0.0.1:1")
    assert result.returncode == 2
    assert "--nodes, --requeue: SLURM options; add --slurm" in result.stderr


def test_trials_at_once_follow_cpus_fractional_gpus_and_the_cap(tmp_path):
    many = {"lr": [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01]}
    quarter_gpu = load_spec(spec_file(tmp_path / "a", resources={"cpu": 1, "gpu": 0.25},
                                      max_concurrent=None, grid=many))
    assert trials_at_once(quarter_gpu, Allocation(2, 16, 1))[0] == 8  # 4 per GPU, 2 nodes
    assert trials_at_once(quarter_gpu, Allocation(2, 3, 1))[0] == 6  # CPUs bind first
    assert trials_at_once(quarter_gpu, Allocation(4, 16, 2))[0] == 10  # only 10 trials
    capped = load_spec(spec_file(tmp_path / "b", max_concurrent=3, grid=many))
    total, why = trials_at_once(capped, Allocation(2, 4, 0))
    assert total == 3 and "capped by search.max_concurrent_trials" in why


def test_validate_reports_trials_at_once_on_an_allocation(tmp_path):
    spec = spec_file(tmp_path, resources={"cpu": 1, "gpu": 0.25}, max_concurrent=None,
                     grid={"lr": [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009]})
    result = orchestrate("validate", str(spec), "--no-data", "--slurm-nodes", "2",
                         "--slurm-gpus-per-node", "1", "--slurm-cpus-per-task", "8")
    assert result.returncode == 0, result.stderr
    assert ("SLURM 2 nodes x (8 CPU, 1 GPU): 8 trials at once (4 per node: 1 GPU / 0.25 per "
            "trial); 9 trials in 2 waves") in result.stdout
    # Stacked, the waves are of stacks: auto's hold ceil(9 / 8) = 2 (at least 2) for these 8 slots.
    stacked = orchestrate("validate", str(spec), "--no-data", "--set", "search.stack=auto", "--slurm-nodes", "2",
                          "--slurm-gpus-per-node", "1", "--slurm-cpus-per-task", "8")
    assert stacked.returncode == 0, stacked.stderr
    assert "; 9 trials as 5 stacked trials (search.stack auto) in 1 wave" in stacked.stdout, stacked.stdout
    # Without a cluster, validate's own line gives auto's largest size and the rule.
    assert ("train as stacks of up to 8 members (auto: fewer where the sweep's stacks would leave trial "
            "slots idle, at least 2)") in stacked.stdout, stacked.stdout
    refused = orchestrate("validate", str(spec), "--no-data", "--slurm-nodes", "2")
    assert refused.returncode == 2 and "pass --gpus-per-node" in refused.stderr
    # Without --slurm-*, the trial must fit this machine, where a local sweep runs it: a GPU
    # trial on a machine that shows no GPU is refused, a CPU trial passes with no SLURM line.
    plain = run_orchestrate(["validate", str(spec), "--no-data"], cwd=tmp_path,
                            env={"CUDA_VISIBLE_DEVICES": "", "RAY_ADDRESS": None})
    assert plain.returncode == 2, plain.stderr
    assert "a trial asks for 1 CPU and 0.25 GPU" in plain.stderr and " CPU and 0 GPU;" in plain.stderr
    assert plain.stdout == ""
    cpu_only = spec_file(tmp_path, resources={"cpu": 1}, max_concurrent=None)
    plain = run_orchestrate(["validate", str(cpu_only), "--no-data"], cwd=tmp_path,
                            env={"RAY_ADDRESS": None})
    assert plain.returncode == 0 and "SLURM" not in plain.stdout, plain.stderr


def test_unknown_slurm_job_ids_and_an_empty_record(tmp_path):
    for command in ("logs", "stop"):
        result = orchestrate(command, "4242")
        assert result.returncode == 2, result.stderr
        assert "no SLURM job 4242 was submitted from here" in result.stderr
    listed = orchestrate("jobs", "--slurm")  # asks neither SLURM nor Ray: nothing recorded
    assert listed.returncode == 0 and listed.stdout.strip() == "no jobs"


def test_overrides_are_checked_here_and_reach_the_sweep_and_its_resumptions(tmp_path):
    spec = spec_file(tmp_path)
    result = orchestrate("submit", str(spec), "--slurm", "--dry-run", "--set", "training.epochs=3",
                         "--data-dir", "/shared/nli-data")
    assert result.returncode == 0, result.stderr
    assert ("SWEEP_OPTIONS=(--set training.epochs=3 --data-dir /shared/nli-data)"
            in result.stdout)
    # The sweep command takes both; a requeued run changes SWEEP_FLAGS alone.
    assert '"${SWEEP_OPTIONS[@]}" &' in result.stdout
    assert "SWEEP_OPTIONS=(" not in result.stdout.split("SWEEP_OPTIONS=(", 1)[1]
    bad = orchestrate("submit", str(spec), "--slurm", "--set", "training.epochs=-1")
    assert bad.returncode == 2 and "training.epochs" in bad.stderr


INJECTED = "gpu\ntouch /tmp/nli-injected"


@pytest.mark.parametrize(
    ("options", "in_cwd", "named"),
    [
        (("--partition", INJECTED), "", "--partition"),
        (("--account", INJECTED), "", "--account"),
        (("--qos", INJECTED), "", "--qos"),
        (("--qos", "high --nodes=64"), "", "--qos"),  # a second option on the #SBATCH line
        (("--log-dir", "logs\ntouch /tmp/nli-injected"), "", "--log-dir"),
        (("--sbatch", "--mem=4G --nodes=64"), "", "--sbatch"),
        (("--sbatch", "--mem=4G\ntouch /tmp/nli-injected"), "", "--sbatch"),
        ((), "work\ntouch /tmp/nli-injected", "the working directory (--chdir)"),
    ],
)
def test_values_that_would_inject_into_the_batch_script_are_refused(tmp_path, private_record,
                                                                    options, in_cwd, named):
    """Issue 27: a newline in an #SBATCH value ended the #SBATCH block and ran the rest as a
    command on the compute node. Through the real CLI process, with and without --dry-run."""
    spec = spec_file(tmp_path / "specs")
    cwd = tmp_path / in_cwd if in_cwd else tmp_path
    cwd.mkdir(parents=True, exist_ok=True)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    for dry_run in (("--dry-run",), ()):
        result = run_orchestrate(["submit", str(spec), "--slurm", *dry_run, *options], cwd=cwd,
                                 env=env, timeout=120)
        assert result.returncode == 2, (result.stdout, result.stderr)
        assert result.stdout == ""  # no script printed
        assert result.stderr.startswith(f"error: {named} ") and result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr
    assert not private_record.exists()
    assert not (tmp_path / "logs\ntouch /tmp/nli-injected").exists()


def test_partition_lists_and_plain_names_pass(tmp_path):
    result = orchestrate("submit", str(spec_file(tmp_path)), "--slurm", "--dry-run",
                         "--partition", "gpu,a100", "--account", "nlp-lab_2", "--qos", "normal")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --partition=gpu,a100" in result.stdout
    assert "#SBATCH --account=nlp-lab_2" in result.stdout
