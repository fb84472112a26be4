"""The only module that talks to MLflow: a sweep's parent run, one child run per trial.

Not Ray's MLflowLoggerCallback (one request per metric, no parent run). One tracking path: the
driver appends every trial event to the sweep's journal (orchestrator/journal.py) and one
uploader thread ships it, the records a trial has pending in one log_batch, so neither the Tune
loop nor training waits for the tracking server. While the server is unreachable the uploader
falls behind and retries; the journal holds what is pending. At the end of a sweep the driver
waits for the uploader; if the server has been away for NLI_TRACKING_MAX_WAIT_S seconds (default
120; plus one attempt of the MLflow client's own retries, MLFLOW_HTTP_REQUEST_MAX_RETRIES), it
stops and says how to upload the journal later: `orchestrate sync`, the same uploader run over
the file. Nothing is dropped.

The uploader runs at most one pass every NLI_TRACKING_UPLOAD_INTERVAL_S seconds (default 2), so
a pass sends what each trial recorded since the last one together: live metrics in the MLflow
UI lag the trials by at most that interval (plus the pass itself; more while the server is away
or behind). The end of a sweep (``drain``) and `orchestrate sync` do not wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import itertools
import json
import os
import shlex
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT
from mlflow.utils.validation import (
    MAX_ENTITIES_PER_BATCH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from nli_models.config import RunConfig
from nli_models.data import PreparedData
from nli_models.errors import mask_secrets
from nli_models.training import protocol_fingerprint
from orchestrator.journal import Journal, Record, read_records, trial_groups
from orchestrator.spec import SweepSpec, apply_hyperparameters, config_key
from results import run_schema as rs
from results.files import write_output
from results.render import format_hyperparameters
from results.sweeps import observed_state, sweep_runs, trial_runs
from results.tracking_uri import (
    PROBE_TIMEOUT_S,
    check_tracking_uri,
    client_uri,
    probe_database,
    probe_http,
    split_credentials,
    unreachable_message,
    unreachable_store,
)

EPOCH_METRICS = (
    rs.METRIC_TRAIN_LOSS,
    rs.METRIC_TRAIN_ACCURACY,
    rs.METRIC_DEV_LOSS,
    rs.METRIC_DEV_ACCURACY,
    rs.METRIC_EPOCH_TIME,
)
FINAL_METRICS = {
    "best_dev_accuracy": rs.METRIC_BEST_DEV_ACCURACY,
    "best_train_accuracy": rs.METRIC_BEST_TRAIN_ACCURACY,
    "best_epoch": rs.METRIC_BEST_EPOCH,
    "epoch": rs.METRIC_EPOCHS_TRAINED,
    "theta_m": rs.METRIC_THETA_M,
    "theta_wm": rs.METRIC_THETA_WM,
}


READ_WINDOW = 5000  # journal records grouped at once (bounds what `orchestrate sync` holds)
CURSOR_INTERVAL_S = 0.2  # the uploader rewrites its cursor file at most this often mid-window
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
        experiment = tracker.client.get_experiment_by_name(experiment_name)
        sweeps = tracker.sweeps(experiment.experiment_id) if experiment is not None else []
        if not sweeps:
            return 0, ""
        parent = sweeps[0]
        runs = tracker.trial_runs(experiment.experiment_id, parent.info.run_id)
        done = sum(r.info.status == "FINISHED" and (r.info.end_time or 0) >= since_ms for r in runs)
        return done, observed_state(parent.data.tags)
    except Exception:  # any store or transport error: the table shows "?"
        return None


def _now_ms() -> int:
    return int(time.time() * 1000)


class Tracker:
    """MlflowClient calls that a sweep makes, keyed by the names in run_schema."""

    def __init__(self, tracking_uri: str):
        """Opens the store: a database store is opened (created and migrated when new, under a
        lock) here, so a bad URI is InputError and an unreachable database TrackingUnavailable,
        both within seconds."""
        check_tracking_uri(tracking_uri)
        self.tracking_uri = tracking_uri
        self._raise_unavailable(probe_database(tracking_uri))
        try:
            with _store_creation_lock(tracking_uri):
                self.client = MlflowClient(tracking_uri=client_uri(tracking_uri))
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

    def experiment_id(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(name)

    def sweeps(self, experiment_id: str) -> list:
        return sweep_runs(self.client, experiment_id)

    def trial_runs(self, experiment_id: str, parent_run_id: str) -> list:
        return trial_runs(self.client, experiment_id, parent_run_id)

    def start_sweep(self, experiment_id: str, run_name: str, tags: dict[str, str]) -> str:
        run = self.client.create_run(
            experiment_id, run_name=run_name, tags={rs.TAG_ROLE: rs.ROLE_SWEEP, **tags}
        )
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        now = _now_ms()
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_bytes(self, run_id: str, data: bytes, artifact_file: str) -> None:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / Path(artifact_file).name
            path.write_bytes(data)
            self.client.log_artifact(run_id, str(path), str(Path(artifact_file).parent))

    def reopen(self, run_id: str) -> None:
        self.client.update_run(run_id, status="RUNNING")

    def terminate(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)


ProtocolTags = Callable[[dict[str, Any]], dict[str, str]]


def protocol_tags(base: RunConfig, data: PreparedData, refit_on_train_dev: bool) -> ProtocolTags:
    """Trial params -> the nli.protocol.* tags of that trial's protocol fingerprint."""

    def tags(params: dict[str, Any]) -> dict[str, str]:
        fingerprint = protocol_fingerprint(
            apply_hyperparameters(base, params), data, refit_on_train_dev
        )
        return {rs.TAG_PROTOCOL_PREFIX + k: str(v) for k, v in fingerprint.items()}

    return tags


