"""Sweeps as SLURM batch jobs: `orchestrate submit SPEC --slurm`, and `jobs` / `logs` / `stop` for
them, through sbatch, squeue, sacct, scontrol and scancel.

The batch script starts a Ray cluster private to the job (its own ports and temp dir; the head on
the batch node, one `ray start --block` per other node through srun), runs `orchestrate sweep` on
the head against the experiment's tracking server, and stops exactly the Ray processes it started
(their pids and process group, then whatever still names the job's temp dir). Signals:

- USR1, asked for with `--signal=B:USR1@SECONDS` before the time limit: the script sends SIGTERM to
  the sweep (it stops cleanly, resumable, exit 3) and, with --requeue, requeues the job once Ray
  is down; a requeued run (SLURM_RESTART_COUNT > 0) starts the sweep with --resume. No requeue
  after --max-requeues of them, or after a run that finished no trial.
- USR2, sent by `orchestrate stop` to the batch shell alone: the same clean stop, no requeue; the
  job then exits 0 and its end file (JOBNAME-JOBID.end, beside the output) says STOPPED.
- TERM (scancel, preemption, the time limit itself): SLURM sends it to every process of the job;
  the script only cleans up.

The record of submissions (JSON lines, one per job) tells which SLURM jobs are sweeps and where
their spec, output and tracking server are: $XDG_CACHE_HOME/nli-orchestrator/slurm-jobs.jsonl
(default ~/.cache/...).
"""

from __future__ import annotations

import base64
import math
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from nli_models.errors import mask_secrets
from orchestrator.cli.options import DEFAULT_SIGNAL_BEFORE_S
from orchestrator.ray_adapter.ray_jobs import (
    JobInputError,
)
from results.tracking_uri import PROBE_TIMEOUT_S, split_credentials

DEFAULT_MAX_REQUEUES = 3  # as submitit's slurm_max_num_timeout
# What an allocation spends before its first trial trains: Ray's start and the sweep's (51-69 s,
# then 40 s to a first trial, on a loaded node; issue 29), with a margin.
STARTUP_ALLOWANCE_S = 120
MIN_TRAINING_S = 300  # less than this left to train per allocation gets a warning
# Tracking stores that the nodes reach over the network. SQLite (and MLflow's file store) is a
# file: on the shared file systems of clusters (NFS, Lustre, GPFS) its locking is unreliable, so
# trials writing from several nodes at once lose or corrupt runs.
NETWORK_STORES = ("http://", "https://", "postgresql", "mysql", "mssql", "databricks")
# Options the script itself sets; an extra #SBATCH line may not change them.
MANAGED_OPTIONS = {
    "--nodes": "--nodes", "-N": "--nodes", "--cpus-per-task": "--cpus-per-task",
    "-c": "--cpus-per-task", "--gpus-per-node": "--gpus-per-node", "--ntasks-per-node": None,
    "--ntasks": None, "-n": None, "--partition": "--partition", "-p": "--partition",
    "--time": "--time", "-t": "--time", "--account": "--account", "-A": "--account",
    "--qos": "--qos", "-q": "--qos", "--output": "--log-dir", "-o": "--log-dir",
    "--error": "--log-dir", "-e": "--log-dir", "--open-mode": None, "--chdir": None, "-D": None,
    "--signal": "--signal-before", "--requeue": "--requeue", "--no-requeue": "--requeue",
    "--job-name": "--job-name", "-J": "--job-name",
}
TIME_FORMATS = (  # sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    r"(?P<m>\d+)", r"(?P<m>\d+):(?P<s>\d+)", r"(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)",
    r"(?P<d>\d+)-(?P<h>\d+)", r"(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+)",
    r"(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)",
)
# Values pasted into `#SBATCH` lines. sbatch reads a line up to its newline and splits it on white
# space: a newline in a value would end the #SBATCH block and run the rest as a command on the
# compute node, a space would add options of its own. Names (partitions, accounts, QOS) are
# letters, digits and these marks; a partition list is comma-separated.
SBATCH_NAME = re.compile(r"[A-Za-z0-9_.,+@:-]+")
# Paths in #SBATCH lines (--output, --chdir): no white space or control characters (as above), no
# quotes or backslashes (sbatch unquotes them), no % (sbatch expands %x, %j, ... in --output).
UNSAFE_PATH = re.compile(r"[\s\x00-\x1f\x7f\"'\\%]")


