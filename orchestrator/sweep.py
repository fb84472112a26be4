"""`orchestrate sweep`: validate, prepare data once, run Tune, then apply the paper protocol.

Paper protocol (Rocktäschel §3): within each model configuration pick the hyperparameters with
the best mean dev accuracy over seeds, and evaluate test data for that configuration alone.
"""

from __future__ import annotations

import io
import json
import platform
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import ray
import torch

from nli_models.config import Overrides
from nli_models.data import PreparedData, prepare_data
from nli_models.errors import InputError, mask_secrets
from nli_models.training import check_fits_data, make_trainer, refit_and_test
from orchestrator.progress import ProgressPrinter
from orchestrator.provenance import data_digest, data_record, environment_record
from orchestrator.ray_adapter import (
    TrialOutcome,
    check_ray_address,
    check_resources,
    init_ray,
    run_tuner,
    shutdown_ray,
)
from orchestrator.spec import (
    SweepSpec,
    apply_hyperparameters,
    config_key,
    effective_spec_text,
    load_spec,
    logged_params,
)
from orchestrator.tracking import (
    SweepRecorder,
    Tracker,
    dataset_input,
    describe_best,
    describe_sweep,
    host_tags,
    log_dataset,
    log_provenance,
    protocol_tags,
    source_tags,
    spool_file,
)
from results import run_schema as rs
from results.selection import TrialRecord, seed_runs, select_configuration


class SweepExists(RuntimeError):
    """The experiment already holds a sweep and neither --resume nor --new was given."""


@dataclass
class SweepSummary:
    experiment_id: str
    parent_run_id: str
    trials: int
    failed: int
    diverged: int  # trials stopped because their loss became NaN/inf (never selected)
    best_dev_accuracy: float | None
    test_accuracy: float | None
    interrupted: bool


def _git_tags() -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        return {rs.TAG_GIT_COMMIT: git("rev-parse", "HEAD"), rs.TAG_GIT_DIRTY: str(bool(git("status", "--porcelain"))).lower()}
    except (OSError, subprocess.SubprocessError):
        return {rs.TAG_GIT_COMMIT: "unknown", rs.TAG_GIT_DIRTY: "unknown"}


def _version_tags() -> dict[str, str]:
    return {
        "nli.ray_version": ray.__version__,
        "nli.torch_version": torch.__version__,
        "nli.python_version": platform.python_version(),
    }


def _override_tags(overrides: Overrides | None) -> dict[str, str]:
    return {rs.TAG_OVERRIDES: json.dumps(overrides.describe())} if overrides else {}


def _open_parent(
    tracker: Tracker,
    spec: SweepSpec,
    spec_path: Path,
    resume: bool,
    new: bool,
    overrides: Overrides | None = None,
):
    experiment_id = tracker.experiment_id(spec.name)
    previous = tracker.sweeps(experiment_id)
    if previous and not (resume or new):
        latest = previous[0]
        raise SweepExists(
            f"experiment {spec.name!r} already holds sweep run {latest.info.run_id} "
            f"({latest.data.tags.get(rs.TAG_SWEEP_STATE, latest.info.status)}); pass --resume to "
            "continue it or --new to start another sweep beside it"
        )
    if resume:
        if not previous:
            raise SweepExists(f"experiment {spec.name!r} holds no sweep to resume; drop --resume")
        parent = previous[0]
        if parent.data.tags.get(rs.TAG_SPEC_HASH) != spec.spec_hash():
            print(
                f"warning: {spec_path} changed since sweep {parent.info.run_id} started; "
                "resuming with the search recorded by Ray Tune",
                file=sys.stderr,
            )
        tracker.reopen(parent.info.run_id)
        tracker.set_tags(parent.info.run_id, {rs.TAG_SWEEP_STATE: "running"})
        return experiment_id, parent.info.run_id
    tags = {
        rs.TAG_SPEC_HASH: spec.spec_hash(),
        rs.TAG_SPEC_NAME: spec.name,
        rs.TAG_CORPUS: spec.data.corpus,
        rs.TAG_SWEEP_STATE: "running",
        **_git_tags(),
        **_version_tags(),
        **host_tags(),
        **_override_tags(overrides),
    }
    parent_run_id = tracker.start_sweep(experiment_id, f"sweep-{spec.name}", tags)
    # The spec with its overrides applied, with no password of a tracking URI in it (artifacts
    # are readable by everyone who can read the experiment).
    tracker.log_text(
        parent_run_id, mask_secrets(effective_spec_text(spec_path, overrides)), rs.ARTIFACT_SPEC
    )
    return experiment_id, parent_run_id


