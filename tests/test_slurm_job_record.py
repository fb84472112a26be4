"""What a SLURM job leaves for the user without a cluster (issue 29): the resume command its
script prints is `orchestrate submit ... --slurm --resume` with the original options and no
password, and `orchestrate jobs` shows ended jobs from the record alone (no SLURM query: none of
SLURM's commands is on PATH here) within 3 s for 20 jobs."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from test_slurm import spec_file
from testkit.cli import ORCHESTRATE, orchestrate, run_orchestrate

from orchestrator.cluster.slurm_jobs import Submitted


def script_value(script: str, name: str) -> str:
    line = next(line for line in script.splitlines() if line.startswith(f"{name}="))
    [value] = shlex.split(line.split("=", 1)[1])
    return value


def test_the_resume_command_repeats_the_submits_options_without_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = spec_file(tmp_path, tracking_uri=None)
    uri = "http://alice:s3cret-pw@mlflow.cluster.example:5000"
    result = orchestrate(
        "submit", str(spec), "--slurm", "--dry-run", "--new", "--tracking-uri", uri,
        "--nodes", "2", "--partition", "gpu", "--time", "30", "--requeue", "--signal-before", "120",
        "--sbatch=--mem=8G", "--log-dir", str(tmp_path / "logs"), "--env", "NLI_DATA_DIR=/shared/d",
        "--set", "training.epochs=3",
    )
    assert result.returncode == 0, result.stderr
    assert "s3cret-pw" not in result.stdout
    command = shlex.split(script_value(result.stdout, "RESUME_COMMAND"))
    assert command[:5] == ["orchestrate", "submit", str(spec.resolve()), "--slurm", "--resume"]
    assert "--new" not in command
    pairs = {(command[i], command[i + 1]) for i in range(len(command) - 1)}
    assert {("--nodes", "2"), ("--cpus-per-task", "1"), ("--partition", "gpu"), ("--time", "30"),
            ("--signal-before", "120"), ("--log-dir", str(tmp_path / "logs")),
            ("--tracking-uri", "http://alice:***@mlflow.cluster.example:5000"),
            ("--env", "NLI_DATA_DIR=/shared/d"), ("--set", "training.epochs=3")} <= pairs
    assert "--requeue" in command and "--sbatch=--mem=8G" in command
    # The job prints it when it ends other than completed, after a stop says so.
    assert 'say "resume with: $RESUME_COMMAND"' in result.stdout


@pytest.mark.serial
def test_jobs_lists_ended_jobs_from_the_record_without_asking_slurm(tmp_path):
    """20 ended jobs, the record's cached ends only: SLURM's commands are not on PATH, so any
    query would fail the command."""
    record = tmp_path / "cache" / "nli-orchestrator" / "slurm-jobs.jsonl"
    record.parent.mkdir(parents=True)
    states = ["COMPLETED", "STOPPED", "FAILED", "TIMEOUT"]
    with record.open("w") as handle:
        for n in range(20):
            entry = Submitted(job_id=str(100 + n), spec=str(tmp_path / "spec.yaml"),
                              spec_name=f"exp-{n}", tracking_uri="http://127.0.0.1:1",
                              planned_trials=8, output=str(tmp_path / f"nli-{n}.out"),
                              submitted="2026-11-26T07:00:00")
            handle.write(json.dumps(asdict(entry)) + "\n")  # as submitted, then its end
            ended = {**asdict(entry), "final_state": states[n % 4], "final_elapsed": "00:01:00",
                     "trials_done": n % 9}
            handle.write(json.dumps(ended) + "\n")
    # The environment's bin alone on PATH (the console script names its Python in full).
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": str(Path(ORCHESTRATE).parent)}
    assert not Path(ORCHESTRATE).with_name("squeue").exists()
    started = time.monotonic()
    result = run_orchestrate(["jobs", "--slurm"], cwd=tmp_path, env=env, timeout=60)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["JOB", "BACKEND", "SPEC", "EXPERIMENT", "STATE", "ELAPSED", "TRIALS"]
    rows = [line.split() for line in lines[1:]]
    assert len(rows) == 20  # one row per job, its end replacing its submission
    assert rows[1][:2] == ["101", "slurm"] and rows[1][3:] == ["exp-1", "STOPPED", "0:01:00", "1/8"]
    assert seconds <= 3.0, f"jobs took {seconds:.1f}s for 20 jobs"


def test_a_time_limit_that_leaves_no_time_to_train_is_warned_about(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = spec_file(tmp_path)
    short = orchestrate("submit", str(spec), "--slurm", "--dry-run", "--time", "4",
                        "--signal-before", "90", "--requeue", "--max-requeues", "1")
    assert short.returncode == 0, short.stderr
    assert ("warning: --time 4 leaves 30s to train per allocation after --signal-before 90s "
            "and ~120s to start Ray and the sweep (less than 300s)") in short.stderr
    assert "MAX_REQUEUES=1" in short.stdout
    # A dry run checks the server too; one that does not answer is a warning (it may be started
    # before the submission, which refuses it).
    assert "warning: tracking server http://mlflow.cluster.example:5000 does not answer" in short.stderr
    roomy = orchestrate("submit", str(spec), "--slurm", "--dry-run", "--time", "30", "--requeue")
    assert roomy.returncode == 0, roomy.stderr
    assert "to train per allocation" not in roomy.stderr and "MAX_REQUEUES=3" in roomy.stdout


def test_setup_lines_run_before_ray_and_are_one_line_each(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = spec_file(tmp_path)
    result = orchestrate("submit", str(spec), "--slurm", "--dry-run", "--setup", "module load cuda/12",
                         "--setup", "source /shared/venv/bin/activate")
    assert result.returncode == 0, result.stderr
    script = result.stdout
    # In order, before `set -u` (site scripts read unset variables) and before Ray starts.
    positions = [script.index(text) for text in (
        "module load cuda/12\nsource /shared/venv/bin/activate\n", "\nset -u\n", "node head-ports")]
    assert positions == sorted(positions)
    resume = shlex.split(script_value(script, "RESUME_COMMAND"))
    assert ["--setup", "module load cuda/12", "--setup", "source /shared/venv/bin/activate"] == [
        word for i, word in enumerate(resume) if word == "--setup" or resume[i - 1] == "--setup"]
    bad = orchestrate("submit", str(spec), "--slurm", "--setup", "module load x\nrm -rf ~")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: --setup 'module load x\\nrm -rf ~': holds a control character")
    # Lines that are not whole shell would break the script around them (found by
    # test_generated_inputs: a lone ")"); a construct may span several --setup lines.
    for setup, why in (([")"], "syntax error near unexpected token"), (["echo 'a"], "unexpected EOF"),
                       (["cat <<END"], "here-document"), (["if true; then"], "syntax error")):
        broken = orchestrate("submit", str(spec), "--slurm", *[w for line in setup for w in ("--setup", line)])
        assert broken.returncode == 2 and broken.stdout == "", broken.stderr
        assert broken.stderr.startswith(f"error: --setup {setup[0]!r}: not complete shell lines"), broken.stderr
        assert why in broken.stderr and broken.stderr.count("\n") == 1, broken.stderr
    spanning = orchestrate("submit", str(spec), "--slurm", "--dry-run", "--setup", "if true; then",
                           "--setup", "module load cuda/12", "--setup", "fi")
    assert spanning.returncode == 0, spanning.stderr
    assert not (tmp_path / "cache").exists()


def test_ray_memory_follows_the_allocation():
    from orchestrator.cluster.slurm_node import memory_options

    gib = 1024 ** 3
    assert memory_options({}) == []  # no --mem: Ray sizes itself
    assert memory_options({"SLURM_MEM_PER_NODE": "0"}) == []
    assert memory_options({"SLURM_MEM_PER_NODE": "10240"}, shm_bytes=64 * gib) == [
        f"--memory={7 * gib}", f"--object-store-memory={3 * gib}"]
    assert memory_options({"SLURM_MEM_PER_CPU": "1024", "SLURM_CPUS_ON_NODE": "4"},
                          shm_bytes=64 * gib) == [
        f"--memory={4 * gib - int(1.2 * gib)}", f"--object-store-memory={int(1.2 * gib)}"]
    # A small /dev/shm caps the store (Ray refuses one larger than it).
    assert memory_options({"SLURM_MEM_PER_NODE": "10240"}, shm_bytes=gib) == [
        f"--memory={10 * gib - int(0.95 * gib)}", f"--object-store-memory={int(0.95 * gib)}"]


def _fake_slurm(folder: Path, queue: str) -> Path:
    """squeue printing `queue` (its -o "%i|%T|%M|%r" lines), and a cluster without accounting
    whose controller has forgotten every ended job: sacct and scontrol know no job."""
    bin_dir = folder / "fake-slurm"
    bin_dir.mkdir(parents=True)
    scripts = {
        "squeue": f"cat <<'EOF'\n{queue}EOF\n",
        "sacct": "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1\n",
        "scontrol": "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _submitted(folder: Path, job_id: str, name: str) -> Submitted:
    return Submitted(job_id=job_id, spec=str(folder / "spec.yaml"), spec_name=name,
                     tracking_uri="http://127.0.0.1:1", planned_trials=36,
                     output=str(folder / f"nli-{name}-{job_id}.out"), submitted="2026-11-28T07:00:00")


def test_jobs_reads_the_end_file_of_a_job_slurm_forgot_and_counts_every_run(tmp_path):
    """Issue 44: a finished job that slurmctld had forgotten (no accounting, past MinJobAge)
    showed UNKNOWN with 0 trials although its end file held COMPLETED and 36; ELAPSED mixed
    `00:02:45` and `1:10`; a requeued job showed its last run's time only."""
    record = tmp_path / "cache" / "nli-orchestrator" / "slurm-jobs.jsonl"
    record.parent.mkdir(parents=True)
    forgotten = _submitted(tmp_path, "201", "forgotten")
    requeued = _submitted(tmp_path, "202", "requeued")
    gone = _submitted(tmp_path, "203", "gone")  # forgotten, and killed before writing its end
    record.write_text("".join(json.dumps(asdict(e)) + "\n" for e in (forgotten, requeued, gone)))
    # The forgotten job ran twice (requeued once): 100 s, then 65 s; its end file says so.
    forgotten.end_file.write_text(json.dumps({"state": "COMPLETED", "exit_code": 0,
                                              "experiment": "forgotten", "trials_done": 36,
                                              "elapsed_s": 165}) + "\n")
    # The requeued job's first run took 100 s; its second runs now, 1:10 by squeue.
    Path(requeued.output).with_suffix(".runs").write_text("start 1000\nend 1100\nstart 1200\n")
    bin_dir = _fake_slurm(tmp_path, "202|RUNNING|1:10|None\n")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PATH": f"{bin_dir}:{Path(ORCHESTRATE).parent}:/usr/bin:/bin"}

    result = run_orchestrate(["jobs", "--slurm"], cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert rows["201"][4:] == ["COMPLETED", "0:02:45", "36/36"], result.stdout
    assert rows["202"][4:6] == ["RUNNING", "0:02:50"], result.stdout  # 100 s + 70 s
    assert rows["203"][4:6] == ["UNKNOWN", "-"], result.stdout  # nothing says how it ended
    # The forgotten job's end is in the record now: listed again with SLURM's commands gone.
    [ended] = [json.loads(line) for line in record.read_text().splitlines()[3:]]
    assert (ended["job_id"], ended["final_state"], ended["final_elapsed"], ended["trials_done"]) == (
        "201", "COMPLETED", "0:02:45", 36)
    again = run_orchestrate(["jobs", "--slurm", "--json"], cwd=tmp_path, timeout=120,
                            env={**env, "PATH": f"{_fake_slurm(tmp_path / 'later', '')}:{Path(ORCHESTRATE).parent}"})
    shown = {row["job_id"]: row for row in map(json.loads, again.stdout.splitlines())}
    assert (shown["201"]["state"], shown["201"]["trials_done"]) == ("COMPLETED", 36)


def test_the_job_end_counts_the_time_of_every_run(tmp_path):
    from orchestrator.cluster.slurm_node import job_end, run_times

    runs = tmp_path / "nli-x-7.runs"
    # A run killed before it noted its end (SIGKILL) adds nothing; a torn line is skipped.
    runs.write_text("start 1000\nend 1100\nstart 1200\nstart 1300\nend 1360\nend 13")
    assert run_times(runs) == (160.0, None)
    runs.write_text(f"start 1000\nend 1100\nstart {time.time() - 50:.0f}\n")
    job_end(str(tmp_path / "nli-x-7.end"), "COMPLETED", "0", "x", "")
    written = json.loads((tmp_path / "nli-x-7.end").read_text())
    assert 149 <= written["elapsed_s"] <= 155 and written["trials_done"] == 0
    assert run_times(tmp_path / "none.runs") is None
