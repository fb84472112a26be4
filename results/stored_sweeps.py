"""Sweeps read from a tracking store through MlflowClient, each in the state results/sweeps.py
observes (`orchestrate sweeps`, `best` and `results`; the sweep driver's Tracker)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from results import run_schema as rs
from results.run_reader import sweep_metric
from results.sweeps import observed_state

if TYPE_CHECKING:
    from mlflow import MlflowClient


@dataclass(frozen=True)
class SweepRecord:
    experiment: str
    run_id: str
    state: str  # observed_state
    planned: int | None
    done: int  # trial runs that ended (all epochs, patience, or stopped by the scheduler)
    failed: int  # trial runs that failed after their retries
    best_dev_accuracy: float | None  # best trial so far (any state of the sweep)
    test_accuracy: float | None  # the selected configuration's, only once completed
    test_evaluation: int | None = None  # which test evaluation test_accuracy is (--extend: 2, ...)
    selected: dict[str, str] = field(default_factory=dict)  # the selected run's varied params
    start_time_ms: int = 0
    end_time_ms: int | None = None

    @property
    def completed(self) -> bool:
        return self.state == rs.SWEEP_COMPLETED

    def progress(self) -> str:
        planned = "?" if self.planned is None else str(self.planned)
        return f"{self.done}/{planned} trials done, {self.failed} failed"


def sweep_runs(client: MlflowClient, experiment_id: str) -> list:
    """Parent runs of an experiment's sweeps, latest first."""
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{rs.TAG_ROLE}` = '{rs.ROLE_SWEEP}'",
        order_by=["attributes.start_time DESC"],
    )


def trial_runs(client: MlflowClient, experiment_id: str, parent_run_id: str) -> list:
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{rs.TAG_PARENT_RUN}` = '{parent_run_id}'",
        max_results=50000,
    )


def sweep_record(client: MlflowClient, experiment: str, parent, trials: list) -> SweepRecord:
    tags = parent.data.tags
    state = observed_state(tags)
    finished = [t for t in trials if t.info.status == "FINISHED"]
    devs = [t.data.metrics[rs.METRIC_BEST_DEV_ACCURACY] for t in finished
            if rs.METRIC_BEST_DEV_ACCURACY in t.data.metrics]
    selected: dict[str, str] = {}
    best_run = tags.get(rs.TAG_BEST_RUN)
    chosen = next((t for t in trials if t.info.run_id == best_run), None)
    if chosen is not None:
        varied = {k for t in trials for k, v in t.data.params.items() if v != chosen.data.params.get(k)}
        selected = {k: v for k, v in sorted(chosen.data.params.items()) if k in varied and k != rs.PARAM_SEED}
    planned = tags.get(rs.TAG_PLANNED_TRIALS)
    return SweepRecord(
        experiment=experiment,
        run_id=parent.info.run_id,
        state=state,
        planned=int(planned) if planned and planned.isdigit() else None,
        done=len(finished),
        failed=sum(t.info.status == "FAILED" for t in trials),
        best_dev_accuracy=max(devs) if devs else None,
        test_accuracy=(
            sweep_metric(parent, rs.METRIC_SWEEP_TEST_ACCURACY) if state == rs.SWEEP_COMPLETED else None
        ),
        selected=selected,
        test_evaluation=rs.evaluation_of(tags) if rs.METRIC_SWEEP_TEST_ACCURACY in parent.data.metrics else None,
        start_time_ms=parent.info.start_time or 0,
        end_time_ms=None if state == rs.SWEEP_RUNNING else parent.info.end_time or _last_beat_ms(tags),
    )


def _last_beat_ms(tags: Mapping[str, str]) -> int | None:
    beat = tags.get(rs.TAG_HEARTBEAT)
    return int(float(beat) * 1000) if beat else None


def load_sweeps(client: MlflowClient, experiment_id: str, experiment: str) -> list[SweepRecord]:
    """Every sweep of an experiment, latest first."""
    return [
        sweep_record(client, experiment, parent, trial_runs(client, experiment_id, parent.info.run_id))
        for parent in sweep_runs(client, experiment_id)
    ]