def _predictions_table(evaluation, labels: tuple[str, ...]) -> bytes:
    frame = pd.DataFrame(
        {
            "index": range(len(evaluation.gold)),
            "label": evaluation.gold,
            "prediction": evaluation.predictions,
            "label_name": [labels[i] for i in evaluation.gold],
        }
    )
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _test_evaluation(spec, config, data, trainer, outcome: TrialOutcome):
    """The protocol's test evaluation (search.protocol): the best-dev weights, or a refit."""
    if spec.search.protocol.refit_on_train_dev:
        return refit_and_test(config, data, int(outcome.metrics["best_epoch"]))[1]
    return trainer.evaluate_best("test")


def _evaluate_selected(
    tracker: Tracker,
    spec: SweepSpec,
    data: PreparedData,
    outcome: TrialOutcome,
    run_id: str,
) -> float:
    """Test accuracy of one seed of the selected configuration, from its best-on-dev weights."""
    config = apply_hyperparameters(spec.base_config(), outcome.params)
    config = config.model_copy(update={"training": config.training.model_copy(update={"device": "auto"})})
    trainer = make_trainer(config, data)
    with outcome.local_checkpoint() as directory:
        trainer.load_checkpoint(directory)
    evaluation = _test_evaluation(spec, config, data, trainer, outcome)
    dev = trainer.evaluate_best("dev")
    metrics = {rs.METRIC_TEST_ACCURACY: evaluation.accuracy}
    metrics.update({rs.CLASS_ACCURACY_PREFIX + k: v for k, v in evaluation.class_accuracy.items()})
    metrics.update({rs.DEV_CLASS_ACCURACY_PREFIX + k: v for k, v in dev.class_accuracy.items()})
    tracker.log_metrics(run_id, metrics)
    tracker.log_bytes(run_id, _predictions_table(evaluation, data.labels), rs.ARTIFACT_TEST_PREDICTIONS)
    tracker.set_tags(run_id, {rs.TAG_SELECTED: "true"})
    return evaluation.accuracy


def apply_paper_protocol(
    tracker: Tracker,
    spec: SweepSpec,
    data: PreparedData,
    outcomes: list[TrialOutcome],
    run_ids: dict[str, str],
    full_params: dict[str, dict],
    parent_run_id: str,
) -> tuple[float | None, float | None]:
    """Select on dev per model configuration; test only the selected configurations."""
    finished = [
        o for o in outcomes
        if o.error is None and "best_dev_accuracy" in o.metrics
        and rs.METRIC_DIVERGED_EPOCH not in o.metrics
    ]
    groups: dict[str, list[TrialOutcome]] = defaultdict(list)
    for outcome in finished:
        groups[rs.model_config_label(full_params[outcome.trial_id])].append(outcome)
    best_dev = best_test = None
    best_run = None
    for label, members in sorted(groups.items()):
        records = [
            TrialRecord(
                run_id=run_ids.get(o.trial_id, o.trial_id),
                config_key=config_key(full_params[o.trial_id]),
                model_config=label,
                params=full_params[o.trial_id],
                best_dev_accuracy=float(o.metrics["best_dev_accuracy"]),
                seed=int(full_params[o.trial_id].get("seed", 0)),
                status="FINISHED",
                theta_m=int(o.metrics["theta_m"]),
                epochs_trained=o.metrics.get("epoch"),
            )
            for o in members
        ]
        chosen = select_configuration(records)
        by_run = {record.run_id: o for record, o in zip(records, members, strict=True)}
        seeds = [by_run[r.run_id] for r in seed_runs(records) if r.config_key == chosen]
        dev = sum(o.metrics["best_dev_accuracy"] for o in seeds) / len(seeds)
        tests = []
        if "test" in data.splits:
            for outcome in seeds:
                if outcome.checkpoint is not None and outcome.trial_id in run_ids:
                    tests.append(_evaluate_selected(tracker, spec, data, outcome, run_ids[outcome.trial_id]))
        test = sum(tests) / len(tests) if tests else None
        print(f"selected on dev for {label}: {seeds[0].params} dev {dev:.4f}"
              + (f" test {test:.4f}" if test is not None else ""), file=sys.stderr)
        if best_dev is None or dev > best_dev:
            best_dev, best_test = dev, test
            best_run = max(seeds, key=lambda o: o.metrics["best_dev_accuracy"])
    if best_dev is not None:
        summary = {rs.METRIC_SWEEP_BEST_DEV_ACCURACY: best_dev}
        if best_test is not None:
            summary[rs.METRIC_SWEEP_TEST_ACCURACY] = best_test
        tracker.log_metrics(parent_run_id, summary)
        if best_run is not None and best_run.trial_id in run_ids:
            tracker.set_tags(parent_run_id, {rs.TAG_BEST_RUN: run_ids[best_run.trial_id]})
    return best_dev, best_test


