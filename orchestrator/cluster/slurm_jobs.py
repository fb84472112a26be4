"""SLURM's commands (sbatch, squeue, sacct, scontrol, scancel) for `orchestrate submit --slurm`,
`jobs`, `logs` and `stop`, and the record of submissions:
$XDG_CACHE_HOME/nli-orchestrator/slurm-jobs.jsonl (default ~/.cache/...), JSON lines, one per job."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from nli_models.errors import mask_secrets, without_passwords
from orchestrator.cluster.slurm import SlurmInputError, time_limit_seconds
from orchestrator.cluster.slurm_node import run_times, runs_file
from orchestrator.cluster.slurm_script import BatchJob
from orchestrator.ray_adapter.ray_jobs import (
    ClusterError,
)
from orchestrator.sweep.environment import cache_dir

COMMAND_TIMEOUT_S = 60  # an sbatch/squeue/sacct/scontrol/scancel call that takes longer fails


# -- SLURM's commands -------------------------------------------------------------------------
def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise ClusterError(f"{argv[0]} not found: run this on a machine with SLURM's client "
                           "commands (a login node), or install slurm-client")
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{shlex.join(argv)}` did not answer in {COMMAND_TIMEOUT_S}s") from None
    if check and result.returncode != 0:
        raise ClusterError(f"`{shlex.join(argv)}` failed: {(result.stderr or result.stdout).strip()}")
    return result


def sbatch(job: BatchJob) -> str:
    """Submit; returns the job id. The script is kept next to the job's output."""
    Path(job.log_dir).mkdir(parents=True, exist_ok=True)  # sbatch does not create it
    if shutil.which("sbatch") is None:
        _run(["sbatch"])
    try:
        result = subprocess.run(["sbatch", "--parsable"], input=job.script, capture_output=True,
                                text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"sbatch did not answer in {COMMAND_TIMEOUT_S}s") from None
    if result.returncode != 0:
        raise ClusterError(f"sbatch refused the job: {result.stderr.strip()}")
    job_id = result.stdout.strip().split(";")[0]
    # A copy to read, beside the output: the job was given the script with its passwords.
    (Path(job.log_dir) / f"{job.job_name}-{job_id}.sbatch").write_text(mask_secrets(job.script))
    return job_id


def slurm_seconds(text: str | None) -> int | None:
    """Seconds in a time as squeue, sacct and scontrol print it (`1:10`, `00:02:45`,
    `1-02:03:04`: the formats sbatch --time takes); None for anything else (`-`, INVALID)."""
    try:
        return time_limit_seconds(text or "")
    except SlurmInputError:
        return None


@dataclass
class JobState:
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ... or UNKNOWN
    elapsed: str = "-"
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED",
                              "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING",
                              "STAGE_OUT", "STOPPED")


def _squeue(job_ids: list[str]) -> dict[str, JobState]:
    result = _run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%M|%r"], check=False)
    states = {}
    for line in result.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            reason = parts[3] if parts[3] not in ("None", "(null)") else ""
            states[parts[0]] = JobState(parts[1], parts[2], reason)
    return states


def _sacct(job_id: str) -> JobState | None:
    result = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,Elapsed"], check=False)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        return None  # no accounting on this cluster, or a job it does not know
    state, elapsed = (lines[-1].split("|") + ["-"])[:2]
    return JobState(state.split()[0], elapsed)


def _scontrol(job_id: str) -> JobState | None:
    """A finished job's state while the controller still holds it (MinJobAge, 300 s by default)."""
    result = _run(["scontrol", "show", "job", "-o", job_id], check=False)
    fields = dict(re.findall(r"(\w+)=(\S*)", result.stdout))
    if result.returncode != 0 or "JobState" not in fields:
        return None
    return JobState(fields["JobState"], fields.get("RunTime", "-"))


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """Every job's state: squeue for the queue, then sacct, then scontrol for finished ones."""
    if not job_ids:
        return {}
    states = _squeue(job_ids)
    for job_id in job_ids:
        if job_id not in states:
            states[job_id] = _sacct(job_id) or _scontrol(job_id) or JobState("UNKNOWN")
    return states


def signal_batch_shell(job_id: str, signal_name: str) -> None:
    _run(["scancel", "--batch", f"--signal={signal_name}", job_id])


def cancel(job_id: str) -> None:
    _run(["scancel", job_id])