class SlurmInputError(JobInputError):
    """Bad input for a SLURM submission (exit code 2, nothing submitted)."""


# -- the allocation and what runs on it -------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    nodes: int = 1
    cpus_per_task: int = 1  # one task per node: the node's Ray gets them all
    gpus_per_node: int = 0

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU" if self.gpus_per_node else ""
        return f"{self.nodes} node{'s' * (self.nodes > 1)} x ({self.cpus_per_task} CPU{gpus})"


def default_cpus_per_task(spec, nodes: int) -> int:
    """Enough CPUs per node for max_concurrent_trials trials spread over the nodes (one trial's
    worth without a cap)."""
    per_node = math.ceil((spec.search.max_concurrent_trials or 1) / nodes)
    return max(1, math.ceil(spec.search.resources.cpu * per_node))


def trials_at_once(spec, allocation: Allocation, source: str = "the allocation") -> tuple[int, str]:
    """How many trials run side by side on `allocation`, and why. SlurmInputError when a trial
    fits on no node (it would wait forever)."""
    cpu, gpu = spec.search.resources.cpu, spec.search.resources.gpu
    if cpu > allocation.cpus_per_task:
        raise SlurmInputError(
            f"a trial needs {cpu:g} CPUs (search.resources.cpu) but {source} gives each node "
            f"{allocation.cpus_per_task}; raise --cpus-per-task or lower search.resources.cpu"
        )
    if gpu > allocation.gpus_per_node:
        raise SlurmInputError(
            f"a trial needs {gpu:g} GPU (search.resources.gpu) but {source} gives each node "
            f"{allocation.gpus_per_node}; pass --gpus-per-node"
        )
    by_cpu = math.floor(allocation.cpus_per_task / cpu + 1e-9)
    per_node, limit = by_cpu, f"{allocation.cpus_per_task} CPU / {cpu:g} per trial"
    if gpu:
        by_gpu = math.floor(allocation.gpus_per_node / gpu + 1e-9)
        if by_gpu < by_cpu:
            per_node, limit = by_gpu, f"{allocation.gpus_per_node} GPU / {gpu:g} per trial"
    total = per_node * allocation.nodes
    why = f"{per_node} per node: {limit}"
    cap = spec.search.max_concurrent_trials
    if cap is not None and cap < total:
        total, why = cap, f"{why}, capped by search.max_concurrent_trials"
    if spec.num_trials() < total:
        total, why = spec.num_trials(), f"{why}; the sweep has {spec.num_trials()} trials"
    return total, why


def allocation_report(spec, allocation: Allocation) -> str:
    """`orchestrate validate --slurm-nodes ...`: one line on what the allocation runs at once. A
    stacked sweep runs its stacks (sized, with search.stack auto, for these trial slots) in waves."""
    from orchestrator.sweep.estimate_probe import stacked_trials  # the data layer: only here

    total, why = trials_at_once(spec, allocation)
    stacks = stacked_trials(spec, total)
    tune_trials = spec.num_trials() if stacks is None else len(stacks)
    waves = math.ceil(tune_trials / total)
    stacked = "" if stacks is None else f" as {len(stacks)} stacked trials (search.stack {spec.search.stack})"
    return (f"  SLURM {allocation.describe()}: {total} trials at once ({why}); "
            f"{spec.num_trials()} trials{stacked} in {waves} wave{'s' * (waves > 1)}")


# -- options ----------------------------------------------------------------------------------
@dataclass
class SlurmOptions:
    allocation: Allocation
    partition: str | None = None
    time_limit: str | None = None
    account: str | None = None
    qos: str | None = None
    extra: list[str] = field(default_factory=list)  # #SBATCH lines, as given
    requeue: bool = False
    max_requeues: int = DEFAULT_MAX_REQUEUES
    signal_before_s: int = DEFAULT_SIGNAL_BEFORE_S
    log_dir: str = "."
    job_name: str | None = None
    setup: list[str] = field(default_factory=list)  # shell lines run before Ray starts


