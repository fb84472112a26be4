"""Helpers the SLURM batch script (orchestrator/cluster/slurm_script.py renders it) runs on the job's nodes:

    python -m orchestrator.cluster.slurm_node head-ports     -> "IP GCS_PORT CLIENT_PORT"
    python -m orchestrator.cluster.slurm_node head IP GCS_PORT CLIENT_PORT TMP CPUS GPUS
    python -m orchestrator.cluster.slurm_node worker HEAD_IP:GCS_PORT TMP CPUS GPUS
    python -m orchestrator.cluster.slurm_node reap TMP             (ends what is left of the job's Ray)
    python -m orchestrator.cluster.slurm_node resume-flag EXPERIMENT SINCE_MS   -> "--resume" or nothing
    python -m orchestrator.cluster.slurm_node sweep-state EXPERIMENT   -> the latest sweep's nli.sweep_state
    python -m orchestrator.cluster.slurm_node trials-done EXPERIMENT   -> trials finished, or "?"
    python -m orchestrator.cluster.slurm_node job-end FILE STATE EXIT_CODE EXPERIMENT SINCE_MS   (writes FILE)

Each run of the job (a requeued job runs again) notes its start and end in JOBNAME-JOBID.runs
beside FILE (`start SECONDS` / `end SECONDS`, epoch seconds): SLURM counts a requeued job's
elapsed time from its latest start only, the job's total is the sum (`run_times`).

Every port is picked free on the node, so jobs that share a node never meet on Ray's default
ports (6379, 10001, 52365), and every Ray process of the job runs with the job's own temp dir,
which is how `reap` finds exactly them: never `ray stop`, which ends every Ray of the user.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from orchestrator.cluster.ports import free_port, free_ports
from orchestrator.ray_adapter.ray_jobs import node_ip

OBJECT_STORE_SHARE = 0.3  # of the memory Ray gets, as Ray's own default takes of the node's


def allocated_memory_bytes(environ=os.environ) -> int | None:
    """The job's memory on this node, from SLURM (--mem: SLURM_MEM_PER_NODE; --mem-per-cpu:
    SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE; both in MB), or None when the job set no limit."""
    per_node = environ.get("SLURM_MEM_PER_NODE", "")
    if per_node.isdigit() and int(per_node):
        return int(per_node) * 1024 * 1024
    per_cpu, cpus = environ.get("SLURM_MEM_PER_CPU", ""), environ.get("SLURM_CPUS_ON_NODE", "")
    if per_cpu.isdigit() and cpus.isdigit() and int(per_cpu):
        return int(per_cpu) * int(cpus) * 1024 * 1024
    return None


def shared_memory_bytes() -> int | None:
    """What /dev/shm (where Ray keeps its object store) has free; None without one."""
    try:
        found = os.statvfs("/dev/shm")
    except OSError:
        return None
    return found.f_bsize * found.f_bavail


def memory_options(environ=os.environ, shm_bytes: int | None = None) -> list[str]:
    """Ray's memory and object store sized to the job's allocation: Ray would size them from the
    node's whole RAM, which on a shared node is others' memory (the cgroup kills the job). The
    store takes OBJECT_STORE_SHARE of it, at most 95% of /dev/shm (as Ray caps its own default:
    a larger store is refused), and the tasks the rest."""
    memory = allocated_memory_bytes(environ)
    if memory is None:
        return []
    store = int(memory * OBJECT_STORE_SHARE)
    shm = shared_memory_bytes() if shm_bytes is None else shm_bytes
    if shm:
        store = min(store, int(shm * 0.95))
    return [f"--memory={memory - store}", f"--object-store-memory={store}"]


def ray_start_command(temp_dir: str, cpus: str, gpus: str, taken: frozenset[int] = frozenset()) -> list[str]:
    """`taken`: ports already given to this node's other servers (free now, bound later)."""
    return [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
        f"--temp-dir={temp_dir}", f"--num-cpus={cpus}", f"--num-gpus={gpus}",
        f"--dashboard-agent-listen-port={free_port(avoid=taken)}", "--disable-usage-stats",
        *memory_options(),
    ]


def start_worker(address: str, temp_dir: str, cpus: str, gpus: str) -> None:
    """`ray start --block` joining the head at `address`; ends on SIGTERM (srun forwards the
    script's), taking its raylet and workers with it."""
    os.makedirs(temp_dir, exist_ok=True)
    command = [*ray_start_command(temp_dir, cpus, gpus), f"--address={address}"]
    os.execv(command[0], command)


def start_head(ip: str, gcs_port: str, client_port: str, temp_dir: str, cpus: str, gpus: str) -> None:
    """`ray start --head --block` (no dashboard: nobody browses a batch job's, and it is one
    port and process fewer on a shared node); ends on SIGTERM, taking its processes with it."""
    os.makedirs(temp_dir, exist_ok=True)
    command = [
        *ray_start_command(temp_dir, cpus, gpus, taken=frozenset({int(gcs_port), int(client_port)})),
        "--head", f"--node-ip-address={ip}",
        f"--port={gcs_port}", f"--ray-client-server-port={client_port}", "--include-dashboard=false",
    ]
    os.execv(command[0], command)