def stop(job_id: str, timeout_s: float, poll_s: float = 2.0) -> tuple[bool, str]:
    """Stop a sweep job the way its time limit does, without a requeue: USR2 to the batch shell
    (the sweep stops cleanly, Ray is shut down); scancel if it is still there after `timeout_s`,
    or at once while it waits in the queue. Returns (whether it was active, its state after)."""
    state = job_states([job_id])[job_id]
    if not state.active:
        return False, state.state
    if state.state == "RUNNING":
        signal_batch_shell(job_id, "USR2")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(poll_s)
            state = job_states([job_id])[job_id]
            if not state.active:
                return True, state.state
    cancel(job_id)
    deadline = time.monotonic() + 30
    while state.active and time.monotonic() < deadline:
        time.sleep(poll_s)
        state = job_states([job_id])[job_id]
    return True, state.state


# -- the local record of submissions ----------------------------------------------------------
@dataclass
class Submitted:
    job_id: str
    spec: str
    spec_name: str
    tracking_uri: str
    planned_trials: int
    output: str  # the job's output file
    submitted: str  # ISO time
    backend: str = "slurm"
    # Once the job has ended (cached by `orchestrate jobs`, so a finished job needs no query):
    final_state: str | None = None  # SLURM's state, or STOPPED for a user's stop
    final_elapsed: str | None = None
    trials_done: int | None = None  # trials this job finished (in all its runs)

    @property
    def end_file(self) -> Path:
        """What the batch script writes as the job ends (slurm_node.job_end)."""
        return Path(self.output).with_suffix(".end")

    @property
    def started_file(self) -> Path:
        """The batch script's marker of when a run of the job first started the sweep (ms)."""
        return Path(self.output).with_suffix(".started")

    def elapsed_s(self, state: JobState) -> int | None:
        """The job's time over all its runs: those its runs file shows ended, plus the current
        (or last, if it never noted its end) run as SLURM counts it; SLURM alone counts only the
        latest run of a requeued job. None: unknown."""
        times = run_times(runs_file(self.end_file))
        current = slurm_seconds(state.elapsed)
        if times is None:
            return current
        ended, open_since = times
        if open_since is None:
            return round(ended)
        return None if current is None else round(ended) + current

    def sweep_started_ms(self) -> int | None:
        """When the job first started the sweep (None: not yet, or its marker is gone): the
        sweep's trials that finished after it are this job's."""
        try:
            return int(self.started_file.read_text().strip())
        except (OSError, ValueError):
            return None


def record_path() -> Path:
    return cache_dir() / "slurm-jobs.jsonl"


def record(job: BatchJob, job_id: str) -> Submitted:
    entry = Submitted(
        job_id=job_id, spec=job.spec_path, spec_name=job.spec_name,
        tracking_uri=without_passwords(job.tracking_uri),
        planned_trials=job.planned_trials, output=str(Path(job.log_dir) / f"{job.job_name}-{job_id}.out"),
        submitted=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(asdict(entry)) + "\n")
    return entry


def submissions() -> list[Submitted]:
    """Recorded SLURM submissions, oldest first (a torn last line is skipped); a job's later
    line (its end, cached) replaces its earlier ones."""
    path = record_path()
    if not path.is_file():
        return []
    entries: dict[str, Submitted] = {}
    for line in path.read_text().splitlines():
        try:
            entry = Submitted(**json.loads(line))
        except (ValueError, TypeError):
            continue
        entries[entry.job_id] = entry
    return list(entries.values())


def end_record(entry: Submitted) -> dict | None:
    """What the job's script wrote as it ended (slurm_node.job_end), or None: not ended, or
    killed before it could write it."""
    try:
        written = json.loads(entry.end_file.read_text())
    except (OSError, ValueError):
        return None
    return written if isinstance(written, dict) and "state" in written else None


def job_end(entry: Submitted, state: JobState) -> tuple[str, int | None]:
    """A finished job's state (STOPPED for a user's stop, from the job's end file; else SLURM's)
    and the trials it finished (None: unknown)."""
    written = end_record(entry)
    if written is None:
        return state.state, None
    return written["state"], written.get("trials_done")


def record_end(entry: Submitted, state: str, elapsed: str, trials_done: int | None) -> Submitted:
    """Append the job's end to the record: `jobs` shows it from there on without asking SLURM.
    An ended job is requeued no more: its marker of when it started the sweep goes (a job
    cancelled or killed mid-run could not remove it; a preempted job that SLURM requeues needs
    it, and is not ended)."""
    entry.started_file.unlink(missing_ok=True)
    ended = Submitted(**{**asdict(entry), "final_state": state, "final_elapsed": elapsed,
                         "trials_done": trials_done})
    with record_path().open("a") as handle:
        handle.write(json.dumps(asdict(ended)) + "\n")
    return ended


def find(job_id: str) -> Submitted | None:
    return next((s for s in reversed(submissions()) if s.job_id == job_id), None)
