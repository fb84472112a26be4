"""A sweep's tracking journal: the append-only record of everything a sweep writes (the outbox).

The driver appends every operation here (``Op``: the parent run's states, lease, description,
selection and files; each trial's start, epochs, end, test metrics and files) and writes to MLflow
nothing else; one uploader (``uploader.JournalUploader``) applies the journal to MLflow, so a
tracking-server outage is only an uploader falling behind, and ``orchestrate sync`` is the same
uploader run over the file. The one write that cannot wait is the parent run's creation (its id
names the journal): ``uploader.create_parent`` makes it when the sweep opens, right after the
store answered its probe.
Modelled on Optuna's JournalFileBackend: JSON lines, each written whole with one ``write`` on an
append-mode file; a line is an event only once its newline is on disk, so a torn last line (a
process killed mid-write) is no event and is cut off when the journal is opened again.

Durability: every append is flushed to the operating system (it survives a killed driver); it is
fsynced at most once per ``FSYNC_INTERVAL_S`` (a power failure loses at most that much), because
an fsync per epoch would put disk latency on the Tune loop of sweeps with thousands of trials.

This module knows nothing of MLflow: a record is {"seq", "experiment_id", "parent_run_id",
"kind", "trial_id", "data", "time_ms"} (the spool files of earlier versions are journals without
"seq" and are read the same way).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

FSYNC_INTERVAL_S = 1.0


class Op(StrEnum):
    """A journal record's kind: one operation on the store (after Optuna's JournalOperation). A
    record targets a trial's run by its trial id, or the parent run with ``PARENT``."""

    START = "start"  # trial: its run (created, or RUNNING again), params, tags, dataset input
    EPOCH = "metrics"  # trial: one epoch's metrics at its step (and device tags)
    FINISH = "finish"  # trial: final metrics and tags, status FINISHED | FAILED | KILLED
    TAGS = "tags"  # trial or parent: tags (lease, heartbeat, description, selection marks)
    ARTIFACTS = "artifacts"  # trial or parent: a file or folder ("path") under "dest"
    METRICS = "values"  # trial or parent: metrics at "step" (0 if absent): test metrics, the summary
    PARAMS = "params"  # parent: the sweep's summary params
    INPUTS = "inputs"  # parent: the dataset input
    EXPERIMENT_TAGS = "experiment_tags"  # the experiment: its runs view
    STATE = "state"  # parent: nli.sweep_state and run status; a final one closes trial runs left RUNNING
    BEST = "best"  # parent: the best trial's run id, and the description linking it


KINDS = tuple(op.value for op in Op)
PARENT = ""  # the trial id of records on the parent run


def journal_file(storage_path: str, parent_run_id: str) -> Path:
    """Where a sweep's journal lives: in its storage_path when that is a folder (file://
    included), so a requeued or resumed driver on another node finds it; for an object store
    (s3://, gs://, ...) in the local data dir ($NLI_DATA_DIR or ~/.cache/nli-orchestrator)."""
    name = f"tracking-journal-{parent_run_id}.jsonl"
    if storage_path.startswith("file://"):
        return Path(urllib.parse.urlsplit(storage_path).path) / name
    if "://" in storage_path:
        local = os.environ.get("NLI_DATA_DIR") or "~/.cache/nli-orchestrator"
        return Path(local).expanduser() / "tracking-journal" / name
    return Path(storage_path) / name


class JournalError(ValueError):
    """A journal line that is not a record (names the file and line)."""


@dataclass
class Record:
    kind: str
    trial_id: str
    data: dict[str, Any]
    time_ms: int
    experiment_id: str
    parent_run_id: str
    seq: int | None = None


def _parse(line: bytes, path: Path, line_number: int) -> Record:
    try:
        raw = json.loads(line)
        record = Record(
            kind=raw["kind"], trial_id=str(raw["trial_id"]), data=raw["data"],
            time_ms=int(raw["time_ms"]), experiment_id=str(raw["experiment_id"]),
            parent_run_id=str(raw["parent_run_id"]), seq=raw.get("seq"),
        )
    except json.JSONDecodeError as exc:
        raise JournalError(f"{path}:{line_number}: not a JSON line: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(
            f"{path}:{line_number}: not a journal record (needs kind, trial_id, data, time_ms, "
            f"experiment_id, parent_run_id): {exc!r}"
        ) from None
    if record.kind not in KINDS or not isinstance(record.data, dict):
        raise JournalError(
            f"{path}:{line_number}: kind {record.kind!r} with data {type(record.data).__name__}; "
            f"allowed kinds: {', '.join(KINDS)} with an object as data"
        )
    return record