class SweepRecorder:
    """A TrialListener (see ray_adapter) that appends every trial event to the sweep's journal;
    the JournalUploader makes them child runs of the sweep. Appending is all the Tune loop waits
    for. An epoch the journal already holds for a trial (a trial restarted from an older
    checkpoint, by Tune or by a resumed driver: training is deterministic) is not recorded again."""

    def __init__(
        self,
        journal: Journal,
        base_params: dict[str, Any],
        run_tags: dict[str, str],
        protocol: ProtocolTags | None = None,
        dataset: dict[str, Any] | None = None,
    ):
        self.journal = journal
        self.base_params = base_params
        self.run_tags = run_tags
        self.protocol = protocol
        self.dataset = dataset  # see dataset_input
        self._devices: dict[str, dict[str, str]] = {}  # trial id -> the device tags recorded
        # Retries of trials that never started (an actor lost while pending, e.g. its node was
        # removed): they have no run to tag yet, so the tags ride on the start record.
        self._unstarted_retries: dict[str, dict[str, str]] = {}

    # -- TrialListener ----------------------------------------------------------------------
    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        full = {**self.base_params, **params}
        tags = {
            **self.run_tags,
            **(self.protocol(params) if self.protocol else {}),
            rs.TAG_PARAMS_JSON: rs.params_json(full),
            **self._unstarted_retries.pop(trial_id, {}),
        }
        self.journal.append("start", trial_id, {"params": full, "tags": tags,
                                                **trial_start_extras(params, self.dataset)})

    def trial_result(self, trial_id: str, metrics: dict[str, Any]) -> None:
        if rs.METRIC_DIVERGED_EPOCH in metrics:
            return  # not an epoch's metrics: trial_completed records the divergence
        step = int(metrics["epoch"])
        progress = self.journal.trials.get(trial_id)
        if progress is not None and step <= progress.last_epoch:
            return
        values = {k: float(metrics[k]) for k in EPOCH_METRICS if k in metrics}
        record: dict[str, Any] = {"step": step, "values": values}
        # What the trial's process trained on (ray_adapter.run_trial reports it with every
        # epoch): with the epoch's metrics when it first comes, and when a retry ran elsewhere.
        device = {tag: str(metrics[tag]) for tag in rs.DEVICE_TAGS.values() if tag in metrics}
        if device and self._devices.get(trial_id) != device:
            self._devices[trial_id] = record["tags"] = device
        self.journal.append("metrics", trial_id, record)

    def trial_completed(self, trial_id: str, last: dict[str, Any], checkpoint_dir: str | None) -> None:
        if rs.METRIC_DIVERGED_EPOCH in last:
            self._diverged(trial_id, last)
            return
        values = {name: float(last[key]) for key, name in FINAL_METRICS.items() if key in last}
        if "time_total_s" in last:
            values[rs.METRIC_TRIAL_TIME] = float(last["time_total_s"])
        early = bool(last) and not last.get("trial_finished", 0)
        tags = {rs.TAG_EARLY_STOPPED: str(early).lower()}
        self.journal.append("finish", trial_id, {"values": values, "tags": tags, "status": "FINISHED"})
        if checkpoint_dir:
            self.journal.append(
                "artifacts", trial_id, {"path": checkpoint_dir, "dest": rs.ARTIFACT_CHECKPOINT_DIR}
            )

    def trial_errored(self, trial_id: str, params: dict[str, Any], error: str) -> None:
        tags = {rs.TAG_ERROR: error[-4000:]}
        self.journal.append("finish", trial_id, {"values": {}, "tags": tags, "status": "FAILED"})

    def trial_retried(self, trial_id: str, retries: int, cause: str, resumed_from_epoch: int) -> None:
        tags = {
            rs.TAG_RETRIES: str(retries),
            rs.TAG_RETRY_CAUSE: cause[-4000:],
            rs.TAG_RESUMED_FROM_EPOCH: str(resumed_from_epoch),
        }
        progress = self.journal.trials.get(trial_id)
        if progress is None or not progress.started:
            self._unstarted_retries[trial_id] = tags
            return
        self.journal.append("tags", trial_id, {"tags": tags})

    def _diverged(self, trial_id: str, last: dict[str, Any]) -> None:
        """FAILED with the epoch and step where the loss stopped being finite: `results` and the
        selection read FINISHED runs only, so a diverged configuration is never selected."""
        epoch, step = int(last[rs.METRIC_DIVERGED_EPOCH]), int(last[rs.METRIC_DIVERGED_STEP])
        values = {rs.METRIC_DIVERGED_EPOCH: float(epoch), rs.METRIC_DIVERGED_STEP: float(step)}
        values.update({rs.METRIC_THETA_M: float(last["theta_m"]), rs.METRIC_THETA_WM: float(last["theta_wm"])})
        tags = {
            rs.TAG_DIVERGED: "true",
            rs.TAG_ERROR: (
                f"diverged: the training loss became {last.get('diverged_loss', 'non-finite')} "
                f"at epoch {epoch}, step {step}; lower the learning rate or clip gradients"
            ),
        }
        self.journal.append("finish", trial_id, {"values": values, "tags": tags, "status": "FAILED"})

    def trial_cut(self, trial_id: str) -> None:
        # Epoch metrics stay; no final metrics: the trial is resumed from its checkpoint.
        self.journal.append("finish", trial_id, {"values": {}, "tags": {}, "status": "KILLED"})

    def sweep_ended(self) -> None:
        pass  # the sweep drains the uploader after Tune returns