def _close_runs(tracker: Tracker, experiment_id: str, parent_run_id: str, status: str) -> None:
    """No run of the sweep is left RUNNING: unfinished trials become KILLED (or resumable)."""
    for run in tracker.trial_runs(experiment_id, parent_run_id):
        if run.info.status == "RUNNING":
            tracker.terminate(run.info.run_id, "KILLED")
    tracker.terminate(parent_run_id, status)


def _describe_for_researchers(
    tracker: Tracker,
    spec: SweepSpec,
    spec_path: Path,
    data: PreparedData,
    experiment_id: str,
    parent_run_id: str,
    resume: bool,
) -> tuple[str, dict[str, str], dict]:
    """What the MLflow UI shows of the sweep: its summary and description, MLflow's source tags,
    the data and environment records, the dataset input. Returns the trials view's deep link,
    the source tags and the dataset input for the trial runs."""
    link = describe_sweep(tracker, spec, spec_path, experiment_id, parent_run_id, resume)
    sources = source_tags(spec_path, _git_tags()[rs.TAG_GIT_COMMIT])
    record = data_record(spec.data, data)
    dataset = dataset_input(record, data_digest(record))
    if not resume:
        tracker.set_tags(parent_run_id, sources)
        device = spec.training.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() and spec.search.resources.gpu else "cpu"
        log_provenance(tracker, parent_run_id, record, environment_record(device))
        log_dataset(tracker, parent_run_id, dataset)
    print(
        f"trials in the MLflow UI (`orchestrate ui`), best on dev first: {link}\n"
        f"hyperparameters against dev accuracy: {link}&compareRunsMode=CHART",
        file=sys.stderr,
    )
    return link, sources, dataset


def _link_best(
    tracker: Tracker,
    spec: SweepSpec,
    spec_path: Path,
    experiment_id: str,
    parent_run_id: str,
    best_dev: float | None,
    best_test: float | None,
) -> None:
    best_run = tracker.client.get_run(parent_run_id).data.tags.get(rs.TAG_BEST_RUN)
    if best_run is None or best_dev is None:
        return
    name = tracker.client.get_run(best_run).info.run_name
    test = "" if best_test is None else f", test {best_test:.2%}"
    summary = f"{name}: dev {best_dev:.2%}{test}"
    describe_best(tracker, spec, spec_path, experiment_id, parent_run_id, best_run, summary)


def _log_analysis(tracker: Tracker, experiment_id: str, parent_run_id: str) -> None:
    """Hyperparameter importance, parallel coordinates, EVP and the top learning curves of the
    experiment's finished trials, logged to the parent under analysis/ (what `orchestrate
    results --analysis` writes). An analysis that fails costs a warning, never the sweep."""
    from results.analysis import analysis_files, importance_table, top_trials
    from results.files import write_output
    from results.tracking import load_trials, metric_histories

    try:
        experiment = tracker.client.get_experiment(experiment_id)
        trials = load_trials(tracker.client, [experiment])
        top = top_trials(trials, experiment.name)
        histories = metric_histories(
            tracker.client, [t.record.run_id for t in top], rs.METRIC_DEV_ACCURACY
        )
        with tempfile.TemporaryDirectory() as folder:
            files = analysis_files(
                trials, importance_table(trials), histories, experiment.name, Path(folder)
            )
            for path, content in files:
                write_output(path, content)
            tracker.client.log_artifacts(parent_run_id, folder, rs.ARTIFACT_ANALYSIS_DIR)
    except Exception as exc:  # the sweep's results stand without the analysis
        print(f"warning: the sweep analysis was not logged: {exc}", file=sys.stderr)