def read_records(path: Path, offset: int = 0, first_line: int = 1) -> Iterator[tuple[int, Record]]:
    """(offset after the record, record) for every complete line from ``offset`` on; a last
    line without its newline is not yet (or never) a record and is not returned."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        line_number = first_line
        for line in handle:
            if not line.endswith(b"\n"):
                return
            offset += len(line)
            if line.strip():
                yield offset, _parse(line, path, line_number)
            line_number += 1


def trial_groups(records: Sequence[Record]) -> list[list[int]]:
    """The indexes of ``records`` in the groups an uploader applies together, ordered by their
    first record: a trial's start, the epochs that follow it and its finish (``[start] metrics*
    [finish]``, its records in journal order), or one record of another kind (tags, artifacts).
    Applying the groups in this order keeps every trial's records in the order it recorded them;
    records of different trials depend on nothing of each other."""
    groups: list[list[int]] = []
    open_groups: dict[tuple[str, str], list[int]] = {}  # trial -> its group that takes epochs
    for index, record in enumerate(records):
        trial = (record.parent_run_id, record.trial_id)
        group = open_groups.pop(trial, None)
        if group is not None and record.kind in ("metrics", "finish"):
            group.append(index)
        else:
            group = [index]
            groups.append(group)
        if record.kind in ("start", "metrics") and record.trial_id != PARENT:
            open_groups[trial] = group
    return groups


@dataclass
class TrialProgress:
    """What the journal holds of one trial: whether its run was started (the uploader creates a
    trial's run from its start record only), the last epoch recorded (a resumed driver does not
    record an epoch again), how it last ended (None: not since its last start) with its final
    metrics and tags, its run name and the device tags of its epochs. The driver counts and
    selects from this, never from the store, so an outage cannot change a sweep's outcome."""

    started: bool = False
    last_epoch: int = 0
    status: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    run_name: str = ""


@dataclass
class Journal:
    """One sweep's journal, opened for appending by its driver (one driver per sweep: the lease
    in lifecycle.py). Opening it reads what an earlier driver of the same sweep recorded."""

    path: Path
    experiment_id: str
    parent_run_id: str
    trials: dict[str, TrialProgress] = field(default_factory=dict)
    appended: int = 0  # records in the file (the earlier drivers' included)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._listeners: list[threading.Event] = []
        end = 0
        if self.path.exists():
            for offset, record in read_records(self.path):
                self._remember(record)
                self.appended += 1
                end = offset
            if self.path.stat().st_size > end:  # a torn last line: cut it, it was never an event
                os.truncate(self.path, end)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._synced_at = time.monotonic()

    def _remember(self, record: Record) -> None:
        if record.trial_id == PARENT:
            return
        progress = self.trials.setdefault(record.trial_id, TrialProgress())
        if record.kind == Op.START:
            progress.started, progress.status = True, None
            progress.run_name = record.data.get("run_name") or record.trial_id
        elif record.kind == Op.EPOCH:
            progress.last_epoch = max(progress.last_epoch, int(record.data["step"]))
            progress.tags.update(record.data.get("tags", {}))
        elif record.kind == Op.FINISH:
            progress.status = record.data["status"]
            progress.values, progress.tags = dict(record.data["values"]), {**progress.tags, **record.data["tags"]}

    def append(self, kind: Op, trial_id: str, data: dict[str, Any]) -> None:
        """Record one operation, whole, before anyone may act on it."""
        with self._lock:
            record = {
                "seq": self.appended + 1, "experiment_id": self.experiment_id,
                "parent_run_id": self.parent_run_id, "kind": Op(kind).value, "trial_id": trial_id,
                "data": data, "time_ms": int(time.time() * 1000),
            }
            os.write(self._fd, (json.dumps(record, default=str) + "\n").encode())
            if time.monotonic() - self._synced_at >= FSYNC_INTERVAL_S:
                os.fsync(self._fd)
                self._synced_at = time.monotonic()
            self.appended += 1
            self._remember(
                Record(record["kind"], trial_id, data, record["time_ms"], self.experiment_id, self.parent_run_id)
            )
            for event in self._listeners:
                event.set()

    def notify(self, event: threading.Event) -> None:
        """``event`` is set after every append (the uploader waits on it)."""
        self._listeners.append(event)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