def retry_with_backoff(
    action: Callable[[], Any],
    give_up: Callable[[Exception], bool],
    wait: Callable[[float], Any] = time.sleep,
) -> Any:
    """``action()`` until it returns; after a failure, ``wait`` (0.5 s doubling to 10 s) and try
    again unless ``give_up(error)``, in which case the error is raised."""
    delay = 0.5
    while True:
        try:
            return action()
        except Exception as exc:  # transport and store errors alike: the caller decides
            if give_up(exc):
                raise
            wait(delay)
            delay = min(delay * 2, 10.0)


@dataclass
class _TrialRun:
    """What the uploader knows of one trial's MLflow run: it makes every record idempotent by
    (trial, step): an epoch at or below ``last_step`` is on the run already; a start older than
    the run's latest ending, or a finish not newer than it, changes nothing."""

    run_id: str
    artifact_uri: str  # where its artifacts go (MlflowClient.log_artifacts would get_run for it)
    last_step: int = 0
    ended_ms: int | None = None  # end time of the run's latest FINISHED/FAILED/KILLED
    has_params: bool = True

    @classmethod
    def found(cls, run) -> _TrialRun:
        """From a run as a search returns it, without asking for more: the latest value the store
        keeps of a metric is the one at its highest step, and an epoch's metrics go up in one
        log_batch (its metrics are one transaction), so any epoch metric's step tells the last
        epoch on the run."""
        steps = [m.step for m in run.data.to_proto().metrics if m.key in EPOCH_METRICS]
        ended = run.info.end_time if run.info.status != "RUNNING" else None
        return cls(run.info.run_id, run.info.artifact_uri, max(steps, default=0), ended,
                   bool(run.data.params))


@dataclass
class _Batch:
    """The entities of one log_batch call."""

    params: list[Param] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    tags: list[RunTag] = field(default_factory=list)

    def takes(self, other: _Batch) -> bool:
        """Whether ``other`` fits in this batch within MLflow's limits on one request."""
        params = len(self.params) + len(other.params)
        metrics = len(self.metrics) + len(other.metrics)
        tags = len(self.tags) + len(other.tags)
        return (
            max(params, tags) <= MAX_PARAMS_TAGS_PER_BATCH and metrics <= MAX_METRICS_PER_BATCH
            and params + metrics + tags <= MAX_ENTITIES_PER_BATCH
        )

    def add(self, other: _Batch) -> None:
        self.params += other.params
        self.metrics += other.metrics
        self.tags += other.tags


def batches(parts: list[_Batch]) -> list[_Batch]:
    """``parts`` (one per journal record, in order) packed in order into as few log_batch calls
    as MLflow's limits allow. A record is never split across calls, so every call puts whole
    epochs on the run (the metrics of one call are one transaction in the store)."""
    packed: list[_Batch] = []
    for part in parts:
        if not (part.params or part.metrics or part.tags):
            continue
        if not packed or not packed[-1].takes(part):
            packed.append(_Batch())
        packed[-1].add(part)
    return packed


