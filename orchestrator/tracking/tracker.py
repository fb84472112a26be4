"""The tracking store as a sweep reads it: opening it (``Tracker``), its reachability, and the
uploader's waits. Every write of a sweep goes through its journal (orchestrator/journal/operations.py,
appended by orchestrator/journal/recorder.py) to the one uploader (orchestrator/tracking/uploader.py).

While the server is unreachable the uploader falls behind and retries; the journal holds what is
pending. At the end of a sweep the driver waits for the uploader at most NLI_TRACKING_MAX_WAIT_S
seconds (default 120; plus one attempt of the MLflow client's own retries,
MLFLOW_HTTP_REQUEST_MAX_RETRIES), then ends with the sweep's own outcome and says how to upload
the journal later: `orchestrate sync` (the same uploader run over the file) or `--resume`.

The uploader runs at most one pass every NLI_TRACKING_UPLOAD_INTERVAL_S seconds (default 2), so
a pass sends what each trial recorded since the last one together: live metrics in the MLflow
UI lag the trials by at most that interval (plus the pass itself; more while the server is away
or behind). The end of a sweep (``drain``) and `orchestrate sync` do not wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import urllib.parse
from pathlib import Path

from results import run_schema as rs
from results.mlflow_client import mlflow_client
from results.stored_sweeps import sweep_runs, trial_runs
from results.sweeps import observed_state
from results.tracking_uri import (
    PROBE_TIMEOUT_S,
    check_tracking_uri,
    probe_database,
    probe_http,
    unreachable_message,
    unreachable_store,
)

MAX_WAIT_ENV = "NLI_TRACKING_MAX_WAIT_S"
DEFAULT_MAX_WAIT_S = 120.0
# One uploader pass per interval at most. Every request costs the client and the tracking server
# CPU whatever it carries, and a trial's records arrive one by one (a request each when sent as
# they come); 2 s gathers a trial's start with its first epoch, its last epoch with its end, and
# several short epochs into one log_batch, and is no lag to watch in the UI against epochs that
# take minutes (benchmarks/README.md, "Coalescing the uploader's passes": requests per trial).
UPLOAD_INTERVAL_ENV = "NLI_TRACKING_UPLOAD_INTERVAL_S"
DEFAULT_UPLOAD_INTERVAL_S = 2.0


class TrackingUnavailable(RuntimeError):
    pass


@contextlib.contextmanager
def _store_creation_lock(uri: str):
    """Held while MLflow opens (creates, migrates) a database store: sweeps starting together on a
    new database would all run the schema migration and leave it broken for good. SQLite: a lock
    file beside the database; PostgreSQL: a session-level advisory lock in the database itself
    (sweeps on several machines). A store behind `orchestrate server` is created by the server."""
    scheme = urllib.parse.urlsplit(uri).scheme.split("+")[0]
    if scheme == "sqlite" and uri.startswith("sqlite:///"):
        database = Path(uri.removeprefix("sqlite:///").split("?")[0])
        database.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{database}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    elif scheme == "postgresql":
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": int(PROBE_TIMEOUT_S)})
        try:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
                try:
                    yield
                finally:
                    connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
        finally:
            engine.dispose()
    else:
        yield


_PG_LOCK_KEY = 0x6E6C6931  # "nli1": one advisory lock id for creating an MLflow store


def _seconds_from_env(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if seconds < 0:
        raise ValueError(f"{name}={value!r} must be >= 0")
    return seconds


def default_max_wait_s() -> float:
    """How long a sweep waits at its end for an unreachable store: $NLI_TRACKING_MAX_WAIT_S or 120 s."""
    return _seconds_from_env(MAX_WAIT_ENV, DEFAULT_MAX_WAIT_S)


def default_upload_interval_s() -> float:
    """The least time between two passes of a sweep's uploader: $NLI_TRACKING_UPLOAD_INTERVAL_S or 2 s."""
    return _seconds_from_env(UPLOAD_INTERVAL_ENV, DEFAULT_UPLOAD_INTERVAL_S)


