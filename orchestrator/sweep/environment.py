"""Process-wide defaults for Ray and MLflow, set before either is imported, and the OpenMP wait
policy of each process that trains.

configure_environment() runs once, when the `orchestrate` command starts (orchestrator/cli/orchestrate.py,
for every sub-command, the results commands included), and in the entry points of the benchmarks
and the test suite; importing `orchestrator` or `results` as a library changes no environment
variable (tests/test_import_hygiene.py).

RAY_AUTH_MODE is set explicitly because a first ray.init writes a token that a later `ray start`
would otherwise enable; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on 127.0.0.1 locally.
A user's own environment always wins (setdefault).

OMP_WAIT_POLICY: OpenMP threads that spin while waiting made 2 torch threads 3-500x slower than
one on a busy 2-core machine (benchmarks/README.md, "omp_policy"), while on cores of their own they
ran about twice as fast as passive ones (section 7). So a process whose threads have their cores
to themselves (`orchestrate train` with no more threads than the CPUs of its affinity; the trials
of a sweep that can never put more threads on a node than it has CPUs) spins (ACTIVE); every
other process, the sweep's driver included, waits passively (PASSIVE). OpenMP reads the variable
once, when torch loads, hence here and in the trials' runtime environment (ray_runtime.init_ray).
"""

from __future__ import annotations

import os
from pathlib import Path

WAIT_POLICY = "OMP_WAIT_POLICY"
DEFAULTS = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # Tune snapshots its state at every checkpoint when num_to_keep is set (what makes --resume
    # exact); with epoch-long trials that is by design, not a bottleneck worth a warning.
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    "RAY_AIR_NEW_OUTPUT": "0",
    WAIT_POLICY: "PASSIVE",
    # Against a tracking server, MlflowClient.set_terminated prints two "View run/experiment" lines
    # to stdout for every trial run it ends and fetches the run once more to do so: terminal noise
    # in a sweep (which prints its own links) and one extra request per trial.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # MLflow's INFO lines (creating and migrating a store's tables) are not the user's concern;
    # `sweep -v` and `ui -v` set INFO.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    # MLflow draws a progress bar on stderr for every artifact download (checkpoints, predictions,
    # a sweep's provenance files for `report`); the files are small, the bars only clutter.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}
_users: dict[str, str | None] = {}  # the user's OMP_WAIT_POLICY, read before the defaults


def configure_environment() -> None:
    _users.setdefault(WAIT_POLICY, os.environ.get(WAIT_POLICY))
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def users_wait_policy() -> str | None:
    """OMP_WAIT_POLICY as the user set it (None: not set), whatever the defaults set since."""
    return _users.get(WAIT_POLICY, os.environ.get(WAIT_POLICY))


def wait_policy(owns_cores: bool) -> str:
    """The user's OMP_WAIT_POLICY, else ACTIVE for threads with cores of their own, else PASSIVE."""
    return users_wait_policy() or ("ACTIVE" if owns_cores else "PASSIVE")


def trial_threads(cpu: float) -> int:
    """torch threads of a sweep trial ((ray_trial.run_trial)): one per CPU it reserves
    (resources.cpu), at least one."""
    return max(1, int(cpu))


def trials_own_cores(cpu: float, max_concurrent: int | None, node_cpus: int | None) -> bool:
    """Whether a sweep's trials can never put more torch threads on a node than it has CPUs.

    A trial runs trial_threads(cpu) and Ray never places more
    trials on a node than its CPUs hold (`cpu` each): with cpu >= 1 the threads fit every node
    whose Ray CPUs are its cores (Ray's default). With cpu < 1 a trial runs more threads than it
    reserves; they fit only when the trials that can run at once (max_concurrent, and what a
    node's `node_cpus` hold) have a core each."""
    threads = trial_threads(cpu)
    if threads <= cpu:
        return True
    if node_cpus is None:
        return False
    at_once = int(node_cpus // cpu)
    if max_concurrent is not None:
        at_once = min(at_once, max_concurrent)
    return threads * at_once <= node_cpus


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/nli-orchestrator (default ~/.cache/...): this account's records of SLURM
    submissions and estimates."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "nli-orchestrator"