class JournalUploader:
    """The one path from a journal to MLflow. In a sweep, a thread tails the journal as the driver
    appends; `orchestrate sync` runs the same code over the file. It reads what the journal holds
    after its cursor, groups it by trial (journal.trial_groups) and sends each group in as few
    requests as MLflow takes: a trial that is behind by several epochs catches up in one
    log_batch. Every record is applied idempotently (see _TrialRun), so an uploader killed
    anywhere, or run twice, loses and doubles nothing. While the store is unreachable it keeps
    retrying (the journal holds what is pending); ``drain`` gives up once it has been unreachable
    for ``max_wait_s``.

    What the store already holds of a sweep is read once, with one search for all of the sweep's
    trial runs, the first time a record of that sweep is applied; after that the uploader knows
    every run it creates, so a trial it has not seen is new.

    A cursor file (JOURNAL.uploaded) remembers how far it got for one store (a hash of the URI),
    so a resumed sweep or a second sync does not re-read what that store already has. It only
    moves past records that are all on the store.

    In a sweep its thread starts a pass at most every ``interval_s`` (see the module docstring):
    records appended meanwhile wait for the next pass, unless ``drain`` or ``stop`` asks for
    them."""

    def __init__(self, tracker: Tracker, path: Path, max_wait_s: float | None = None,
                 interval_s: float | None = None):
        self.tracker = tracker
        self.path = Path(path)
        self.max_wait_s = default_max_wait_s() if max_wait_s is None else max_wait_s
        self.interval_s = default_upload_interval_s() if interval_s is None else interval_s
        self.uploaded = 0  # records before the cursor (applied)
        self.failing_since: float | None = None  # monotonic time of the first failure in a row
        self.last_error = ""
        self._runs: dict[tuple[str, str], _TrialRun] = {}  # (parent run, trial) -> its run
        self._searched: set[str] = set()  # parent runs whose trial runs were read from the store
        self._cursor_path = self.path.with_name(self.path.name + ".uploaded")
        self._store = hashlib.sha256(tracker.tracking_uri.encode()).hexdigest()[:16]
        self._offset, self._line = 0, 1
        self._read_cursor()
        self._cursor_written_at = time.monotonic()
        self._wake = threading.Event()  # something was appended
        self._hurry = threading.Event()  # someone waits for the upload: no waiting for the interval
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._journal: Journal | None = None  # the journal a sweep appends to (start)

    # -- the cursor -------------------------------------------------------------------------
    def _read_cursor(self) -> None:
        try:
            cursor = json.loads(self._cursor_path.read_text())
        except (OSError, ValueError):
            return
        size = self.path.stat().st_size if self.path.exists() else 0
        if cursor.get("store") == self._store and 0 <= cursor.get("offset", -1) <= size:
            self._offset, self._line, self.uploaded = cursor["offset"], cursor["line"], cursor["records"]

    def _write_cursor(self) -> None:
        cursor = {"store": self._store, "offset": self._offset, "line": self._line,
                  "records": self.uploaded}
        write_output(self._cursor_path, json.dumps(cursor))
        self._cursor_written_at = time.monotonic()

    # -- uploading --------------------------------------------------------------------------
    def upload_available(self, give_up: Callable[[Exception], bool] = lambda exc: True) -> int:
        """Apply every complete record after the cursor; returns how many. A group that fails is
        retried until ``give_up(error)`` (by default at once: the error is raised)."""
        applied = 0
        while True:
            records = read_records(self.path, self._offset, self._line)
            window = list(itertools.islice(records, READ_WINDOW))
            applied += self._apply_window(window, give_up)
            if len(window) < READ_WINDOW:
                return applied

    def _apply_window(self, window: list[tuple[int, Record]],
                      give_up: Callable[[Exception], bool]) -> int:
        """Apply ``window`` (records right after the cursor) group by group, moving the cursor past
        the records before the first one not applied yet."""
        records = [record for _, record in window]
        applied = [False] * len(records)
        done, first_line = 0, self._line  # records of the window before the cursor
        for group in trial_groups(records):
            retry_with_backoff(partial(self._apply_group, [records[i] for i in group]),
                               partial(self._failed, give_up), wait=self._stopping.wait)
            if self.failing_since is not None:
                print(f"MLflow at {mask_secrets(self.tracker.tracking_uri)} answers again; "
                      f"uploading what {self.path} holds", file=sys.stderr)
                self.failing_since = None
            for index in group:
                applied[index] = True
            before = done
            while done < len(records) and applied[done]:
                done += 1
            self.uploaded += done - before
            self._offset, self._line = window[done - 1][0], first_line + done
            if time.monotonic() - self._cursor_written_at > CURSOR_INTERVAL_S:
                self._write_cursor()
        if records:
            self._write_cursor()
        return len(records)

    def _failed(self, give_up: Callable[[Exception], bool], exc: Exception) -> bool:
        self.last_error = f"{exc.__class__.__name__}: {mask_secrets(str(exc))[:300]}"
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            print(f"MLflow at {mask_secrets(self.tracker.tracking_uri)} did not take a record "
                  f"({self.last_error}); trial events are kept in {self.path} and uploaded when "
                  "it answers", file=sys.stderr)
        return give_up(exc) or self._stopping.is_set()

    def behind(self) -> int:
        """Records in the journal not yet uploaded (the uploader's lag, for the benchmarks):
        counted by the journal a sweep appends to, else by reading the rest of the file."""
        if self._journal is not None:
            return self._journal.appended - self.uploaded
        return sum(1 for _ in read_records(self.path, self._offset, self._line))

    # -- in a sweep: a thread that tails the journal -----------------------------------------
    def start(self, journal: Journal) -> None:
        self._journal = journal
        journal.notify(self._wake)
        self._thread = threading.Thread(target=self._tail, name="journal-uploader", daemon=True)
        self._thread.start()

    def _tail(self) -> None:
        sent_at = -float("inf")  # when the last pass that found records began
        while not self._stopping.is_set():
            self._wake.wait(timeout=1.0)
            # What the trials record until the interval is over joins this pass.
            self._hurry.wait(timeout=max(0.0, sent_at + self.interval_s - time.monotonic()))
            self._wake.clear()
            begun = time.monotonic()
            try:
                if self.upload_available(give_up=lambda exc: False):
                    sent_at = begun
            except Exception as exc:  # stopping, or a journal line that is no record: drain
                self._failed(lambda error: True, exc)  # gives up after max_wait_s, naming it

    def drain(self) -> None:
        """Wait until everything appended is uploaded; TrackingUnavailable once the store has
        been unreachable for max_wait_s (the journal keeps what is left for `orchestrate sync`).
        The passes it waits for start at once, not an interval after the last."""
        self._hurry.set()
        self._wake.set()
        try:
            self._wait_uploaded()
        finally:
            self._hurry.clear()

    def _wait_uploaded(self) -> None:
        while self.behind():
            if self.failing_since is not None and time.monotonic() - self.failing_since > self.max_wait_s:
                uri = mask_secrets(self.tracker.tracking_uri)
                raise TrackingUnavailable(
                    f"MLflow at {uri} is still unreachable after the sweep ({self.last_error}); "
                    f"its trial events are recorded in {self.path}. Upload them with `orchestrate "
                    f"sync {self.path} --tracking-uri {uri}` once the server is back (the "
                    "selection on dev and the test evaluation of this sweep did not run: "
                    "`orchestrate sweep SPEC --resume` runs them after the upload)."
                )
            time.sleep(0.05)

    def stop(self) -> None:
        self._stopping.set()
        self._hurry.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- one group of a trial's records -----------------------------------------------------
    def _run(self, record: Record) -> _TrialRun | None:
        """The trial's run; the store is searched once per sweep, the first time it is needed."""
        if record.parent_run_id not in self._searched:
            for run in self.tracker.trial_runs(record.experiment_id, record.parent_run_id):
                trial = (record.parent_run_id, run.data.tags.get(rs.TAG_TRIAL_ID, ""))
                self._runs.setdefault(trial, _TrialRun.found(run))
            self._searched.add(record.parent_run_id)
        return self._runs.get((record.parent_run_id, record.trial_id))

    def _apply_group(self, records: list[Record]) -> None:
        """One group of journal.trial_groups: the start's run, then one log_batch with its params,
        every epoch not on the run yet and the finish's metrics and tags (more calls only beyond
        MLflow's limits), then the finish's status. Safe to run again after a failure anywhere:
        it sends only what the run does not show yet (see _TrialRun)."""
        first, client = records[0], self.tracker.client
        run = self._run(first)
        if first.kind == "start":
            run = self._start(first, run)
        elif run is None:
            raise KeyError(f"{self.path}: trial {first.trial_id} has no start record before its "
                           f"{first.kind}")
        if first.kind == "tags":
            client.log_batch(run.run_id, tags=[RunTag(k, v) for k, v in first.data["tags"].items()])
            return
        if first.kind == "artifacts":
            if Path(first.data["path"]).exists():
                repository = get_artifact_repository(run.artifact_uri, tracking_uri=self.tracker.tracking_uri)
                repository.log_artifacts(first.data["path"], first.data["dest"])
            return
        parts: list[_Batch] = []
        if first.kind == "start" and not run.has_params:
            params = first.data["params"]
            searched = first.data.get("searched", list(params))
            parts.append(_Batch(params=trial_param_entities(params, searched)))
        finish = None
        for record in records:
            step = int(record.data.get("step", 0))
            if record.kind == "metrics" and step > run.last_step:
                values, tags = record.data["values"], record.data.get("tags", {})
                parts.append(_Batch(metrics=[Metric(k, v, record.time_ms, step) for k, v in values.items()],
                                    tags=[RunTag(k, v) for k, v in tags.items()]))
            elif record.kind == "finish" and (run.ended_ms is None or run.ended_ms < record.time_ms):
                finish = record  # newer than the run's ending (an ending at its time is this one)
                parts.append(_Batch(
                    metrics=[Metric(k, v, record.time_ms, 0) for k, v in record.data["values"].items()],
                    tags=[RunTag(k, v) for k, v in record.data["tags"].items()],
                ))
        for batch in batches(parts):
            client.log_batch(run.run_id, metrics=batch.metrics, params=batch.params, tags=batch.tags)
            run.last_step = max([run.last_step, *(m.step for m in batch.metrics)])
            run.has_params = run.has_params or bool(batch.params)
        if finish is not None:
            client.set_terminated(run.run_id, status=finish.data["status"], end_time=finish.time_ms)
            run.ended_ms = finish.time_ms

    def _start(self, record: Record, run: _TrialRun | None) -> _TrialRun:
        """The trial's run: created, or RUNNING again for a resumed or retried trial. A run without
        params (new, or left by an uploader that died right after creating it) gets its dataset
        input here and its params in the group's log_batch: params last, so a run with params has
        everything its start records."""
        client = self.tracker.client
        params = record.data["params"]
        if run is None:
            created = client.create_run(
                record.experiment_id,
                start_time=record.time_ms,
                run_name=record.data.get("run_name") or record.trial_id,
                tags={
                    **record.data.get("tags", {}),
                    rs.TAG_ROLE: rs.ROLE_TRIAL,
                    rs.TAG_PARENT_RUN: record.parent_run_id,
                    rs.TAG_TRIAL_ID: record.trial_id,
                    rs.TAG_MODEL_CONFIG: rs.model_config_label(params),
                    rs.TAG_CONFIG_KEY: config_key(params),
                },
            )
            run = _TrialRun(created.info.run_id, created.info.artifact_uri, has_params=False)
            self._runs[(record.parent_run_id, record.trial_id)] = run
        elif run.ended_ms is not None and run.ended_ms < record.time_ms:
            client.update_run(run.run_id, status="RUNNING")  # a resumed or retried trial
            run.ended_ms = None
        if not run.has_params and record.data.get("dataset"):
            client.log_inputs(run.run_id, datasets=_dataset_entities(record.data["dataset"]))
        return run