def time_limit_seconds(text: str) -> int:
    """Seconds in an sbatch --time value; SlurmInputError for anything sbatch would refuse."""
    for pattern in TIME_FORMATS:
        match = re.fullmatch(pattern, text.strip())
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
            return (parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60
                    + parts.get("s", 0))
    raise SlurmInputError(
        f"--time {text!r}: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
        "(as sbatch takes it)"
    )


def sbatch_line(text: str) -> str:
    """An extra `#SBATCH` option (given as `--mem=16G` or `#SBATCH --mem=16G`)."""
    line = re.sub(r"^#SBATCH\s+", "", text.strip())
    # One option and its value: `--name[=value]` or `-x[ ]value`, the value without white space
    # (a second word would be a second option, a newline the end of the #SBATCH block).
    if not re.fullmatch(r"--[A-Za-z][\w-]*(=\S+)?|-[A-Za-z]( ?\S+)?", line) or any(
        ord(c) < 32 or ord(c) == 127 for c in line
    ):
        raise SlurmInputError(f"--sbatch {text!r}: expected one sbatch option, e.g. --mem=16G")
    option = re.split(r"[=\s]", line, maxsplit=1)[0] if line.startswith("--") else line[:2]
    if option in MANAGED_OPTIONS:
        instead = MANAGED_OPTIONS[option]
        advice = f"use `orchestrate submit {instead}`" if instead else "the script sets it"
        raise SlurmInputError(f"--sbatch {text!r}: {option} is set by the batch script; {advice}")
    return line


def check_name(option: str, value: str | None) -> None:
    """SlurmInputError unless `value` (a partition, account or QOS) is a plain name."""
    if value is not None and not SBATCH_NAME.fullmatch(value):
        raise SlurmInputError(
            f"{option} {value!r}: letters, digits and _.,+@:- only (it goes into an #SBATCH line)"
        )


def check_path(option: str, path: str | Path) -> None:
    """SlurmInputError for a path that an #SBATCH line or the script's comments cannot hold."""
    bad = UNSAFE_PATH.search(str(path))
    if bad:
        raise SlurmInputError(
            f"{option} {str(path)!r}: holds {bad.group()!r}; a path in the batch script's #SBATCH "
            "lines may not hold white space, control characters, quotes, backslashes or %: "
            "use another folder"
        )


def short_allocation_warning(options: SlurmOptions, measured=None) -> str | None:
    """A --time that leaves less than one epoch to train once the sweep's stop signal and the
    start-up are taken off: its allocations may end with no trial done. `measured`: the spec's
    latest `validate --estimate` (estimate.Measured: an epoch's and the start-up's time); without
    one, STARTUP_ALLOWANCE_S and MIN_TRAINING_S stand in."""
    if options.time_limit is None:
        return None
    limit = time_limit_seconds(options.time_limit)
    startup = measured.startup_s if measured else STARTUP_ALLOWANCE_S
    needed = measured.epoch_s if measured else MIN_TRAINING_S
    left = limit - options.signal_before_s - startup
    if not limit or left >= needed:
        return None
    before = (f"--time {options.time_limit} leaves {max(left, 0):.0f}s to train per allocation after "
              f"--signal-before {options.signal_before_s}s and ")
    after = "; an allocation that finishes no trial is not requeued"
    if measured:
        return (f"{before}{startup:.0f}s to start Ray and the sweep, less than one epoch "
                f"({needed:.0f}s; both measured by `orchestrate validate SPEC --estimate` on "
                f"{measured.host} at {measured.when}){after}")
    return (f"{before}~{startup}s to start Ray and the sweep (less than {needed}s){after}. "
            "Measure an epoch and the start-up with `orchestrate validate SPEC --estimate`: "
            "submit then checks against them")


