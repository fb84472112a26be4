"""The one code that writes a sweep to MLflow: ``JournalUploader`` applies a sweep's journal
(orchestrator/journal/operations.py) to the store, trial runs and parent run alike, and ``create_parent``
makes the parent run the journal is named by. In a sweep a thread of the driver tails the
journal; `orchestrate sync` runs the same code over the file. tests/test_single_writer.py checks
that no other module of orchestrator/ calls an MLflow write.

Not Ray's MLflowLoggerCallback (one request per metric, no parent run): the records a trial has
pending go up in one log_batch, so neither the Tune loop nor training waits for the store.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from nli_models.errors import mask_secrets
from orchestrator.journal.operations import PARENT, Journal, Op, Record, read_records, trial_groups
from orchestrator.journal.recorder import BEST_RUN_ID, EPOCH_METRICS
from orchestrator.sweep.spec import config_key
from orchestrator.tracking.run_view import runs_view_envelope
from orchestrator.tracking.tracker import (
    Tracker,
    TrackingUnavailable,
    default_max_wait_s,
    default_upload_interval_s,
)
from orchestrator.tracking.upload_batches import Batch, batches, retry_with_backoff
from results import run_schema as rs
from results.atomic_files import write_output

READ_WINDOW = 5000  # journal records grouped at once (bounds what `orchestrate sync` holds)
CURSOR_INTERVAL_S = 0.2  # the uploader rewrites its cursor file at most this often mid-window


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



class JournalUploader:
    """The one path from a journal to MLflow. In a sweep, a thread tails the journal as the driver
    appends; `orchestrate sync` runs the same code over the file. It reads what the journal holds
    after its cursor, groups it by trial (operations.trial_groups) and sends each group in as few
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
        self._parent_artifacts: dict[str, str] = {}  # parent run -> its artifact URI
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
                    f"what the sweep recorded is kept in {self.path}. Upload it with `orchestrate "
                    f"sync {self.path} --tracking-uri {uri}` once the server is back (or "
                    "`orchestrate sweep SPEC --resume`, which uploads it first)."
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
        """One group of operations.trial_groups: an operation on the parent run (_apply_parent), or
        the start's run, then one log_batch with its params,
        every epoch not on the run yet and the finish's metrics and tags (more calls only beyond
        MLflow's limits), then the finish's status. Safe to run again after a failure anywhere:
        it sends only what the run does not show yet (see _TrialRun)."""
        first, client = records[0], self.tracker.client
        if first.trial_id == PARENT:
            self._apply_parent(first)
            return
        run = self._run(first)
        if first.kind == Op.START:
            run = self._start(first, run)
        elif run is None:
            raise KeyError(f"{self.path}: trial {first.trial_id} has no start record before its "
                           f"{first.kind}")
        if first.kind in (Op.TAGS, Op.METRICS, Op.ARTIFACTS):
            self._apply_to_run(first, run.run_id, run.artifact_uri)
            return
        parts: list[Batch] = []
        if first.kind == Op.START and not run.has_params:
            params = first.data["params"]
            searched = first.data.get("searched", list(params))
            parts.append(Batch(params=trial_param_entities(params, searched)))
        finish = None
        for record in records:
            step = int(record.data.get("step", 0))
            if record.kind == Op.EPOCH and step > run.last_step:
                values, tags = record.data["values"], record.data.get("tags", {})
                parts.append(Batch(metrics=[Metric(k, v, record.time_ms, step) for k, v in values.items()],
                                    tags=[RunTag(k, v) for k, v in tags.items()]))
            elif record.kind == Op.FINISH and (run.ended_ms is None or run.ended_ms < record.time_ms):
                finish = record  # newer than the run's ending (an ending at its time is this one)
                parts.append(Batch(
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

    # -- operations on the parent run ---------------------------------------------------------
    def _apply_parent(self, record: Record) -> None:
        """One operation on the parent run or its experiment. Each is safe to apply again: tags,
        params and files are overwritten with the same values, a state's status is set again."""
        client, run_id, data = self.tracker.client, record.parent_run_id, record.data
        if record.kind in (Op.TAGS, Op.METRICS, Op.ARTIFACTS):
            if run_id not in self._parent_artifacts:
                self._parent_artifacts[run_id] = client.get_run(run_id).info.artifact_uri
            self._apply_to_run(record, run_id, self._parent_artifacts[run_id])
        elif record.kind == Op.PARAMS:
            client.log_batch(run_id, params=[Param(k, v) for k, v in data["params"].items()])
        elif record.kind == Op.INPUTS:
            client.log_inputs(run_id, datasets=_dataset_entities(data["dataset"]))
        elif record.kind == Op.EXPERIMENT_TAGS:
            view_tag = rs.EXPERIMENT_TAG_SHARED_VIEW_PREFIX + rs.RUNS_VIEW_KEY
            previous = client.get_experiment(record.experiment_id).tags.get(view_tag)
            view = runs_view_envelope(data["runs_view"], record.time_ms, previous)
            for key, value in {**data["tags"], view_tag: view}.items():
                client.set_experiment_tag(record.experiment_id, key, value)
        elif record.kind == Op.STATE:
            self._move(record)
        elif record.kind == Op.BEST:
            best = self._run(replace(record, trial_id=data["trial_id"]))
            if best is None:
                raise KeyError(f"{self.path}: the best trial {data['trial_id']} has no start record")
            note = data["note"].replace(BEST_RUN_ID, best.run_id)
            client.log_batch(run_id, tags=[RunTag(rs.TAG_BEST_RUN, best.run_id), RunTag(rs.TAG_MLFLOW_NOTE, note)])
        else:
            raise KeyError(f"{self.path}: a {record.kind} record names no trial")

    def _apply_to_run(self, record: Record, run_id: str, artifact_uri: str) -> None:
        """Tags, metrics (at the record's step, 0 when it names none) or a file/folder of files on
        one run (a trial's or the parent)."""
        data = record.data
        if record.kind == Op.TAGS:
            self.tracker.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in data["tags"].items()])
        elif record.kind == Op.METRICS:
            step = int(data.get("step", 0))
            metrics = [Metric(k, v, record.time_ms, step) for k, v in data["values"].items()]
            self.tracker.client.log_batch(run_id, metrics=metrics)
        elif Path(data["path"]).exists():  # a checkpoint Tune deleted since is no longer there
            repository = get_artifact_repository(artifact_uri, tracking_uri=self.tracker.tracking_uri)
            if Path(data["path"]).is_dir():
                repository.log_artifacts(data["path"], data["dest"] or None)
            else:
                repository.log_artifact(data["path"], data["dest"] or None)

    def _move(self, record: Record) -> None:
        """A state move: RUNNING again for `running`; a final state kills the trial runs left
        RUNNING (resumable), then ends the parent with its status."""
        client, run_id, status = self.tracker.client, record.parent_run_id, record.data["status"]
        if status == "RUNNING":
            client.update_run(run_id, status="RUNNING")
        client.log_batch(run_id, tags=[RunTag(rs.TAG_SWEEP_STATE, record.data["state"])])
        if status == "RUNNING":
            return
        self._run(record)  # the store's trial runs of this sweep are known
        for (parent, _), run in self._runs.items():
            if parent == run_id and run.ended_ms is None:
                client.set_terminated(run.run_id, status="KILLED", end_time=record.time_ms)
                run.ended_ms = record.time_ms
        client.set_terminated(run_id, status=status, end_time=record.time_ms)


