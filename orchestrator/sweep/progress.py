"""One-line terminal progress for a sweep (Ray's own tables stay off unless -v).

The ETA counts work in trial-epochs: while trials run, the seconds per finished epoch so far
times the epochs still to come (each running trial's remaining epochs plus every pending
trial's). Early stopping (ASHA, median) only shortens the sweep, so the ETA is an upper bound.
After the last trial a line says what the sweep is doing (the test evaluation of the selected
configuration), so the terminal never sits silent.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from results import run_schema as rs


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ProgressPrinter:
    """A TrialListener: trials done / running / pending / failed, best dev accuracy, elapsed, ETA."""

    def __init__(self, total: int, metric: str = rs.METRIC_DEV_ACCURACY, mode: str = "max",
                 stream: TextIO | None = None, min_interval_s: float = 10.0,
                 finished_before: Iterable[str] = (), epochs_per_trial: int | None = None,
                 best_so_far: float | None = None):
        self.total = total
        self.metric = metric
        self.sign = 1 if mode == "max" else -1
        self.stream = stream or sys.stderr
        self.min_interval_s = min_interval_s
        self.started = time.monotonic()
        self.last_print = 0.0
        self.running: set[str] = set()
        self.done: set[str] = set()
        # Trials finished before a --resume, by id: one that runs again (Tune's state, saved before
        # the driver was killed, may not know it finished) is counted once, never past the plan.
        self.finished_before: set[str] = set(finished_before)
        self.failed: set[str] = set()
        self.diverged: set[str] = set()  # counted apart, as the sweep's last line counts them
        self.best: float | None = best_so_far  # a resumed sweep's best before this session
        self.printed_state: tuple | None = None  # what the last line said (a forced line repeats nothing)
        self.epochs_per_trial = epochs_per_trial
        self.epochs: dict[str, int] = {}  # trial -> epochs it has reported here
        self.first_start: float | None = None  # training time is counted from the first trial

    def _done(self) -> int:
        return len(self.done | self.finished_before)

    def _pending(self) -> int:
        ended = self._done() + len(self.failed) + len(self.diverged)
        return max(self.total - ended - len(self.running), 0)

    def eta(self, now: float | None = None) -> str:
        """Remaining time from the seconds per trial-epoch so far; '?' before the first epoch."""
        now = time.monotonic() if now is None else now
        finished_epochs = sum(self.epochs.values())
        if self.epochs_per_trial and finished_epochs and self.first_start is not None:
            per_epoch = (now - self.first_start) / finished_epochs
            remaining = self._pending() * self.epochs_per_trial + sum(
                max(self.epochs_per_trial - self.epochs.get(t, 0), 0) for t in self.running
            )
            return _clock(per_epoch * remaining)
        finished_here = len(self.done) + len(self.failed) + len(self.diverged)
        if finished_here and self.first_start is not None:  # epochs unknown: whole trials
            per_trial = (now - self.first_start) / finished_here
            return _clock(per_trial * (self._pending() + len(self.running)))
        return "?"

    def _best(self) -> str:
        if self.best is None:
            return "-"
        return f"{self.best:.2%}" if "accuracy" in self.metric else f"{self.best:.4f}"

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        return (
            f"[{_clock(elapsed)}] trials: {self._done()} done, {len(self.running)} running, "
            f"{self._pending()} pending, {len(self.failed)} failed"
            + (f", {len(self.diverged)} diverged" if self.diverged else "")
            + f" (of {self.total}) | best "
            f"{self.metric} {self._best()} | eta {self.eta()}"
        )

    def phase(self, what: str) -> None:
        """A line for a step of the sweep after the trials (e.g. the test evaluation)."""
        print(f"[{_clock(time.monotonic() - self.started)}] {what}", file=self.stream, flush=True)

    def _state(self) -> tuple:
        return (len(self.done), len(self.running), len(self.failed), self.best)

    def _print(self, force: bool = False) -> None:
        """A line every min_interval_s at most; a forced one (a trial ended) at once, unless
        nothing changed since the last line (the last trial's end and the sweep's end)."""
        now = time.monotonic()
        if force and self._state() == self.printed_state:
            return
        if force or now - self.last_print >= self.min_interval_s:
            self.last_print = now
            self.printed_state = self._state()
            print(self.line(), file=self.stream, flush=True)

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        if self.first_start is None:
            self.first_start = time.monotonic()
        self.finished_before.discard(trial_id)  # it trains again: done once it ends again
        self.running.add(trial_id)
        self.failed.discard(trial_id)
        self.diverged.discard(trial_id)
        self._print()

    def trial_result(self, trial_id: str, metrics: dict[str, Any]) -> None:
        if rs.METRIC_DIVERGED_EPOCH in metrics:
            return
        value = metrics.get(self.metric)
        if value is not None and (self.best is None or self.sign * value > self.sign * self.best):
            self.best = float(value)
        if rs.METRIC_EPOCHS_TRAINED in metrics:
            epoch = int(metrics[rs.METRIC_EPOCHS_TRAINED])
            self.epochs[trial_id] = max(self.epochs.get(trial_id, 0), epoch)
        self._print()

    def trial_completed(self, trial_id: str, last: dict[str, Any], checkpoint_dir: str | None) -> None:
        self.running.discard(trial_id)
        if rs.METRIC_DIVERGED_EPOCH in last:
            self.diverged.add(trial_id)
            print(f"trial {trial_id} diverged: the training loss became "
                  f"{last.get('diverged_loss')} at epoch {last[rs.METRIC_DIVERGED_EPOCH]}, step "
                  f"{last[rs.METRIC_DIVERGED_STEP]}; stopped", file=self.stream, flush=True)
        else:
            self.done.add(trial_id)
        self._print(force=True)

    def trial_retried(self, trial_id: str, retries: int, cause: str, resumed_from_epoch: int) -> None:
        last_line = cause.strip().splitlines()[-1] if cause.strip() else "unknown error"
        print(f"trial {trial_id} failed ({last_line}); retry {retries} from epoch "
              f"{resumed_from_epoch}", file=self.stream, flush=True)

    def trial_errored(self, trial_id: str, params: dict[str, Any], error: str) -> None:
        self.running.discard(trial_id)
        self.failed.add(trial_id)
        print(
            f"trial {trial_id} failed; config {params}\n{error.rstrip()}",
            file=self.stream,
            flush=True,
        )
        self._print(force=True)

    def trial_cut(self, trial_id: str) -> None:
        self.running.discard(trial_id)

    def trial_checkpoint(self, trial_id: str, checkpoint_dir: str) -> None:
        pass  # a stack member's checkpoint, after the end this printer showed

    def sweep_ended(self) -> None:
        self._print(force=True)


# "0": the sweep prints no resume command; its launcher prints its own (the SLURM batch script:
# `orchestrate submit ... --slurm --resume`).
RESUME_HINT_ENV = "NLI_RESUME_HINT"


def interrupted_line(done: int, failed: int, planned: int, resume_command: str) -> str:
    failures = f" ({failed} failed)" if failed else ""
    line = f"interrupted: {done}/{planned} trials done{failures}"
    if os.environ.get(RESUME_HINT_ENV) == "0":
        return line
    return f"{line}; continue with: {resume_command}"