def upload_journal(path: Path, tracking_uri: str) -> int:
    """`orchestrate sync`: upload what a journal holds that the store lacks; returns the records
    applied. TrackingUnavailable when the store does not answer, JournalError for a bad line."""
    tracker = Tracker(tracking_uri)
    tracker.check_reachable()
    return JournalUploader(tracker, path).upload_available()

def host_tags() -> dict[str, str]:
    return {rs.TAG_HOST: socket.gethostname()}



# -- the MLflow UI as a researcher's comparison tool -------------------------------------------
# Trials are named by what the search chose; constants are logged apart (const.<name>); every run
# carries MLflow's own source/user/commit tags and the dataset it read; the parent run carries the
# sweep's summary and description, and the experiment a shared runs view the sweep links to.


def trial_start_extras(searched: dict[str, Any], dataset: dict[str, Any] | None) -> dict[str, Any]:
    """What a trial's start operation carries besides its params: run name, which params were
    searched, the dataset input."""
    return {"run_name": trial_run_name(searched), "searched": sorted(searched), "dataset": dataset}


def trial_run_name(searched: dict[str, Any]) -> str:
    """'lr=3e-4 dropout=0.1 k=100 seed=1': a trial's searched values, its seed last."""
    values = {k: v for k, v in searched.items() if k != rs.PARAM_SEED}
    name = format_hyperparameters(values)
    if rs.PARAM_SEED in searched:
        name = f"{name} seed={searched[rs.PARAM_SEED]}".strip()
    return name or "trial"


