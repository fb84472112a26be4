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
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from nli_models.errors import InputError, mask_secrets, without_passwords
from orchestrator.cli_options import DEFAULT_SIGNAL_BEFORE_S
from orchestrator.environment import DEFAULTS, cache_dir
from orchestrator.ray_jobs import (
    ClusterError,
    JobInputError,
    load_submitted_spec,
    override_arguments,
    parse_env,
)
from results.tracking_uri import PROBE_TIMEOUT_S, split_credentials

DEFAULT_MAX_REQUEUES = 3  # as submitit's slurm_max_num_timeout
# What an allocation spends before its first trial trains: Ray's start and the sweep's (51-69 s,
# then 40 s to a first trial, on a loaded node; issue 29), with a margin.
STARTUP_ALLOWANCE_S = 120
MIN_TRAINING_S = 300  # less than this left to train per allocation gets a warning
COMMAND_TIMEOUT_S = 60
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


class SlurmInputError(JobInputError, InputError):
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
    """`orchestrate validate --slurm-nodes ...`: one line on what the allocation runs at once."""
    total, why = trials_at_once(spec, allocation)
    waves = math.ceil(spec.num_trials() / total)
    return (f"  SLURM {allocation.describe()}: {total} trials at once ({why}); "
            f"{spec.num_trials()} trials in {waves} wave{'s' * (waves > 1)}")


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
    if options.job_name is not None and not re.fullmatch(r"[A-Za-z0-9_.+-]+", options.job_name):
        raise SlurmInputError(f"--job-name {options.job_name!r}: letters, digits and _.+- only")


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


# -- the batch script -------------------------------------------------------------------------
@dataclass
class BatchJob:
    script: str
    spec_path: str
    spec_name: str
    job_name: str
    tracking_uri: str
    planned_trials: int
    log_dir: str
    at_once: str  # what the allocation runs side by side, for the user
    warnings: list[str] = field(default_factory=list)


def _directives(options: SlurmOptions, job_name: str, log_dir: Path, cwd: Path) -> list[str]:
    allocation = options.allocation
    lines = [
        f"--job-name={job_name}",
        f"--nodes={allocation.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={allocation.cpus_per_task}",
    ]
    if allocation.gpus_per_node:
        lines.append(f"--gpus-per-node={allocation.gpus_per_node}")
    for flag, value in (("partition", options.partition), ("time", options.time_limit),
                        ("account", options.account), ("qos", options.qos)):
        if value:
            lines.append(f"--{flag}={value}")
    lines += [
        f"--output={log_dir}/%x-%j.out",
        "--open-mode=append",  # a requeued run adds to the same file
        f"--chdir={cwd}",
        f"--signal=B:USR1@{options.signal_before_s}",
        "--requeue" if options.requeue else "--no-requeue",
    ]
    lines += [sbatch_line(line) for line in options.extra]
    return lines