def job_processes(temp_dir: str) -> list[int]:
    """Pids of this user's processes whose command line names `temp_dir` (raylet, GCS, workers,
    agents). SLURM runs on Linux: /proc tells."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                arguments = handle.read().decode(errors="replace").split("\0")
        except OSError:  # it ended meanwhile
            continue
        if any(temp_dir in argument for argument in arguments):
            found.append(int(entry.name))
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def reap(temp_dir: str, grace_s: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after `grace_s`, every process of the job's Ray on this node.
    Returns how many were still running."""
    temp_dir = os.path.abspath(temp_dir)
    pids = job_processes(temp_dir)
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while job_processes(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    _signal_all(job_processes(temp_dir), signal.SIGKILL)
    return len(pids)


def _latest_sweep(experiment: str):
    """The experiment's latest sweep (parent) run in MLFLOW_TRACKING_URI (the script exports it)."""
    from orchestrator.tracking.tracker import Tracker

    tracker = Tracker(os.environ["MLFLOW_TRACKING_URI"])
    experiment_id = tracker.find_experiment(experiment)
    sweeps = tracker.sweeps(experiment_id) if experiment_id is not None else []
    return sweeps[0] if sweeps else None


def sweep_state(experiment: str) -> str:
    """nli.sweep_state of the latest sweep ("none" without one): tells a sweep that completed
    (with failed trials: exit 1) from one that died of the time-limit signal."""
    from results import run_schema as rs

    latest = _latest_sweep(experiment)
    return "none" if latest is None else latest.data.tags.get(rs.TAG_SWEEP_STATE, "unknown")


def resume_flag(experiment: str, since_ms: int) -> str:
    """What a requeued run passes to `orchestrate sweep`: --resume when the experiment's latest
    sweep (in MLFLOW_TRACKING_URI, which the script exports) started at or after `since_ms` (when
    an earlier run of this job started the driver), else nothing: the signal came before the
    sweep was created, so the run starts it as the first run would have."""
    latest = _latest_sweep(experiment)
    return "--resume" if latest is not None and latest.info.start_time >= since_ms else ""


def trials_done(experiment: str) -> str:
    """Trials finished in the experiment's latest sweep ("?" when the store cannot be asked)."""
    from orchestrator.tracking.tracker import sweep_progress

    progress = sweep_progress(os.environ["MLFLOW_TRACKING_URI"], experiment)
    return "?" if progress is None else str(progress[0])


def runs_file(end_file: str | Path) -> Path:
    """The record of the job's runs beside its end file (JOBNAME-JOBID.end)."""
    return Path(end_file).with_suffix(".runs")


def run_times(path: str | Path) -> tuple[float, float | None] | None:
    """(seconds of the job's runs that ended, start of the run still open or None) from its runs
    file; None without one (a job that has not started, or one of an earlier version)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    ended, start = 0.0, None
    for line in lines:
        word, _, value = line.partition(" ")
        try:
            seconds = float(value)
        except ValueError:
            continue  # a line torn by a kill
        if word == "start":
            start = seconds  # a run killed before it noted its end adds nothing
        elif word == "end" and start is not None:
            ended, start = ended + max(seconds - start, 0.0), None
    return ended, start


def job_end(path: str, state: str, exit_code: str, experiment: str, since_ms: str) -> None:
    """Write the job's end (read by `orchestrate jobs` / `logs`): its state, exit code, the time
    of all its runs (this one until now), and the trials of the experiment's latest sweep that this
    job finished, since it started the sweep at `since_ms` (empty: it never did, none; null: the
    store was away)."""
    from orchestrator.tracking.tracker import sweep_progress

    progress = (0, "") if not since_ms else sweep_progress(
        os.environ["MLFLOW_TRACKING_URI"], experiment, int(since_ms))
    times = run_times(runs_file(path))
    elapsed = None if times is None else times[0] + (time.time() - times[1] if times[1] else 0.0)
    Path(path).write_text(json.dumps({
        "state": state, "exit_code": int(exit_code), "experiment": experiment,
        "trials_done": None if progress is None else progress[0],
        "elapsed_s": None if elapsed is None else round(elapsed),
    }) + "\n")


def main(argv: list[str]) -> int:
    if argv[:1] == ["head-ports"]:
        print(node_ip(), *free_ports(2))
        return 0
    if argv[:1] == ["head"] and len(argv) == 7:
        start_head(*argv[1:])
        return 0  # not reached
    if argv[:1] == ["worker"] and len(argv) == 5:
        start_worker(*argv[1:])
        return 0  # not reached
    if argv[:1] == ["reap"] and len(argv) == 2:
        started = time.monotonic()
        count = reap(argv[1])
        if count:
            print(f"nli: ended {count} leftover Ray processes of {argv[1]} "
                  f"in {time.monotonic() - started:.1f}s", file=sys.stderr)
        return 0
    if argv[:1] == ["sweep-state"] and len(argv) == 2:
        print(sweep_state(argv[1]))
        return 0
    if argv[:1] == ["resume-flag"] and len(argv) == 3:
        print(resume_flag(argv[1], int(argv[2])))
        return 0
    if argv[:1] == ["trials-done"] and len(argv) == 2:
        print(trials_done(argv[1]))
        return 0
    if argv[:1] == ["job-end"] and len(argv) == 6:
        job_end(*argv[1:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
