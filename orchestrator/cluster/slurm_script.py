"""The SLURM batch script of `orchestrate submit SPEC --slurm` (its signals: orchestrator/cluster/slurm.py)
and the command that resumes a job's sweep."""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from nli_models.errors import mask_secrets
from nli_models.files import expand_user
from orchestrator.cli.options import DEFAULT_SIGNAL_BEFORE_S
from orchestrator.cluster.slurm import (
    DEFAULT_MAX_REQUEUES,
    SlurmInputError,
    SlurmOptions,
    check_options,
    check_path,
    loopback_warning,
    sbatch_line,
    short_allocation_warning,
    slurm_tracking_uri,
    trials_at_once,
)
from orchestrator.ray_adapter.ray_jobs import (
    load_submitted_spec,
    override_arguments,
    parse_env,
)
from orchestrator.sweep.environment import DEFAULTS
from orchestrator.sweep.progress import RESUME_HINT_ENV


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
node() { "$PYTHON" -m orchestrator.cluster.slurm_node "$@"; }
say() { echo "nli[$(date +%H:%M:%S)]: $*"; }

RAY_TMP="${NLI_RAY_TMPDIR:-/tmp}/nli-ray-${SLURM_JOB_ID}"
RAY_LOG="$LOG_DIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.ray.log"
RUNS_FILE="$LOG_DIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.runs"
NUM_GPUS="${GPUS_PER_NODE}"
reason="" driver="" head="" workers="" rc="" ray_stopped="" run_ended=""

note_run_end() {  # this run's end in the job's record of its runs (slurm_node.run_times), once
  [ -n "$run_ended" ] && return
  run_ended=1
  echo "end $(date +%s)" >>"$RUNS_FILE"
}

on_signal() {  # $1: why, $2: the signal
  [ -n "$reason" ] && return
  reason=$1
  say "got SIG$2 ($1)"
  # SIGTERM (scancel, preemption): SLURM kills what is left KillWait seconds later.
  [ "$2" = TERM ] && note_run_end
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
trap 'stop_ray; note_run_end' EXIT

restarts="${SLURM_RESTART_COUNT:-0}"
# When a run of this job first started the sweep (ms): a requeued run resumes the sweep that run
# created, or, stopped before it created one, starts it as the first run would have.
STARTED="$LOG_DIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.started"
END_FILE="$LOG_DIR/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.end"
rm -f "$END_FILE"  # a requeued run ends anew
echo "start $(date +%s)" >>"$RUNS_FILE"
if [ "$restarts" -gt 0 ] && [ -e "$STARTED" ] && [ "${SWEEP_FLAGS[*]}" != --resume ]; then
  flag=$(node resume-flag "$EXPERIMENT" "$(cat "$STARTED")") || flag=--resume
  [ -n "$flag" ] && SWEEP_FLAGS=("$flag")
fi
say "job $SLURM_JOB_ID (run $((restarts + 1))) on $SLURM_JOB_NODELIST: sweep $SPEC ${SWEEP_FLAGS[*]} ${SWEEP_OPTIONS[*]}"

read -r HEAD_IP GCS_PORT CLIENT_PORT < <(node head-ports)
rm -rf "$RAY_TMP"
# Its own session: the head's processes share one process group, ended as one in stop_ray.
setsid "$PYTHON" -m orchestrator.cluster.slurm_node head "$HEAD_IP" "$GCS_PORT" "$CLIENT_PORT" \
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
    --exclude="$SLURMD_NODENAME" "$PYTHON" -m orchestrator.cluster.slurm_node worker \
    "$HEAD_IP:$GCS_PORT" "$RAY_TMP" "$SLURM_CPUS_PER_TASK" "$NUM_GPUS" >>"$RAY_LOG" 2>&1 &
  workers=$!
fi
[ -z "$rc" ] && [ -z "$reason" ] && say "Ray at $HEAD_IP:$GCS_PORT (temp dir $RAY_TMP, log $RAY_LOG)"
# Trials finished before this run: a requeue needs this run to add one.
done_at_start="?"
[ "$REQUEUE" = 1 ] && { done_at_start=$(node trials-done "$EXPERIMENT") || done_at_start="?"; }

if [ -z "$rc" ] && [ -z "$reason" ]; then
  [ -e "$STARTED" ] || date +%s000 >"$STARTED"
  "$PYTHON" -m orchestrator.cli.orchestrate sweep "$SPEC" --address "$HEAD_IP:$GCS_PORT" "${SWEEP_FLAGS[@]}" \
    "${SWEEP_OPTIONS[@]}" &
  driver=$!
  while kill -0 "$driver" 2>/dev/null; do wait "$driver"; done  # a trapped signal ends a wait
  wait "$driver"
  rc=$?
  driver=""
  # Killed by the TERM this script passed on (the signal came before the driver could handle
  # it, e.g. during its start): stopped before it ran a trial, resumable, as a clean stop is.
  [ -n "$reason" ] && [ "$rc" = 143 ] && rc=3
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
  note_run_end  # before the requeue, which may end this script at once
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
        "# Written by `orchestrate submit --slurm`; see orchestrator/cluster/slurm.py for its signals.",
    ]
    exports = {k: os.environ.get(k, DEFAULTS[k]) for k in DEFAULTS}
    # A cluster of nodes: each registers the address the others reach it on, not 127.0.0.1.
    exports["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    # The sweep prints no resume command of its own: the job's is `submit ... --slurm --resume`,
    # which the script prints when the job ends other than completed (a requeue needs none).
    exports.update({"MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1",
                    RESUME_HINT_ENV: "0", **env})
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
    from orchestrator.sweep.estimate import recorded_estimate

    warnings = [w for w in (loopback_warning(uri),
                            short_allocation_warning(options, recorded_estimate(spec))) if w]
    if not spec.search.storage_path:
        warnings.append(
            f"search.storage_path is not set: Tune's results and checkpoints go to ray_results in "
            f"{Path(cwd or os.getcwd()).resolve()}; every node of the job must see that folder "
            "(a shared file system), and --resume / --requeue need it"
        )
    log_dir = expand_user(options.log_dir, "--log-dir").resolve()
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


