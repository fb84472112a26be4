"""What `orchestrate report` reads from the tracking store for one experiment (``Record``): its
sweeps, their provenance artifacts, the trial runs, the results table, the selected runs'
test predictions and the best trials' dev curves. What the store does not hold is said to be
NOT_RECORDED on the page, never guessed."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import yaml
from mlflow import MlflowClient
from mlflow.entities import Experiment, Run

from results import run_schema as rs
from results.analysis import (
    top_trials,
)
from results.predictions import read_predictions
from results.results_errors import ResultsError
from results.run_reader import (
    TrialRun,
    download_predictions,
    fetch_test_metrics,
    load_trials,
    metric_histories,
)
from results.table import build_table

NOT_RECORDED = "not recorded"


# -- reading the record ------------------------------------------------------------------------
@dataclass
class Record:
    experiment: Experiment
    sweeps: list[Run]
    trials: list[TrialRun]
    table: pa.Table
    artifacts: dict[str, dict]  # parent run id -> {"data": ..., "environment": ..., "spec": ...}
    predictions: dict[str, pd.DataFrame]  # selected run id -> test predictions
    histories: dict[str, list[tuple[int, float]]]


def _artifact(client: MlflowClient, run_id: str, path: str, scratch: Path):
    try:
        local = Path(client.download_artifacts(run_id, path, str(scratch / run_id)))
    except Exception:  # absent artifact: MLflow raises several types; the page says so
        return None
    text = local.read_text()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


def read_record(client: MlflowClient, experiment: Experiment) -> Record:
    sweeps = client.search_runs(
        [experiment.experiment_id],
        f"tags.`{rs.TAG_ROLE}` = '{rs.ROLE_SWEEP}'",
        order_by=["attributes.start_time ASC"],
    )
    trials = load_trials(client, [experiment])
    table = build_table(trials, lambda run_id: fetch_test_metrics(client, run_id), [experiment.name])
    artifacts, predictions = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for sweep in sweeps:
            run_id = sweep.info.run_id
            artifacts[run_id] = {
                "data": _artifact(client, run_id, rs.ARTIFACT_DATA_RECORD, Path(scratch)),
                "environment": _artifact(client, run_id, rs.ARTIFACT_ENVIRONMENT, Path(scratch)),
                "spec": _artifact(client, run_id, rs.ARTIFACT_SPEC, Path(scratch)),
            }
        for run_id in table.column("selected_run_id").to_pylist():
            try:
                path = download_predictions(client, run_id, Path(scratch) / run_id)
            except ResultsError:
                continue
            predictions[run_id] = read_predictions(path)
    top = top_trials(trials, experiment.name)
    histories = metric_histories(client, [t.record.run_id for t in top], rs.METRIC_DEV_ACCURACY)
    return Record(experiment, sweeps, trials, table, artifacts, predictions, histories)


