"""Process-wide defaults for Ray and MLflow, set before either is imported.

RAY_AUTH_MODE is set explicitly because a first ray.init writes a token that a later `ray start`
would otherwise enable; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on 127.0.0.1 locally.
OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin while waiting made 2 torch threads 3-500x slower
than one on a busy 2-core machine (benchmarks/README.md, finding 1); passive waiting keeps
multi-threaded training and the driver's evaluations near single-thread speed there. OpenMP reads
it once, when torch loads, hence here. A user's own environment always wins (setdefault).
"""

import os

DEFAULTS = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # Tune snapshots its state at every checkpoint when num_to_keep is set (what makes --resume
    # exact); with epoch-long trials that is by design, not a bottleneck worth a warning.
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    "RAY_AIR_NEW_OUTPUT": "0",
    "OMP_WAIT_POLICY": "PASSIVE",
    # Against a tracking server, MlflowClient.set_terminated prints two "View run/experiment" lines
    # to stdout for every trial run it ends and fetches the run once more to do so: terminal noise
    # in a sweep (which prints its own links) and one extra request per trial.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # MLflow's INFO lines (creating and migrating a store's tables) are not the user's concern;
    # `sweep -v` and `ui -v` set INFO.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def configure_environment() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
