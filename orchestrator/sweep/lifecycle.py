"""A sweep's lifecycle, recorded in its parent run's tag nli.sweep_state:

    planned -> running -> completed | interrupted | failed
    interrupted | failed -> running            (orchestrate sweep SPEC --resume)
    completed -> running                       (orchestrate sweep SPEC --extend: more trials)

`planned`: the parent exists, no trial has been asked for. `completed`: every planned trial ended
(all epochs, early stopping, stopped by the scheduler, or failed after its retries; or the
search's time budget, counted from the first trial's start, ran out after at least one trial
ended) and the selection on dev and the test evaluation are recorded; they happen in this state
only (with no trial selectable, every one failed or diverged, nothing is selected or tested). A
budget that runs out before any trial ended leaves the sweep `interrupted` (resumable). `interrupted`: SIGINT/SIGTERM, a second signal, or a driver that died
(seen by readers through its lease, results/sweeps.py). `failed`: the driver crashed.

Signals (Interruption): the first SIGINT or SIGTERM stops Tune's scheduling through Tune's own
stop event (the state Tune saves then is what --resume continues); running trials keep the
checkpoint of their last epoch. A second signal, or a shutdown longer than SHUTDOWN_GRACE_S,
aborts at once; the same records follow. Before the parent run exists a signal aborts at once:
nothing was written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from results import run_schema as rs
from results.sweeps import HEARTBEAT_INTERVAL_S

TRANSITIONS: dict[str | None, set[str]] = {
    None: {rs.SWEEP_PLANNED},
    rs.SWEEP_PLANNED: {rs.SWEEP_RUNNING, rs.SWEEP_INTERRUPTED, rs.SWEEP_FAILED},
    rs.SWEEP_RUNNING: {rs.SWEEP_COMPLETED, rs.SWEEP_INTERRUPTED, rs.SWEEP_FAILED},
    rs.SWEEP_INTERRUPTED: {rs.SWEEP_RUNNING},
    rs.SWEEP_FAILED: {rs.SWEEP_RUNNING},
    rs.SWEEP_COMPLETED: {rs.SWEEP_RUNNING},  # --extend (orchestrator/sweep/extend.py)
}
# MLflow status of the parent run in each final state (RUNNING in the others).
RUN_STATUS = {
    rs.SWEEP_COMPLETED: "FINISHED",
    rs.SWEEP_INTERRUPTED: "KILLED",
    rs.SWEEP_FAILED: "FAILED",
}
SHUTDOWN_GRACE_S = 120.0


class SweepInterrupted(BaseException):
    """Raised in the main thread to abort at once (second signal, or before anything exists).
    A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it."""


class SweepState:
    """The parent run's state, moved only along TRANSITIONS (`record` journals each move:
    recorder.SweepLog.state)."""

    def __init__(self, record: Callable[[str], None], current: str | None = None):
        self._record = record
        self.current = current

    def move(self, target: str) -> None:
        if target not in TRANSITIONS[self.current]:
            raise RuntimeError(f"sweep state cannot go from {self.current} to {target}")
        self._record(target)
        self.current = target


def lease_tags() -> dict[str, str]:
    return {rs.TAG_DRIVER: f"{socket.gethostname()} {os.getpid()}", rs.TAG_HEARTBEAT: f"{time.time():.0f}"}


class Heartbeat:
    """Renews the driver's lease on the parent run from a daemon thread (`set_tags` journals it:
    a tracking server away delays the beats in the store; readers then doubt the driver sooner)."""

    def __init__(self, set_tags: Callable[[dict[str, str]], None], interval_s: float = HEARTBEAT_INTERVAL_S):
        self._set_tags = set_tags
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="sweep-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._set_tags(lease_tags())
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _beat(self) -> None:
        while not self._stopped.wait(self._interval_s):
            with contextlib.suppress(Exception):
                self._set_tags(lease_tags())


class Interruption:
    """The driver's SIGINT/SIGTERM handling (see the module docstring)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.aborted = False  # a second signal came: whatever was running was cut short
        self.armed = False  # True once the parent run exists: a first signal stops cleanly
        self._stop_tune: Callable[[], None] | None = None
        self._deferred = False
        self._previous: dict[int, Any] = {}
        self._grace: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __enter__(self) -> Interruption:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._grace is not None:
            self._grace.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def arm(self) -> None:
        """The parent run exists: from now a first signal stops cleanly. Installs the handlers
        again, in case a library replaced them meanwhile (init_ray puts back what ray.init
        replaces)."""
        for signum in self.SIGNALS:
            signal.signal(signum, self._handle)
        self.armed = True

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested or not self.armed:
            self.aborted = True
            again = " again" if self.requested else ""
            print(f"{name}{again}: aborting at once", file=sys.stderr, flush=True)
            if self._deferred:
                return
            # Raised inside a Ray call it may come out wrapped (SystemError): `aborted` tells.
            raise SweepInterrupted(f"{name}: aborted")
        self.signal_name = name
        print(
            f"{name}: stopping the sweep; running trials keep their last epoch's checkpoint "
            "(send it again to abort at once)",
            file=sys.stderr,
            flush=True,
        )
        self._grace = threading.Timer(SHUTDOWN_GRACE_S, os.kill, (os.getpid(), signum))
        self._grace.daemon = True
        self._grace.start()
        if self._stop_tune is not None:
            self._stop_tune()

    def on_tune_stop(self, stop: Callable[[], None]) -> None:
        """Tune's stop for the running fit(); called at once if a signal came before."""
        self._stop_tune = stop
        if self.requested:
            stop()

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Writes that must not be cut in half (the records of a sweep's end): a signal during
        them is only noted (`requested`, `aborted`)."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False


class TrialLedger:
    """A TrialListener in front of the others that decides, from what the driver saw, whether a
    trial Tune reports complete really ended. Tune's statuses cannot tell: after a stop it marks
    every trial it was running (and pending ones) TERMINATED. A trial ended if its last report
    says so (all epochs or patience: `trial_finished`), or if the scheduler stopped it while the
    sweep was neither interrupted nor out of its time budget. Any other "completed" trial was
    cut: listeners hear trial_cut and its run becomes KILLED, to be resumed.

    The time budget (search.time_budget_s) counts from the first trial's start in this driver,
    not from the start of Ray and Tune (which on a busy machine took longer than a small
    budget): when it runs out the ledger stops Tune as Ctrl-C would (Tune's own time_budget_s
    is not used), and the trials that ended by then are the sweep's."""

    def __init__(self, listeners: list, interruption: Interruption, time_budget_s: float | None):
        self.listeners = listeners
        self.interruption = interruption
        self.time_budget_s = time_budget_s
        self.deadline: float | None = None  # set when the first trial starts
        self.ended: set[str] = set()
        self.cut: set[str] = set()
        self._stop_tune: Callable[[], None] | None = None
        self._budget_timer: threading.Timer | None = None

    def on_tune_stop(self, stop: Callable[[], None]) -> None:
        """Tune's stop for the running fit(), called when the budget runs out."""
        self._stop_tune = stop

    def budget_spent(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _budget_ran_out(self) -> None:
        if self._stop_tune is not None:
            # Tune's stop sets its stop event, then puts back a SIGINT handler, which only the
            # main thread may do (ValueError here; the driver's own handler stays, as it should).
            with contextlib.suppress(ValueError):
                self._stop_tune()

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        if self.time_budget_s is not None and self.deadline is None:
            self.deadline = time.monotonic() + self.time_budget_s
            self._budget_timer = threading.Timer(self.time_budget_s, self._budget_ran_out)
            self._budget_timer.daemon = True
            self._budget_timer.start()
        self.cut.discard(trial_id)
        for listener in self.listeners:
            listener.trial_started(trial_id, params)

    def trial_result(self, trial_id: str, metrics: dict[str, Any]) -> None:
        for listener in self.listeners:
            listener.trial_result(trial_id, metrics)

    def trial_completed(self, trial_id: str, last: dict[str, Any], checkpoint_dir: str | None) -> None:
        stopped_by_scheduler = not (self.interruption.requested or self.budget_spent())
        if last and (last.get(rs.RESULT_TRIAL_FINISHED) or stopped_by_scheduler):
            self.ended.add(trial_id)
            for listener in self.listeners:
                listener.trial_completed(trial_id, last, checkpoint_dir)
        else:
            self.cut.add(trial_id)
            for listener in self.listeners:
                listener.trial_cut(trial_id)

    def trial_errored(self, trial_id: str, params: dict[str, Any], error: str) -> None:
        if self.interruption.requested:  # killed by the shutdown, not by its own fault
            self.cut.add(trial_id)
            for listener in self.listeners:
                listener.trial_cut(trial_id)
            return
        for listener in self.listeners:
            listener.trial_errored(trial_id, params, error)

    def trial_retried(self, trial_id: str, retries: int, cause: str, resumed_from_epoch: int) -> None:
        for listener in self.listeners:
            listener.trial_retried(trial_id, retries, cause, resumed_from_epoch)

    def trial_checkpoint(self, trial_id: str, checkpoint_dir: str) -> None:
        for listener in self.listeners:
            listener.trial_checkpoint(trial_id, checkpoint_dir)

    def sweep_ended(self) -> None:
        if self._budget_timer is not None:
            self._budget_timer.cancel()
        for listener in self.listeners:
            listener.sweep_ended()
