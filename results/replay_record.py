"""A completed sweep read back as a tabular benchmark (`orchestrate replay`): the spec it ran and,
per finished trial run, its typed params and its per-epoch curve (the searched metric, dev
accuracy, epoch seconds), as MLflow holds them.

Test metrics are not read here: ``recorded_test_accuracy`` reads them for the runs of one
selected configuration at a time, as the results table does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient

from results import run_schema as rs
from results.results_errors import ResultsError
from results.run_reader import (
    fetch_test_metrics,
    metric_histories,
    resolve_experiments,
    trial_params,
)
from results.stored_sweeps import load_sweeps, trial_runs

# What a replay reads of each epoch: the metrics a sweep can search on (search.metric) and the
# epoch's seconds, which advance the simulated clock.
CURVES = (rs.METRIC_DEV_ACCURACY, rs.METRIC_DEV_LOSS, rs.METRIC_EPOCH_TIME)


@dataclass(frozen=True)
class RecordedTrial:
    """One finished trial run: what a replayed trial of its configuration and seed receives."""

    run_id: str
    params: Mapping[str, object]  # typed (tag nli.params), constants included
    config_key: str
    model_config: str
    theta_m: int | None
    curves: Mapping[str, tuple[float, ...]]  # CURVES, each epoch by epoch
    cut_by_scheduler: bool  # nli.early_stopped: the curve ends where ASHA/median stopped it

    @property
    def dev_accuracy(self) -> tuple[float, ...]:
        return self.curves[rs.METRIC_DEV_ACCURACY]

    @property
    def epoch_time_s(self) -> tuple[float, ...]:
        return self.curves[rs.METRIC_EPOCH_TIME]


@dataclass(frozen=True)
class SweepRecording:
    experiment: str
    parent_run_id: str
    spec_text: str  # the spec.yaml artifact: the spec as run, overrides applied
    best_run_id: str | None  # nli.best_run_id: the sweep's selection (its best seed)
    trials: tuple[RecordedTrial, ...]
    unusable: int  # trial runs without a finished curve (failed, diverged, killed)
    concurrency: int  # the most trial runs that ran at the same time


def completed_sweep(client: MlflowClient, experiment: str):
    """The parent run of the experiment's latest completed sweep; ResultsError when the
    experiment is unknown or none of its sweeps completed."""
    (found,) = resolve_experiments(client, [experiment])
    sweeps = load_sweeps(client, found.experiment_id, found.name)
    completed = [s for s in sweeps if s.completed]
    if not completed:
        states = ", ".join(f"{s.run_id} {s.state} ({s.progress()})" for s in sweeps) or "none"
        raise ResultsError(
            f"experiment {experiment!r} has no completed sweep to replay (its sweeps: {states}); "
            f"finish it first: orchestrate sweep SPEC --resume"
        )
    return found, client.get_run(completed[0].run_id)


def read_recording(client: MlflowClient, experiment: str) -> SweepRecording:
    """The latest completed sweep of ``experiment``, with each finished trial's CURVES."""
    found, parent = completed_sweep(client, experiment)
    parent_id = parent.info.run_id
    runs = trial_runs(client, found.experiment_id, parent_id)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    ids = [r.info.run_id for r in finished]
    histories = {name: metric_histories(client, ids, name) for name in CURVES}
    trials = tuple(
        trial for trial in (
            _recorded(run, {name: h[run.info.run_id] for name, h in histories.items()})
            for run in finished
        ) if trial is not None
    )
    return SweepRecording(
        experiment=experiment,
        parent_run_id=parent_id,
        spec_text=_spec_text(client, parent_id),
        best_run_id=parent.data.tags.get(rs.TAG_BEST_RUN),
        trials=trials,
        unusable=len(runs) - len(trials),
        concurrency=_most_at_once(runs),
    )


def _recorded(run, histories: dict[str, list[tuple[int, float]]]) -> RecordedTrial | None:
    """The run's curve, or None when an epoch lacks a value (nothing is filled in)."""
    by_epoch = {name: dict(points) for name, points in histories.items()}
    epochs = sorted(by_epoch[rs.METRIC_DEV_ACCURACY])
    if not epochs or epochs != list(range(1, len(epochs) + 1)):
        return None
    if any(set(values) != set(epochs) for values in by_epoch.values()):
        return None
    tags = run.data.tags
    theta_m = run.data.metrics.get(rs.METRIC_THETA_M)
    return RecordedTrial(
        run_id=run.info.run_id,
        params=trial_params(run),
        config_key=tags.get(rs.TAG_CONFIG_KEY, ""),
        model_config=tags.get(rs.TAG_MODEL_CONFIG, ""),
        theta_m=None if theta_m is None else int(theta_m),
        curves={name: tuple(values[e] for e in epochs) for name, values in by_epoch.items()},
        cut_by_scheduler=tags.get(rs.TAG_EARLY_STOPPED, "").lower() == "true",
    )


def _most_at_once(runs) -> int:
    """The most runs whose [start, end] intervals overlap: how many trials ran at once."""
    events = sorted(
        (time, step)
        for run in runs if run.info.start_time and run.info.end_time
        for time, step in ((run.info.start_time, 1), (run.info.end_time, -1))
    )
    most = current = 0
    for _, step in events:  # an end sorts before a start at the same millisecond
        current += step
        most = max(most, current)
    return max(most, 1)


def _spec_text(client: MlflowClient, parent_run_id: str) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        try:
            path = client.download_artifacts(parent_run_id, rs.ARTIFACT_SPEC, scratch)
        except Exception as exc:  # MLflow raises several types for an absent artifact
            raise ResultsError(
                f"sweep {parent_run_id} has no {rs.ARTIFACT_SPEC} artifact to replay: {exc}"
            ) from None
        return Path(path).read_text()


def recorded_test_accuracy(client: MlflowClient, run_ids: list[str]) -> float | None:
    """The mean test accuracy of one configuration's seed runs, or None unless every one of them
    holds a test number (the sweep tested only the configurations it selected)."""
    values = [fetch_test_metrics(client, run_id).get(rs.METRIC_TEST_ACCURACY) for run_id in run_ids]
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)