SCRIPT_BODY = r"""
set -u
unset RAY_ADDRESS RAY_API_SERVER_ADDRESS
node() { "$PYTHON" -m orchestrator.slurm_node "$@"; }
say() { echo "nli[$(date +%H:%M:%S)]: $*"; }

RAY_TMP="${NLI_RAY_TMPDIR:-/tmp}/nli-ray-${SLURM_JOB_ID}"
RAY_LOG="$LOG_DIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.ray.log"
NUM_GPUS="${GPUS_PER_NODE}"
reason="" driver="" head="" workers="" rc="" ray_stopped=""

on_signal() {  # $1: why, $2: the signal
  [ -n "$reason" ] && return
  reason=$1
  say "got SIG$2 ($1)"
  # USR1 and USR2 reach this shell alone; SIGTERM reached every process of the job already.
  if [ "$2" != TERM ] && [ -n "$driver" ] && kill -0 "$driver" 2>/dev/null; then
    say "interrupting the sweep (pid $driver)"
    kill -TERM "$driver"
  fi
}
trap 'on_signal time_limit USR1' USR1
trap 'on_signal stop USR2' USR2
trap 'on_signal cancelled TERM' TERM

stop_ray() {  # exactly the Ray this job started: its pids, the head's process group, its temp dir
  local pid alive
  [ -n "$ray_stopped" ] && return
  ray_stopped=1
  for pid in $workers $head; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 30); do
    alive=""
    for pid in $workers $head; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 1
  done
  [ -n "$head" ] && kill -KILL -- "-$head" 2>/dev/null
  [ -n "$workers" ] && kill -KILL "$workers" 2>/dev/null
  node reap "$RAY_TMP"
  rm -rf "$RAY_TMP"
}
trap stop_ray EXIT

restarts="${SLURM_RESTART_COUNT:-0}"
# When a run of this job first started the sweep (ms): a requeued run resumes the sweep that run
# created, or, stopped before it created one, starts it as the first run would have.
STARTED="$LOG_DIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.started"
END_FILE="$LOG_DIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.end"
rm -f "$END_FILE"  # a requeued run ends anew
if [ "$restarts" -gt 0 ] && [ -e "$STARTED" ] && [ "${SWEEP_FLAGS[*]}" != --resume ]; then
  flag=$(node resume-flag "$EXPERIMENT" "$(cat "$STARTED")") || flag=--resume
  [ -n "$flag" ] && SWEEP_FLAGS=("$flag")
fi
say "job $SLURM_JOB_ID (run $((restarts + 1))) on $SLURM_JOB_NODELIST: sweep $SPEC ${SWEEP_FLAGS[*]} ${SWEEP_OPTIONS[*]}"

read -r HEAD_IP GCS_PORT CLIENT_PORT < <(node head-ports)
rm -rf "$RAY_TMP"
# Its own session: the head's processes share one process group, ended as one in stop_ray.
setsid "$PYTHON" -m orchestrator.slurm_node head "$HEAD_IP" "$GCS_PORT" "$CLIENT_PORT" \
  "$RAY_TMP" "$SLURM_CPUS_PER_TASK" "$NUM_GPUS" >>"$RAY_LOG" 2>&1 &
head=$!
for _ in $(seq 240); do
  [ -e "$RAY_TMP/ray_current_cluster" ] || [ -n "$reason" ] || ! kill -0 "$head" 2>/dev/null && break
  sleep 0.5
done
if [ -n "$reason" ]; then
  :  # a signal while Ray started: the sweep is stopped before it started (rc 3, below)
elif [ ! -e "$RAY_TMP/ray_current_cluster" ]; then
  say "the Ray head did not start (see $RAY_LOG)"
  rc=1
elif [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
  srun --overlap --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks-per-node=1 \
    --exclude="$SLURMD_NODENAME" "$PYTHON" -m orchestrator.slurm_node worker \
    "$HEAD_IP:$GCS_PORT" "$RAY_TMP" "$SLURM_CPUS_PER_TASK" "$NUM_GPUS" >>"$RAY_LOG" 2>&1 &
  workers=$!
fi
[ -z "$rc" ] && [ -z "$reason" ] && say "Ray at $HEAD_IP:$GCS_PORT (temp dir $RAY_TMP, log $RAY_LOG)"
# Trials finished before this run: a requeue needs this run to add one.
done_at_start="?"
[ "$REQUEUE" = 1 ] && { done_at_start=$(node trials-done "$EXPERIMENT") || done_at_start="?"; }

if [ -z "$rc" ] && [ -z "$reason" ]; then
  [ -e "$STARTED" ] || date +%s000 >"$STARTED"
  "$PYTHON" -m orchestrator.cli sweep "$SPEC" --address "$HEAD_IP:$GCS_PORT" "${SWEEP_FLAGS[@]}" \
    "${SWEEP_OPTIONS[@]}" &
  driver=$!
  while kill -0 "$driver" 2>/dev/null; do wait "$driver"; done  # a trapped signal ends a wait
  wait "$driver"
  rc=$?
  driver=""
elif [ -z "$rc" ]; then
  rc=3  # stopped before the sweep started
fi
say "sweep exited with code $rc${reason:+ ($reason)}"
stop_ray

# After the time-limit signal: 0 (completed) and 2 (bad input) end the job; 3 (interrupted) and
# any other code requeue it unless the store says the sweep completed (exit 1 with failed
# trials). A driver that does not stop cleanly on SIGTERM dies of it with 1, 15, 134 or 143.
requeue_now="" not_requeued="" advice=""
if [ "$REQUEUE" = 1 ] && [ "$reason" = time_limit ] && [ "$rc" != 0 ] && [ "$rc" != 2 ]; then
  state=$(node sweep-state "$EXPERIMENT") || state=unknown
  case "$state" in completed|finished) ;; *) requeue_now=1 ;; esac
fi
# No endless chain: at most MAX_REQUEUES requeues, and none after an allocation that finished no
# trial (its time went to starting up: the next would do the same).
if [ -n "$requeue_now" ] && [ "$restarts" -ge "$MAX_REQUEUES" ]; then
  requeue_now="" not_requeued="requeued $restarts times, --max-requeues $MAX_REQUEUES"
elif [ -n "$requeue_now" ]; then
  done_now=$(node trials-done "$EXPERIMENT") || done_now="?"
  if [ "$done_now" != "?" ] && [ "$done_now" = "$done_at_start" ]; then
    requeue_now="" not_requeued="no trial finished in this allocation"
    advice="raise --time or lower --signal-before"
  fi
fi
[ -n "$not_requeued" ] && say "not requeueing: $not_requeued${advice:+ ($advice)}"
if [ -n "$requeue_now" ]; then
  say "requeueing job $SLURM_JOB_ID: the next run resumes the sweep"
  scontrol requeue "$SLURM_JOB_ID"
  exit "$rc"
fi
if [ "$reason" = cancelled ]; then
  # SIGTERM: scancel, or a preemption after which SLURM may requeue the job (PreemptMode=REQUEUE),
  # whose next run needs the marker. `orchestrate jobs` removes it once the job has ended.
  exit "$rc"
fi
started_ms=$(cat "$STARTED" 2>/dev/null) || started_ms=""  # the trials after it are this job's
rm -f "$STARTED"
# The job's end, for `orchestrate jobs` and `logs` (SLURM forgets finished jobs). A user's stop
# that the sweep obeyed (exit 3, interrupted and resumable) is no failure: the job exits 0, so
# SLURM, sacct and --mail-type=FAIL do not report a crash, and its end file says STOPPED.
end_state=FAILED
[ "$rc" = 0 ] && end_state=COMPLETED
[ "$rc" = 3 ] && end_state=INTERRUPTED
[ -n "$not_requeued" ] && end_state="INTERRUPTED ($not_requeued)"
if [ "$reason" = stop ] && [ "$rc" = 3 ]; then
  end_state=STOPPED rc=0
  say "stopped by orchestrate stop"
fi
[ "$end_state" != COMPLETED ] && say "resume with: $RESUME_COMMAND"
node job-end "$END_FILE" "$end_state" "$rc" "$EXPERIMENT" "$started_ms" || true
exit "$rc"
"""


