"""Reading sweeps back through MlflowClient, for any tracking URI (SQLite file, HTTP server, ...).

Only trial runs (tag nli.role=trial) are read. Their test metrics are dropped on loading:
``fetch_test_metrics`` reads them again, one run at a time, and the table calls it for the runs of
the selected configuration only, so the test data of other configurations cannot leak into it.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from mlflow import MlflowClient
from mlflow.entities import Experiment, Run
from mlflow.exceptions import MlflowException

from nli_models.errors import mask_secrets
from results.mlflow_client import mlflow_client
from results.results_errors import ResultsError, ResultsWarning
from results.run_schema import (
    ARTIFACT_TEST_PREDICTIONS,
    CLASS_ACCURACY_PREFIX,
    CONSTANT_PARAM_PREFIX,
    LEGACY_SWEEP_METRICS,
    METRIC_TEST_ACCURACY,
    ROLE_TRIAL,
    TAG_CONFIG_KEY,
    TAG_CORPUS,
    TAG_MODEL_CONFIG,
    TAG_PARAMS_JSON,
    TAG_PARENT_RUN,
    TAG_PROTOCOL_PREFIX,
    TAG_ROLE,
    TAG_SELECTED,
    evaluation_of,
)
from results.selection import TrialRecord
from results.tracking_uri import check_tracking_uri, unreachable_store
from results.trial_result import TrialResult

TRIAL_FILTER = f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'"


@dataclass(frozen=True)
class TrialRun:
    """A trial run as the table sees it: its selection record plus what the row reports."""

    record: TrialRecord
    experiment: str
    parent_run_id: str | None
    tagged_selected: bool  # nli.selected == "true", as the sweep wrote it
    metrics: Mapping[str, float]  # latest value of every metric except the test ones
    corpus: str | None = None  # nli.corpus: the sweep's data.corpus
    protocol: Mapping[str, str] | None = None  # nli.protocol.* tags; None for older runs
    run_name: str | None = None  # e.g. "lr=3e-4 dropout=0.1 seed=1"
    test_evaluation: int = 1  # which test evaluation of its sweep its test metrics are (--extend)


def open_client(tracking_uri: str) -> MlflowClient:
    # MLflow silently creates an empty store at a local path that does not exist, which would turn
    # a typo into an empty result and a stray database file; refuse it instead.
    path = _local_store_path(tracking_uri)
    if path is not None and not path.exists():
        raise ResultsError(f"no tracking store at {path} (tracking URI {tracking_uri!r})")
    check_tracking_uri(tracking_uri)
    unreachable = unreachable_store(tracking_uri)
    if unreachable is not None:  # fail in seconds, not after the client's minutes of retries
        raise ResultsError(
            f"MLflow tracking store {mask_secrets(tracking_uri)} is unreachable: "
            f"{mask_secrets(unreachable)}"
        )
    return mlflow_client(tracking_uri)


def _local_store_path(tracking_uri: str) -> Path | None:
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///").split("?")[0])
    parsed = urlparse(tracking_uri)
    return Path(parsed.path) if parsed.scheme in ("", "file") else None


def resolve_experiments(client: MlflowClient, names: Sequence[str]) -> list[Experiment]:
    """The named experiments, or every experiment holding trial runs when ``names`` is empty."""
    existing = {e.name: e for e in _all_experiments(client)}
    unknown = [name for name in names if name not in existing]
    if unknown:
        raise ResultsError(
            f"unknown experiment(s): {', '.join(unknown)}; experiments in this tracking store: "
            f"{', '.join(sorted(existing)) or '(none)'}"
        )
    if names:
        return [existing[name] for name in dict.fromkeys(names)]
    with_trials = [e for e in existing.values() if _has_trials(client, e)]
    if not with_trials:
        raise ResultsError(
            f"no experiment holds trial runs; experiments: {', '.join(sorted(existing))}"
        )
    return sorted(with_trials, key=lambda e: e.name)


def _all_experiments(client: MlflowClient) -> Iterator[Experiment]:
    token = None
    while True:
        page = client.search_experiments(page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _has_trials(client: MlflowClient, experiment: Experiment) -> bool:
    return bool(client.search_runs([experiment.experiment_id], TRIAL_FILTER, max_results=1))


def load_trials(client: MlflowClient, experiments: Sequence[Experiment]) -> list[TrialRun]:
    """Every active trial run of ``experiments``; ResultsError if an experiment has none."""
    trials: list[TrialRun] = []
    for experiment in experiments:
        runs = list(_trial_runs(client, experiment.experiment_id))
        if not runs:
            raise ResultsError(
                f"experiment {experiment.name!r} has no trial runs (tag {TAG_ROLE}={ROLE_TRIAL})"
            )
        trials.extend(t for t in (_trial(run, experiment.name) for run in runs) if t is not None)
    return trials


def _trial_runs(client: MlflowClient, experiment_id: str) -> Iterator[Run]:
    token = None
    while True:
        page = client.search_runs([experiment_id], TRIAL_FILTER, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def trial_params(run: Run) -> dict[str, object]:
    """A trial's params with their types (tag nli.params); for runs written before that tag, the
    logged strings (const. prefix stripped), which readers parse with results.params."""
    typed = run.data.tags.get(TAG_PARAMS_JSON)
    if typed:
        with contextlib.suppress(ValueError):
            return json.loads(typed)
    return {k.removeprefix(CONSTANT_PARAM_PREFIX): v for k, v in run.data.params.items()}


def _trial(run: Run, experiment: str) -> TrialRun | None:
    tags = run.data.tags
    params = trial_params(run)
    if TAG_CONFIG_KEY not in tags or TAG_MODEL_CONFIG not in tags:
        warnings.warn(
            f"{experiment}: trial run {run.info.run_id} lacks the {TAG_CONFIG_KEY} or "
            f"{TAG_MODEL_CONFIG} tag and is ignored",
            ResultsWarning,
            stacklevel=2,
        )
        return None
    metrics = {k: v for k, v in run.data.metrics.items() if not is_test_metric(k)}
    record = TrialResult.from_metrics(metrics).record(
        run_id=run.info.run_id,
        config_key=tags[TAG_CONFIG_KEY],
        model_config=tags[TAG_MODEL_CONFIG],
        params=params,
        status=run.info.status,
    )
    return TrialRun(
        record=record,
        experiment=experiment,
        parent_run_id=tags.get(TAG_PARENT_RUN),
        tagged_selected=tags.get(TAG_SELECTED, "").lower() == "true",
        metrics=metrics,
        corpus=tags.get(TAG_CORPUS),
        protocol={
            k.removeprefix(TAG_PROTOCOL_PREFIX): v
            for k, v in tags.items()
            if k.startswith(TAG_PROTOCOL_PREFIX)
        }
        or None,
        run_name=run.info.run_name,
        test_evaluation=evaluation_of(tags),
    )


def is_test_metric(name: str) -> bool:
    return name == METRIC_TEST_ACCURACY or name.startswith(CLASS_ACCURACY_PREFIX)


def fetch_test_metrics(client: MlflowClient, run_id: str) -> dict[str, float]:
    """test_accuracy and test_accuracy.<label> of one run; call it for selected runs only."""
    metrics = client.get_run(run_id).data.metrics
    return {name: value for name, value in metrics.items() if is_test_metric(name)}


def download_predictions(client: MlflowClient, run_id: str, directory: Path) -> Path:
    try:
        return Path(client.download_artifacts(run_id, ARTIFACT_TEST_PREDICTIONS, str(directory)))
    except (MlflowException, OSError) as exc:
        raise ResultsError(
            f"run {run_id} has no {ARTIFACT_TEST_PREDICTIONS} artifact: {exc}"
        ) from exc


def metric_histories(
    client: MlflowClient, run_ids: Sequence[str], metric: str
) -> dict[str, list[tuple[int, float]]]:
    """run id -> [(step, value)] of one metric, by step (per-epoch curves use step = epoch)."""
    return {
        run_id: sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))
        for run_id in run_ids
    }


def sweep_metric(run: Run, name: str) -> float | None:
    """A sweep (parent) run's summary metric, e.g. sweep.best_dev_accuracy; stores written before
    the sweep.* names hold it under the plain trial name (run_schema.LEGACY_SWEEP_METRICS)."""
    metrics = run.data.metrics
    if name in metrics:
        return metrics[name]
    return metrics.get(LEGACY_SWEEP_METRICS.get(name, name))
