"""What the uploader (orchestrator/tracking/uploader.py) needs besides the store: its retry policy and the
packing of a trial's pending records into as few requests as MLflow's limits allow."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.utils.validation import (
    MAX_ENTITIES_PER_BATCH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
)


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
class Batch:
    """The entities of one log_batch call."""

    params: list[Param] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    tags: list[RunTag] = field(default_factory=list)

    def takes(self, other: Batch) -> bool:
        """Whether ``other`` fits in this batch within MLflow's limits on one request."""
        params = len(self.params) + len(other.params)
        metrics = len(self.metrics) + len(other.metrics)
        tags = len(self.tags) + len(other.tags)
        return (
            max(params, tags) <= MAX_PARAMS_TAGS_PER_BATCH and metrics <= MAX_METRICS_PER_BATCH
            and params + metrics + tags <= MAX_ENTITIES_PER_BATCH
        )

    def add(self, other: Batch) -> None:
        self.params += other.params
        self.metrics += other.metrics
        self.tags += other.tags


def batches(parts: list[Batch]) -> list[Batch]:
    """``parts`` (one per journal record, in order) packed in order into as few log_batch calls
    as MLflow's limits allow. A record is never split across calls, so every call puts whole
    epochs on the run (the metrics of one call are one transaction in the store)."""
    packed: list[Batch] = []
    for part in parts:
        if not (part.params or part.metrics or part.tags):
            continue
        if not packed or not packed[-1].takes(part):
            packed.append(Batch())
        packed[-1].add(part)
    return packed