def run_sweep(
    spec_path: str | Path,
    resume: bool = False,
    new: bool = False,
    verbose: int = 0,
    address: str | None = None,
    overrides: Overrides | None = None,
    tracking_uri: str | None = None,
) -> SweepSummary:
    # Every check of the input runs before the first write (issue 14): addresses and stores
    # answer within seconds, data and vectors are read, and the cluster can hold a trial.
    spec = load_spec(spec_path, overrides, tracking_uri)
    check_ray_address(address)
    tracker = Tracker(spec.tracking_uri)
    tracker.check_reachable()
    if resume and tracker.find_experiment(spec.name) is None:
        raise SweepExists(f"experiment {spec.name!r} holds no sweep to resume; drop --resume")
    data = prepare_data(spec.data)
    for configuration in spec.search.configurations or [{}]:
        check_fits_data(apply_hyperparameters(spec.base_config(), configuration), data)
    connected_here = init_ray(address, verbose=verbose > 0)
    try:
        check_resources(spec.search.resources.cpu, spec.search.resources.gpu)
    except InputError:
        if connected_here:
            shutdown_ray()
        raise
    experiment_id, parent_run_id = _open_parent(
        tracker, spec, Path(spec_path), resume, new, overrides
    )
    print(
        f"sweep {spec.name}: {spec.num_trials()} trials; MLflow {mask_secrets(spec.tracking_uri)} "
        f"experiment {experiment_id}, parent run {parent_run_id}",
        file=sys.stderr,
    )
    print(f"data: {data.describe()}", file=sys.stderr)
    link, sources, dataset = _describe_for_researchers(
        tracker, spec, Path(spec_path), data, experiment_id, parent_run_id, resume
    )
    base_params = logged_params(spec.base_config())
    recorder = SweepRecorder(
        tracker,
        experiment_id,
        parent_run_id,
        base_params=base_params,
        run_tags={rs.TAG_CORPUS: spec.data.corpus, **sources},
        spool_path=spool_file(spec.storage_path, parent_run_id),
        protocol=protocol_tags(spec.base_config(), data, spec.search.protocol.refit_on_train_dev),
        dataset=dataset,
    )
    finished_before = sum(
        run.info.status == "FINISHED" for run in tracker.trial_runs(experiment_id, parent_run_id)
    )
    progress = ProgressPrinter(
        spec.num_trials(), spec.search.metric, spec.search.mode, already_done=finished_before,
        epochs_per_trial=spec.training.epochs,
    )
    try:
        outcomes, complete = run_tuner(
            spec,
            data,
            f"{spec.name}-{parent_run_id[:8]}",
            [recorder, progress],
            resume=resume,
            verbose=min(verbose, 3),
        )
    finally:
        recorder.flush()
    recorder.upload_spool()  # after an outage: every trial run exists before the selection
    full_params = {o.trial_id: {**base_params, **o.params} for o in outcomes}
    planned = spec.search.time_budget_s is not None or len(outcomes) >= spec.num_trials()
    interrupted = not (complete and planned)
    failed = [o for o in outcomes if o.error is not None]
    diverged = [o for o in outcomes if o.error is None and rs.METRIC_DIVERGED_EPOCH in o.metrics]
    best_dev = best_test = None
    if not interrupted:  # test data is touched once, for the final selection only
        progress.phase(
            "trials ended; selecting on dev and evaluating the selected configuration on test"
        )
        best_dev, best_test = apply_paper_protocol(
            tracker, spec, data, outcomes, recorder.run_ids, full_params, parent_run_id
        )
    if not interrupted:
        _link_best(tracker, spec, Path(spec_path), experiment_id, parent_run_id, best_dev, best_test)
        _log_analysis(tracker, experiment_id, parent_run_id)
    print(f"trials in the MLflow UI, best on dev first: {link}", file=sys.stderr)
    state = "interrupted" if interrupted else "finished"
    tracker.set_tags(parent_run_id, {rs.TAG_SWEEP_STATE: state})
    _close_runs(tracker, experiment_id, parent_run_id, "KILLED" if state == "interrupted" else "FINISHED")
    if connected_here:
        shutdown_ray()
    return SweepSummary(
        experiment_id=experiment_id,
        parent_run_id=parent_run_id,
        trials=len(outcomes),
        failed=len(failed),
        diverged=len(diverged),
        best_dev_accuracy=best_dev,
        test_accuracy=best_test,
        interrupted=state == "interrupted",
    )