def trial_param_entities(params: dict[str, Any], searched: list[str]) -> list[Param]:
    """Searched params under their name, the sweep's constants as const.<name>."""
    return [
        Param(k if k in searched else rs.CONSTANT_PARAM_PREFIX + k, str(v))
        for k, v in sorted(params.items())
    ]


def source_tags(spec_path: str | Path, git_commit: str) -> dict[str, str]:
    """MLflow's own provenance tags, shown by its UI as the Source, User and Version columns."""
    return {
        rs.TAG_MLFLOW_GIT_COMMIT: git_commit,
        rs.TAG_MLFLOW_USER: getpass.getuser(),
        rs.TAG_MLFLOW_SOURCE_NAME: f"orchestrate sweep {Path(spec_path).name}",
        rs.TAG_MLFLOW_SOURCE_TYPE: "LOCAL",
    }


def dataset_input(record: dict[str, Any], digest: str) -> dict[str, Any]:
    """The dataset input every run of a sweep logs (plain JSON, so it can be spooled)."""
    files = record.get("files") or {}
    source = {split: f["path"] for split, f in files.items()} or {"generated": record["corpus"]}
    return {
        "name": record["corpus"],
        "digest": digest,
        "source_type": "local",
        "source": json.dumps(source, sort_keys=True),
        "schema": json.dumps({"premise": "text", "hypothesis": "text", "label": record["labels"]}),
        "profile": json.dumps(
            {
                "splits": record["splits"],
                "vocabulary_size": record["vocabulary_size"],
                "vector_coverage": record["vector_coverage"],
            }
        ),
    }


def _dataset_entities(dataset: dict[str, Any]) -> list[DatasetInput]:
    context = InputTag(MLFLOW_DATASET_CONTEXT, rs.DATASET_CONTEXT)
    return [DatasetInput(Dataset(**dataset), tags=[context])]