def sweep_progress(tracking_uri: str, experiment_name: str, since_ms: int = 0) -> tuple[int, str] | None:
    """(trial runs FINISHED at or after `since_ms`, sweep state) of the experiment's latest sweep,
    for `orchestrate jobs`; (0, "") before it has one; None when the store cannot be asked."""
    if unreachable_store(tracking_uri) is not None:
        return None  # the client would retry a dead server for minutes
    try:
        tracker = Tracker(tracking_uri)
        experiment_id = tracker.find_experiment(experiment_name)
        sweeps = tracker.sweeps(experiment_id) if experiment_id is not None else []
        if not sweeps:
            return 0, ""
        parent = sweeps[0]
        runs = tracker.trial_runs(experiment_id, parent.info.run_id)
        done = sum(r.info.status == "FINISHED" and (r.info.end_time or 0) >= since_ms for r in runs)
        return done, observed_state(parent.data.tags)
    except Exception:  # any store or transport error: the table shows "?"
        return None


class Tracker:
    """The store a sweep reads, keyed by the names in run_schema. It writes nothing: every write
    of a sweep goes through its journal to the uploader (orchestrator/tracking/uploader.py), which alone
    uses ``client`` to write."""

    def __init__(self, tracking_uri: str):
        """Opens the store: a database store is opened (created and migrated when new, under a
        lock) here, so a bad URI is InputError and an unreachable database TrackingUnavailable,
        both within seconds."""
        check_tracking_uri(tracking_uri)
        self.tracking_uri = tracking_uri
        self._raise_unavailable(probe_database(tracking_uri))
        try:
            with _store_creation_lock(tracking_uri):
                self.client = mlflow_client(tracking_uri)
        except Exception as exc:  # MLflow and SQLAlchemy raise many types for a bad store
            self._raise_unavailable(str(exc))

    def check_reachable(self) -> None:
        error = None
        if self.tracking_uri.startswith(("http://", "https://")):
            error = probe_http(self.tracking_uri)
        if error is None:
            try:
                self.client.search_experiments(max_results=1)
            except Exception as exc:  # any transport or store error means we cannot log
                error = str(exc)
        self._raise_unavailable(error)

    def _raise_unavailable(self, error: str | None) -> None:
        if error is not None:
            raise TrackingUnavailable(unreachable_message(self.tracking_uri, error))

    def find_experiment(self, name: str) -> str | None:
        """The experiment's id, or None; never creates one."""
        experiment = self.client.get_experiment_by_name(name)
        return experiment.experiment_id if experiment is not None else None

    def sweeps(self, experiment_id: str) -> list:
        return sweep_runs(self.client, experiment_id)

    def trial_runs(self, experiment_id: str, parent_run_id: str) -> list:
        return trial_runs(self.client, experiment_id, parent_run_id)

    def analysis_inputs(self, experiment_id: str):
        """(experiment, its trials, the dev-accuracy curves of the top ones), what the analysis
        of a sweep (results.analysis) is built from."""
        from results.analysis import top_trials
        from results.run_reader import load_trials, metric_histories

        experiment = self.client.get_experiment(experiment_id)
        trials = load_trials(self.client, [experiment])
        top = top_trials(trials, experiment.name)
        return experiment, trials, metric_histories(
            self.client, [t.record.run_id for t in top], rs.METRIC_DEV_ACCURACY
        )


def sweep_views(tracking_uri: str) -> dict[str, str]:
    """experiment name -> id for every experiment holding the trials view a sweep writes; an
    SQLite file that does not exist yet is not created."""
    if tracking_uri.startswith("sqlite:///"):
        if not Path(tracking_uri.removeprefix("sqlite:///").split("?")[0]).exists():
            return {}
    key = rs.EXPERIMENT_TAG_SHARED_VIEW_PREFIX + rs.RUNS_VIEW_KEY
    experiments = mlflow_client(tracking_uri).search_experiments(filter_string=f"tags.`{key}` != ''")
    return {e.name: e.experiment_id for e in sorted(experiments, key=lambda e: e.name)}