def render_script(*, options: SlurmOptions, spec_path: Path, spec_name: str, job_name: str,
                  tracking_uri: str, sweep_flags: list[str], sweep_options: list[str],
                  env: dict[str, str], log_dir: Path,
                  cwd: Path, python: str, resume_command: str = "") -> str:
    header = ["#!/bin/bash"] + [f"#SBATCH {line}" for line in _directives(options, job_name, log_dir, cwd)]
    header += [
        f"# Sweep {spec_name!r} ({str(spec_path)!r}) on a Ray cluster private to this job.",
        "# Written by `orchestrate submit --slurm`; see orchestrator/slurm.py for its signals.",
    ]
    exports = {k: os.environ.get(k, DEFAULTS[k]) for k in DEFAULTS}
    # A cluster of nodes: each registers the address the others reach it on, not 127.0.0.1.
    exports["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    exports.update({"MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1", **env})
    settings = [f"export {name}={shlex.quote(value)}" for name, value in exports.items()]
    settings += [
        f"PYTHON={shlex.quote(python)}",
        f"SPEC={shlex.quote(str(spec_path))}",
        f"EXPERIMENT={shlex.quote(spec_name)}",
        f"LOG_DIR={shlex.quote(str(log_dir))}",
        f"GPUS_PER_NODE={options.allocation.gpus_per_node}",
        f"REQUEUE={int(options.requeue)}",
        f"MAX_REQUEUES={options.max_requeues}",
        f"SWEEP_FLAGS=({shlex.join(sweep_flags)})",  # a requeued run may turn them into --resume
        f"SWEEP_OPTIONS=({shlex.join(sweep_options)})",
        f"RESUME_COMMAND={shlex.quote(resume_command)}",
    ]
    # Before `set -u` and Ray: site scripts (`module load`, `source venv/bin/activate`) often
    # read unset variables.
    setup = ["# --setup lines", *options.setup] if options.setup else []
    return "\n".join(header) + "\n\n" + "\n".join(settings + setup) + "\n" + SCRIPT_BODY


def resume_command(spec_path: str | Path, options: SlurmOptions, *, tracking_uri: str | None,
                   env=(), overrides=None) -> str:
    """The `orchestrate submit ... --slurm --resume` line that continues this job's sweep with
    the same options (the hint a stopped or failed job prints), its secrets masked."""
    allocation = options.allocation
    words = ["orchestrate", "submit", str(spec_path), "--slurm", "--resume",
             "--nodes", str(allocation.nodes), "--cpus-per-task", str(allocation.cpus_per_task)]
    if allocation.gpus_per_node:
        words += ["--gpus-per-node", str(allocation.gpus_per_node)]
    for flag, value in (("--partition", options.partition), ("--time", options.time_limit),
                        ("--account", options.account), ("--qos", options.qos),
                        ("--job-name", options.job_name), ("--tracking-uri", tracking_uri)):
        if value:
            words += [flag, value]
    words += [f"--sbatch={line}" for line in options.extra]
    words += [part for line in options.setup for part in ("--setup", line)]
    if options.requeue:
        words.append("--requeue")
        if options.max_requeues != DEFAULT_MAX_REQUEUES:
            words += ["--max-requeues", str(options.max_requeues)]
    if options.signal_before_s != DEFAULT_SIGNAL_BEFORE_S:
        words += ["--signal-before", str(options.signal_before_s)]
    words += ["--log-dir", options.log_dir]
    words += [part for pair in env for part in ("--env", pair)]
    words += override_arguments(overrides)
    return mask_secrets(shlex.join(words))


def _job_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", name).strip("-")[:40] or "sweep"


def build_batch_job(spec_path: str | Path, options: SlurmOptions, *, tracking_uri: str | None = None,
                    resume: bool = False, new: bool = False, env=(), overrides=None,
                    cwd: str | Path | None = None, python: str | None = None) -> BatchJob:
    """Validate everything here (the spec with its --set/--data-dir overrides), before sbatch
    sees anything, and render the batch script; the overrides travel in its sweep command."""
    path, spec = load_submitted_spec(
        spec_path, resume, new, overrides, tracking_uri, error=SlurmInputError
    )
    check_options(options)
    check_path("the working directory (--chdir)", Path(cwd or os.getcwd()).resolve())
    uri = slurm_tracking_uri(spec.tracking_uri)
    at_once, why = trials_at_once(spec, options.allocation, "the requested allocation")
    from orchestrator.estimate import recorded_estimate

    warnings = [w for w in (loopback_warning(uri),
                            short_allocation_warning(options, recorded_estimate(spec))) if w]
    if not spec.search.storage_path:
        warnings.append(
            f"search.storage_path is not set: Tune's results and checkpoints go to ray_results in "
            f"{Path(cwd or os.getcwd()).resolve()}; every node of the job must see that folder "
            "(a shared file system), and --resume / --requeue need it"
        )
    log_dir = Path(options.log_dir).expanduser().resolve()
    job_name = options.job_name or f"nli-{_job_slug(spec.name)}"
    flags = ["--resume"] if resume else ["--new"] if new else []
    script = render_script(
        options=options, spec_path=path.resolve(), spec_name=spec.name, job_name=job_name,
        tracking_uri=uri, sweep_flags=flags, sweep_options=override_arguments(overrides),
        env=parse_env(env), log_dir=log_dir,
        cwd=Path(cwd or os.getcwd()).resolve(), python=python or sys.executable,
        resume_command=resume_command(path.resolve(), options, tracking_uri=tracking_uri, env=env,
                                      overrides=overrides),
    )
    return BatchJob(
        script=script, spec_path=str(path.resolve()), spec_name=spec.name, job_name=job_name,
        tracking_uri=uri, planned_trials=spec.num_trials(), log_dir=str(log_dir),
        at_once=f"{at_once} trials at once ({why})", warnings=warnings,
    )


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


def job_end(entry: Submitted, state: JobState) -> tuple[str, int | None]:
    """A finished job's state (STOPPED for a user's stop, from the job's end file; else SLURM's)
    and the trials it finished (None: unknown)."""
    try:
        written = json.loads(entry.end_file.read_text())
        return written["state"], written.get("trials_done")
    except (OSError, ValueError, KeyError, TypeError):
        return state.state, None


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