def sweep_params(spec: SweepSpec) -> dict[str, str]:
    """The parent run's params: the sweep's summary (see run_schema.SWEEP_PARAMS)."""
    search = spec.search
    space = {name: {d.kind: d.values} for name, d in search.space.items()}
    if search.configurations:
        space["configurations"] = search.configurations
    values = {
        "model": spec.model.name,
        "variant": spec.model.variant,
        "corpus": spec.data.corpus,
        "sampler": search.sampler,
        "scheduler": search.scheduler.type,
        "budget_trials": spec.num_trials(),
        "time_budget_s": search.time_budget_s,
        "grid_size": spec.grid_size(),
        "seeds": ",".join(map(str, search.seeds)),
        "metric": f"{search.metric} ({search.mode})",
        "search_space": json.dumps(space, default=str)[:6000],  # MLflow's param value limit
    }
    return {name: str(values[name]) for name in rs.SWEEP_PARAMS}


def runs_view_state(searched: list[str], metric_columns: list[str]) -> str:
    """A runs view of MLflow 3.17's UI, stored as the experiment tag
    mlflow.sharedViewState.<key> and opened by ?viewStateShareKey=<key>. The UI (useSharedView
    State in its bundle) applies the search facets searchFilter/orderByKey/orderByAsc and the view
    keys selectedColumns, runsHiddenMode, compareRunCharts, ... but drops runsExpanded, so the
    trials are shown by filtering on the trial role (children whose parent is filtered out are
    listed flat). The charts view (&compareRunsMode=CHART) opens on a parallel-coordinates chart
    of the searched hyperparameters against best dev accuracy."""
    section = "nli-hyperparameters"
    parallel = {
        "type": "PARALLEL",
        "uuid": "nli-parallel-coordinates",
        "displayName": "searched hyperparameters vs best dev accuracy",
        "runsCountToCompare": 100,
        "metricSectionId": section,
        "deleted": False,
        "isGenerated": False,
        "selectedParams": [p for p in searched if p != rs.PARAM_SEED],
        "selectedMetrics": [rs.METRIC_BEST_DEV_ACCURACY],
        "showAllRuns": True,
    }
    return json.dumps(
        {
            "searchFilter": f"tags.`{rs.TAG_ROLE}` = '{rs.ROLE_TRIAL}'",
            "orderByKey": f"metrics.`{rs.METRIC_BEST_DEV_ACCURACY}`",
            "orderByAsc": False,
            "lifecycleFilter": "Active",
            "selectedColumns": [
                *(f"metrics.`{m}`" for m in metric_columns),
                *(f"params.`{p}`" for p in searched),
                f"tags.`{rs.TAG_MODEL_CONFIG}`",
            ],
            "runsHiddenMode": "SHOW_ALL",
            "compareRunCharts": [parallel],
            "compareRunSections": [
                {"uuid": section, "name": "Hyperparameters", "display": True,
                 "isReordered": False, "deleted": False, "isGenerated": False}
            ],
        }
    )


def runs_view_path(experiment_id: str, charts: bool = False) -> str:
    """The trials view written by ``runs_view_state`` (its table, or with ``charts`` the
    parallel-coordinates chart), as a link relative to the MLflow UI it is opened in: a fragment,
    so it holds from any host, port or tunnel. ``workflowType=machine_learning`` keeps MLflow
    3.17's UI on its runs table (without it, it opens the GenAI pages unless the browser's
    localStorage says otherwise)."""
    return (
        f"#/experiments/{experiment_id}/runs?{rs.UI_WORKFLOW_PARAMETER}"
        f"&viewStateShareKey={rs.RUNS_VIEW_KEY}" + ("&compareRunsMode=CHART" if charts else "")
    )


def run_path(experiment_id: str, run_id: str) -> str:
    """A run's page, relative to the MLflow UI it is opened in (see ``runs_view_path``)."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{rs.UI_WORKFLOW_PARAMETER}"


def ui_link(base_url: str, path: str) -> str:
    """A path of ``runs_view_path`` / ``run_path`` on the UI at ``base_url``."""
    return f"{base_url.rstrip('/')}/{path}"


def tracking_server_ui(tracking_uri: str) -> str | None:
    """The UI of a store when the store is a tracking server (it serves its UI), else None: a
    database store has a UI only where `orchestrate ui` serves it."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return split_credentials(tracking_uri)[0]  # printed: never its credentials


def ui_hint(tracking_uri: str, experiment_id: str) -> str:
    """Where a sweep's trials are in the MLflow UI, as `sweep` prints it: a tracking server's
    links, or the `orchestrate ui` command for this very store (a database store has no UI of
    its own; `ui` prints the links on whatever port it serves)."""
    server = tracking_server_ui(tracking_uri)
    if server is not None:
        return (
            f"trials in the MLflow UI, best on dev first: "
            f"{ui_link(server, runs_view_path(experiment_id))}\n"
            "hyperparameters against dev accuracy: "
            f"{ui_link(server, runs_view_path(experiment_id, charts=True))}"
        )
    return (
        f"trials in the MLflow UI: orchestrate ui --tracking-uri {shlex.quote(mask_secrets(tracking_uri))} "
        f"(then the experiment, Views > \"{rs.RUNS_VIEW_NAME}\")"
    )


