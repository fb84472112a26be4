"""One-line terminal progress for a sweep (Ray's own tables stay off unless -v)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ProgressPrinter:
    """A TrialListener: trials done / running / pending / failed, best dev accuracy, elapsed, ETA."""

    def __init__(self, total: int, metric: str = "dev_accuracy", mode: str = "max",
                 stream: TextIO | None = None, min_interval_s: float = 10.0,
                 already_done: int = 0):
        self.total = total
        self.metric = metric
        self.sign = 1 if mode == "max" else -1
        self.stream = stream or sys.stderr
        self.min_interval_s = min_interval_s
        self.started = time.monotonic()
        self.last_print = 0.0
        self.running: set[str] = set()
        self.done: set[str] = set()
        self.already_done = already_done  # finished before a --resume
        self.failed: set[str] = set()
        self.best: float | None = None

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        done = len(self.done) + self.already_done
        finished_here = len(self.done) + len(self.failed)
        pending = max(self.total - done - len(self.failed) - len(self.running), 0)
        eta = "?"
        if finished_here:
            eta = _clock(elapsed / finished_here * pending)
        best = "-" if self.best is None else f"{self.best:.4f}"
        return (
            f"[{_clock(elapsed)}] trials: {done} done, {len(self.running)} running, "
            f"{pending} pending, {len(self.failed)} failed (of {self.total}) | best {self.metric} "
            f"{best} | eta {eta}"
        )

    def _print(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_print >= self.min_interval_s:
            self.last_print = now
            print(self.line(), file=self.stream, flush=True)

    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        self.running.add(trial_id)
        self.failed.discard(trial_id)
        self._print()

    def trial_result(self, trial_id: str, metrics: dict[str, Any]) -> None:
        value = metrics.get(self.metric)
        if value is not None and (self.best is None or self.sign * value > self.sign * self.best):
            self.best = float(value)
        self._print()

    def trial_completed(self, trial_id: str, last: dict[str, Any], checkpoint_dir: str | None) -> None:
        self.running.discard(trial_id)
        self.done.add(trial_id)
        self._print(force=True)

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

    def sweep_ended(self) -> None:
        self._print(force=True)


def interrupted_line(done: int, failed: int, planned: int, spec_path: str) -> str:
    failures = f" ({failed} failed)" if failed else ""
    return (
        f"interrupted: {done}/{planned} trials done{failures}; continue with: "
        f"orchestrate sweep {spec_path} --resume"
    )