def create_parent(tracker: Tracker, experiment_name: str, run_name: str, tags: dict[str, str]) -> tuple[str, str]:
    """(experiment id, run id) of a new sweep's parent run, created at once: the one write that
    does not go through a journal, because the parent's id names the journal. The driver calls it
    right after the store answered its probe, before any trial exists; if it fails, the sweep
    has not started."""
    client = tracker.client
    experiment_id = tracker.find_experiment(experiment_name) or client.create_experiment(experiment_name)
    run = client.create_run(experiment_id, run_name=run_name, tags={rs.TAG_ROLE: rs.ROLE_SWEEP, **tags})
    return experiment_id, run.info.run_id


def upload_journal(path: Path, tracking_uri: str) -> int:
    """`orchestrate sync`: upload what a journal holds that the store lacks; returns the records
    applied. TrackingUnavailable when the store does not answer, JournalError for a bad line."""
    tracker = Tracker(tracking_uri)
    tracker.check_reachable()
    return JournalUploader(tracker, path).upload_available()


def trial_param_entities(params: dict[str, Any], searched: list[str]) -> list[Param]:
    """Searched params under their name, the sweep's constants as const.<name>."""
    return [
        Param(k if k in searched else rs.CONSTANT_PARAM_PREFIX + k, str(v))
        for k, v in sorted(params.items())
    ]


def _dataset_entities(dataset: dict[str, Any]) -> list[DatasetInput]:
    context = InputTag(MLFLOW_DATASET_CONTEXT, rs.DATASET_CONTEXT)
    return [DatasetInput(Dataset(**dataset), tags=[context])]