def runs_view_envelope(state: str, now_ms: int, previous: str | None) -> str:
    """The experiment tag value MLflow 3.17's "Views" menu lists by name (its saved-view
    envelope: name, createdAt, updatedAt in ms, state = the view JSON as a string); a view
    written before keeps its creation time."""
    created = now_ms
    if previous:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            created = int(json.loads(previous)["createdAt"])
    return json.dumps(
        {"name": rs.RUNS_VIEW_NAME, "createdAt": created, "updatedAt": now_ms, "state": state}
    )


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sweep_note(spec: SweepSpec, spec_path: str | Path, link: str, best: str | None = None) -> str:
    """The parent run's description (markdown, mlflow.note.content). The links come first: the
    run page shows the first lines of a description until "show more" is clicked."""
    params = sweep_params(spec)
    lines = [
        f"[{rs.RUNS_VIEW_NAME}]({link})" + (f" · best: {best}" if best else ""),
        "",
        f"**{spec.name}**: {params['model']}/{params['variant']} on {params['corpus']}",
        "",
        f"- search: {params['sampler']} sampler, {params['scheduler']} scheduler, "
        f"{params['grid_size']} configurations x seeds {params['seeds']} = "
        f"{params['budget_trials']} trials",
        f"- space: `{_shortened(params['search_space'], 1000)}`",  # tags hold 8000 characters
        f"- selection: best mean {spec.search.metric} over seeds on dev within each model "
        "configuration; test evaluated for the selected configuration only",
        f"- spec: `{Path(spec_path).name}` (artifact {rs.ARTIFACT_SPEC})",
    ]
    return "\n".join(lines) + "\n"


def describe_sweep(
    tracker: Tracker,
    spec: SweepSpec,
    spec_path: str | Path,
    experiment_id: str,
    parent_run_id: str,
    resume: bool,
) -> str:
    """Summary params, description and source tags on the parent; the experiment holds the
    trials view, listed by name in the UI's Views menu. Returns the view's relative link
    (``runs_view_path``)."""
    link = runs_view_path(experiment_id)
    searched = sorted(
        {*spec.search.space, *(k for c in spec.search.configurations for k in c), rs.PARAM_SEED}
    )
    metrics = [rs.METRIC_BEST_DEV_ACCURACY, rs.METRIC_TEST_ACCURACY, rs.METRIC_TRIAL_TIME]
    client = tracker.client
    view_tag = rs.EXPERIMENT_TAG_SHARED_VIEW_PREFIX + rs.RUNS_VIEW_KEY
    previous = client.get_experiment(experiment_id).tags.get(view_tag)
    client.set_experiment_tag(experiment_id, rs.EXPERIMENT_TAG_KIND, rs.EXPERIMENT_KIND_ML)
    client.set_experiment_tag(
        experiment_id,
        view_tag,
        runs_view_envelope(runs_view_state(searched, metrics), int(time.time() * 1000), previous),
    )
    if not resume:  # params are immutable: a resumed sweep keeps the ones it started with
        client.log_batch(
            parent_run_id, params=[Param(k, v) for k, v in sweep_params(spec).items()]
        )
    tracker.set_tags(parent_run_id, {rs.TAG_MLFLOW_NOTE: sweep_note(spec, spec_path, link)})
    return link


def describe_best(
    tracker: Tracker,
    spec: SweepSpec,
    spec_path: str | Path,
    experiment_id: str,
    parent_run_id: str,
    best_run_id: str,
    summary: str,
) -> None:
    """Add the best trial, as a link to its run page, to the parent's description."""
    best = f"[{summary}]({run_path(experiment_id, best_run_id)})"
    note = sweep_note(spec, spec_path, runs_view_path(experiment_id), best=best)
    tracker.set_tags(parent_run_id, {rs.TAG_MLFLOW_NOTE: note})


def log_provenance(
    tracker: Tracker, run_id: str, data: dict[str, Any], environment: dict[str, Any]
) -> None:
    tracker.log_text(run_id, json.dumps(data, indent=2), rs.ARTIFACT_DATA_RECORD)
    tracker.log_text(run_id, json.dumps(environment, indent=2), rs.ARTIFACT_ENVIRONMENT)


def log_dataset(tracker: Tracker, run_id: str, dataset: dict[str, Any]) -> None:
    tracker.client.log_inputs(run_id, datasets=_dataset_entities(dataset))


def sweep_views(tracking_uri: str) -> dict[str, str]:
    """experiment name -> id for every experiment holding the trials view a sweep writes; an
    SQLite file that does not exist yet is not created."""
    if tracking_uri.startswith("sqlite:///"):
        if not Path(tracking_uri.removeprefix("sqlite:///").split("?")[0]).exists():
            return {}
    key = rs.EXPERIMENT_TAG_SHARED_VIEW_PREFIX + rs.RUNS_VIEW_KEY
    experiments = MlflowClient(client_uri(tracking_uri)).search_experiments(filter_string=f"tags.`{key}` != ''")
    return {e.name: e.experiment_id for e in sorted(experiments, key=lambda e: e.name)}