def check_options(options: SlurmOptions) -> None:
    for option, value in (("--partition", options.partition), ("--account", options.account),
                          ("--qos", options.qos)):
        check_name(option, value)
    check_path("--log-dir", options.log_dir)
    if options.time_limit is not None:
        limit = time_limit_seconds(options.time_limit)
        if limit and options.signal_before_s >= limit:
            raise SlurmInputError(
                f"--signal-before {options.signal_before_s}s is not shorter than --time "
                f"{options.time_limit} ({limit}s): the sweep would be stopped at once"
            )
    for line in options.extra:
        sbatch_line(line)
    for line in options.setup:
        if any(ord(c) < 32 or ord(c) == 127 for c in line):
            raise SlurmInputError(f"--setup {line!r}: holds a control character (a newline?); "
                                  "one shell line per --setup, repeat the option for more")
    check_setup_syntax(options.setup)
    if options.job_name is not None and not re.fullmatch(r"[A-Za-z0-9_.+-]+", options.job_name):
        raise SlurmInputError(f"--job-name {options.job_name!r}: letters, digits and _.+- only")


def check_setup_syntax(setup: list[str]) -> None:
    """The --setup lines stand in the job's bash script as they are: lines that are not whole
    shell (a lone `)`, an open quote, a here-document) would break the script around them, and
    the job would fail only once SLURM starts it. bash parses them first (`bash -n`, nothing run);
    where this machine has no bash, the check is left to the job.

    Args:
        setup: the --setup lines, in order (a construct may span several).
    """
    bash = shutil.which("bash")
    if not setup or bash is None:
        return
    parsed = subprocess.run([bash, "-n"], input="\n".join(setup) + "\n", capture_output=True, text=True)
    if parsed.returncode != 0 or parsed.stderr.strip():
        why = parsed.stderr.strip().splitlines()[0].split(": ", 2)[-1]
        raise SlurmInputError(f"--setup {' / '.join(map(repr, setup))}: not complete shell lines "
                              f"({why}); each --setup is one line of the job's bash script, run "
                              "before Ray starts, and together they must parse on their own")


def slurm_tracking_uri(uri: str) -> str:
    if uri.startswith(NETWORK_STORES):
        return uri
    raise SlurmInputError(
        f"tracking store {uri} is a file: the job's trials write to it from every node, and "
        "SQLite's locking is unreliable on the network file systems clusters share (NFS, "
        "Lustre), so runs get lost or the store corrupted. Run the tracking server where the "
        "nodes reach it (`orchestrate server --host 0.0.0.0 --basic-auth` on the login or a service node) and "
        "pass --tracking-uri http://HOST:5000, or set search.tracking_uri / MLFLOW_TRACKING_URI"
    )


def loopback_warning(uri: str) -> str | None:
    host = urlsplit(uri).hostname if "://" in uri else None
    if host in ("127.0.0.1", "localhost", "::1"):
        return (f"tracking server {uri} is on the loopback interface: compute nodes reach it only "
                "if the job runs on this machine; use an address the nodes can reach")
    return None


def host_header_refusal(uri: str) -> str | None:
    """Why the MLflow server at `uri` refuses the job's API requests for their Host header (None:
    it accepts them, or is not an HTTP server this can reach). MLflow checks the Host header of
    every request but /health, so a GET of its API with the Host a job sends (HOST:PORT of the
    URI) finds what /health cannot."""
    if not uri.startswith(("http://", "https://")):
        return None
    bare, credentials = split_credentials(uri)
    request = urllib.request.Request(bare.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    if credentials is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(credentials).encode()).decode())
    try:
        urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError as exc:
        body = exc.read(200).decode(errors="replace").strip()
        if exc.code == 403 and "Invalid Host header" in body:
            netloc = urlsplit(bare).netloc
            name = urlsplit(bare).hostname
            return (
                f"MLflow server {mask_secrets(uri)} refuses the Host header {netloc!r} that the job "
                f"sends (HTTP 403 {body!r}): MLflow accepts only host names it was told. Start it "
                f"with `orchestrate server --host 0.0.0.0` on {name} (it accepts that machine's "
                f"names), or add `--allowed-hosts {name}` to the server's command"
            )
    except (urllib.error.URLError, OSError):
        pass  # unreachable: Tracker.check_reachable says so
    return None
