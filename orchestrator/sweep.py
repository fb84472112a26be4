"""`orchestrate sweep`: validate, prepare data once, run Tune, then apply the paper protocol.

Paper protocol (Rocktäschel §3): within each model configuration pick the hyperparameters with
the best mean dev accuracy over seeds, and evaluate test data for that configuration alone.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd
import ray
import torch

from nli_models.config import Overrides
from nli_models.cpus import usable_cpus
from nli_models.data import PreparedData
from nli_models.errors import mask_secrets
from nli_models.training import make_trainer, refit_and_test
from orchestrator import extend as extension_of
from orchestrator.environment import trials_own_cores, users_wait_policy, wait_policy
from orchestrator.journal import Journal, journal_file
from orchestrator.lifecycle import (
    RUN_STATUS,
    Heartbeat,
    Interruption,
    SweepInterrupted,
    SweepState,
    TrialLedger,
    lease_tags,
)
from orchestrator.plan import check_input
from orchestrator.progress import ProgressPrinter
from orchestrator.provenance import data_digest, data_record, environment_record, git_state
from orchestrator.ray_adapter import (
    PriorTrials,
    TrialOutcome,
    check_resources,
    init_ray,
    joins_a_cluster,
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
    JournalUploader,
    SweepRecorder,
    Tracker,
    TrackingUnavailable,
    dataset_input,
    describe_best,
    describe_sweep,
    host_tags,
    log_dataset,
    log_provenance,
    protocol_tags,
    source_tags,
    ui_hint,
)
from orchestrator.warm_start import warm_start as warm_start_prior
from results import run_schema as rs
from results.selection import TrialRecord, seed_runs, select_configuration
from results.sweeps import observed_state


class SweepExists(RuntimeError):
    """The experiment already holds a sweep and neither --resume nor --new was given."""


@dataclass
class SweepSummary:
    experiment_id: str
    parent_run_id: str
    state: str  # completed | interrupted (a failure raises)
    planned: int
    done: int  # trial runs that ended (see lifecycle.TrialLedger)
    failed: int
    diverged: int  # trials stopped because their loss became NaN/inf (failed, never selected)
    best_dev_accuracy: float | None
    test_accuracy: float | None
    test_evaluation: int | None = None  # which test evaluation test_accuracy is (--extend: 2, ...)

    @property
    def interrupted(self) -> bool:
        return self.state == rs.SWEEP_INTERRUPTED

    @property
    def trials(self) -> int:
        return self.done + self.failed + self.diverged


def _diverged(run) -> bool:
    """A trial run stopped because its loss became NaN/inf (FAILED, never selected)."""
    return run.data.tags.get(rs.TAG_DIVERGED) == "true"


def trial_devices(trials) -> str:
    """The nli.trial_devices tag: each device the trial runs record, with how many trained on it."""
    counts = Counter(
        f"{run.data.tags[rs.TAG_DEVICE]} ({run.data.tags.get(rs.TAG_DEVICE_NAME, '?')})"
        for run in trials if rs.TAG_DEVICE in run.data.tags
    )
    return "; ".join(f"{device} x{count}" for device, count in sorted(counts.items())) or "none recorded"


def _git_tags() -> dict[str, str]:
    """The commit of the code that runs (this package's checkout), whatever the working folder."""
    commit, dirty = git_state(Path(__file__).resolve().parent)
    return {rs.TAG_GIT_COMMIT: commit, rs.TAG_GIT_DIRTY: "unknown" if dirty is None else str(dirty).lower()}


def _best_of(runs: list, metric: str, mode: str) -> float | None:
    """The best value of ``metric`` the trial runs reached (their best_<metric>, else its last)."""
    values = [
        run.data.metrics.get(f"best_{metric}", run.data.metrics.get(metric)) for run in runs
    ]
    values = [v for v in values if v is not None]
    return (max if mode == "max" else min)(values) if values else None


def _version_tags() -> dict[str, str]:
    return {
        "nli.ray_version": ray.__version__,
        "nli.torch_version": torch.__version__,
        "nli.python_version": platform.python_version(),
    }


def _override_tags(overrides: Overrides | None) -> dict[str, str]:
    return {rs.TAG_OVERRIDES: json.dumps(overrides.describe())} if overrides else {}


def _previous_sweep(tracker: Tracker, spec: SweepSpec, resume: bool, new: bool):
    """The sweep --resume continues (None: start one), read without writing anything.
    SweepExists when the user has to choose. A sweep that ended before its first trial (a
    failed start, a signal during start-up) is ignored: it never blocks the next attempt."""
    experiment_id = tracker.find_experiment(spec.name)
    previous = [] if experiment_id is None else [
        run for run in tracker.sweeps(experiment_id)
        if observed_state(run.data.tags) != rs.SWEEP_FAILED
        or tracker.trial_runs(experiment_id, run.info.run_id)
    ]
    if not previous:
        if resume:
            raise SweepExists(f"experiment {spec.name!r} holds no sweep to resume; drop --resume")
        return None
    latest = previous[0]
    run_id, state = latest.info.run_id, observed_state(latest.data.tags)
    if state == rs.SWEEP_RUNNING and not new:
        raise SweepExists(
            f"sweep run {run_id} of experiment {spec.name!r} is running (driver "
            f"{latest.data.tags.get(rs.TAG_DRIVER, '?')}); stop it first, or pass --new to start "
            "another sweep beside it"
        )
    if new:
        return None
    if state == rs.SWEEP_COMPLETED:
        raise SweepExists(
            f"experiment {spec.name!r} already holds completed sweep run {run_id}; nothing to "
            "--resume; pass --new to start another sweep beside it, or --extend to add trials to it"
        )
    if not resume:
        if not tracker.trial_runs(experiment_id, run_id):
            return None  # interrupted during start-up: nothing to continue or to lose
        raise SweepExists(
            f"experiment {spec.name!r} already holds sweep run {run_id} ({state}); pass --resume "
            "to continue it or --new to start another sweep beside it"
        )
    return latest


def _open_parent(
    tracker: Tracker, spec: SweepSpec, spec_path: Path, previous, overrides: Overrides | None,
    warm_tags: dict[str, str],
) -> tuple[str, str, SweepState]:
    """The parent run in state `planned` (a new sweep) or the resumed one, moved to `running`
    by the caller; returns (experiment id, parent run id, its state)."""
    if previous is not None:
        parent = previous
        if parent.data.tags.get(rs.TAG_SPEC_HASH) != spec.spec_hash():
            print(
                f"warning: {spec_path} changed since sweep {parent.info.run_id} started; "
                "resuming with the search recorded by Ray Tune",
                file=sys.stderr,
            )
        run_id = parent.info.run_id
        tracker.reopen(run_id)
        # A driver that died left `running` (or `planned`): what readers see is `interrupted`.
        state = SweepState(partial(tracker.set_tags, run_id), observed_state(parent.data.tags))
        return parent.info.experiment_id, run_id, state
    experiment_id = tracker.experiment_id(spec.name)
    tags = {
        rs.TAG_SPEC_HASH: spec.spec_hash(),
        rs.TAG_SPEC_NAME: spec.name,
        rs.TAG_CORPUS: spec.data.corpus,
        rs.TAG_SWEEP_STATE: rs.SWEEP_PLANNED,
        rs.TAG_PLANNED_TRIALS: str(spec.num_trials()),
        **lease_tags(),
        **_git_tags(),
        **_version_tags(),
        **host_tags(),
        **_override_tags(overrides),
        **warm_tags,
    }
    if spec.search.time_budget_s is not None:
        tags[rs.TAG_TIME_BUDGET] = str(spec.search.time_budget_s)
    parent_run_id = tracker.start_sweep(experiment_id, f"sweep-{spec.name}", tags)
    # The spec with its overrides applied, with no password of a tracking URI in it (artifacts
    # are readable by everyone who can read the experiment).
    tracker.log_text(
        parent_run_id, mask_secrets(effective_spec_text(spec_path, overrides)), rs.ARTIFACT_SPEC
    )
    return experiment_id, parent_run_id, SweepState(partial(tracker.set_tags, parent_run_id), rs.SWEEP_PLANNED)


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


@dataclass
class Selection:
    """The selection on dev and the test evaluation of a completed sweep, computed before any
    of it is recorded (record_selection writes it in one go)."""

    tested: dict[str, dict[str, float]] = field(default_factory=dict)  # run id -> test metrics
    selected: set[str] = field(default_factory=set)  # run ids of the selected configurations' seeds
    predictions: dict[str, bytes] = field(default_factory=dict)  # run id -> test predictions
    best_dev: float | None = None
    best_test: float | None = None
    best_run_id: str | None = None


def _test_evaluation(spec, config, data, trainer, outcome: TrialOutcome):
    """The protocol's test evaluation (search.protocol): the best-dev weights, or a refit on
    train + dev for the run's best epoch count. Returns it and, for a refit, its epochs (all
    phases) and wall time."""
    if spec.search.protocol.refit_on_train_dev:
        started = time.perf_counter()
        refit, evaluation = refit_and_test(config, data, int(outcome.metrics["best_epoch"]))
        return evaluation, {
            rs.METRIC_REFIT_EPOCHS: refit.state.epoch,
            rs.METRIC_REFIT_TIME: time.perf_counter() - started,
        }
    return trainer.evaluate_best("test"), {}


def _evaluate_selected(spec: SweepSpec, data: PreparedData, outcome: TrialOutcome) -> tuple[dict[str, float], bytes]:
    """Test metrics and predictions of one seed of the selected configuration (from its
    best-on-dev weights, or its refit: _test_evaluation)."""
    config = apply_hyperparameters(spec.base_config(), outcome.params)
    config = config.model_copy(update={"training": config.training.model_copy(update={"device": "auto"})})
    trainer = make_trainer(config, data)
    with outcome.local_checkpoint() as directory:
        trainer.load_checkpoint(directory)
    evaluation, refit = _test_evaluation(spec, config, data, trainer, outcome)
    dev = trainer.evaluate_best("dev")
    metrics = {rs.METRIC_TEST_ACCURACY: evaluation.accuracy, **refit}
    metrics.update({rs.CLASS_ACCURACY_PREFIX + k: v for k, v in evaluation.class_accuracy.items()})
    metrics.update({rs.DEV_CLASS_ACCURACY_PREFIX + k: v for k, v in dev.class_accuracy.items()})
    return metrics, _predictions_table(evaluation, data.labels)


def apply_paper_protocol(
    spec: SweepSpec,
    data: PreparedData,
    ended: list[TrialOutcome],
    run_ids: dict[str, str],
    full_params: dict[str, dict],
    interruption: Interruption,
    tested_before: dict[str, float] | None = None,
) -> Selection:
    """Select on dev per model configuration among the trials that ended; evaluate test data for
    the selected configurations only (a run in `tested_before`, run id -> test accuracy, is not
    evaluated again: --extend). Stops with SweepInterrupted if a signal comes meanwhile."""
    tested_before = tested_before or {}
    finished = [
        o for o in ended
        if o.error is None and "best_dev_accuracy" in o.metrics
        and rs.METRIC_DIVERGED_EPOCH not in o.metrics
    ]
    groups: dict[str, list[TrialOutcome]] = defaultdict(list)
    for outcome in finished:
        groups[rs.model_config_label(full_params[outcome.trial_id])].append(outcome)
    selection = Selection()
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
                    if interruption.requested:
                        raise SweepInterrupted("interrupted during the test evaluation")
                    run_id = run_ids[outcome.trial_id]
                    selection.selected.add(run_id)
                    if run_id in tested_before:
                        tests.append(tested_before[run_id])
                        continue
                    metrics, predictions = _evaluate_selected(spec, data, outcome)
                    selection.tested[run_id], selection.predictions[run_id] = metrics, predictions
                    tests.append(metrics[rs.METRIC_TEST_ACCURACY])
        test = sum(tests) / len(tests) if tests else None
        print(f"selected on dev for {label}: {seeds[0].params} dev {dev:.2%}"
              + (f" test {test:.2%}" if test is not None else ""), file=sys.stderr)
        if selection.best_dev is None or dev > selection.best_dev:
            selection.best_dev, selection.best_test = dev, test
            best_run = max(seeds, key=lambda o: o.metrics["best_dev_accuracy"])
            selection.best_run_id = run_ids.get(best_run.trial_id)
    if interruption.requested:
        raise SweepInterrupted("interrupted during the selection")
    return selection


def record_selection(tracker: Tracker, parent_run_id: str, selection: Selection) -> None:
    for run_id, metrics in selection.tested.items():
        tracker.log_metrics(run_id, metrics)
        tracker.log_bytes(run_id, selection.predictions[run_id], rs.ARTIFACT_TEST_PREDICTIONS)
        tracker.set_tags(run_id, {rs.TAG_SELECTED: "true"})
    if selection.best_dev is not None:
        summary = {rs.METRIC_SWEEP_BEST_DEV_ACCURACY: selection.best_dev}
        if selection.best_test is not None:
            summary[rs.METRIC_SWEEP_TEST_ACCURACY] = selection.best_test
        refit = selection.tested.get(selection.best_run_id or "", {})
        for metric, summary_metric in (
            (rs.METRIC_REFIT_EPOCHS, rs.METRIC_SWEEP_REFIT_EPOCHS),
            (rs.METRIC_REFIT_TIME, rs.METRIC_SWEEP_REFIT_TIME),
        ):
            if metric in refit:
                summary[summary_metric] = refit[metric]
        tracker.log_metrics(parent_run_id, summary)
    if selection.best_run_id is not None:
        tracker.set_tags(parent_run_id, {rs.TAG_BEST_RUN: selection.best_run_id})


def _close_runs(tracker: Tracker, experiment_id: str, parent_run_id: str, state: SweepState, target: str) -> None:
    """No run of the sweep is left RUNNING: unfinished trials become KILLED (resumable); the
    parent takes `target`'s state and MLflow status."""
    for run in tracker.trial_runs(experiment_id, parent_run_id):
        if run.info.status == "RUNNING":
            tracker.terminate(run.info.run_id, "KILLED")
    state.move(target)
    tracker.terminate(parent_run_id, RUN_STATUS[target])


def _describe_for_researchers(
    tracker: Tracker,
    spec: SweepSpec,
    spec_path: Path,
    data: PreparedData,
    experiment_id: str,
    parent_run_id: str,
    resume: bool,
) -> tuple[dict[str, str], dict]:
    """What the MLflow UI shows of the sweep: its summary and description, MLflow's source tags,
    the data and environment records, the dataset input. Returns the source tags and the
    dataset input for the trial runs."""
    describe_sweep(tracker, spec, spec_path, experiment_id, parent_run_id, resume)
    sources = source_tags(spec_path, _git_tags()[rs.TAG_GIT_COMMIT])
    record = data_record(spec.data, data)
    dataset = dataset_input(record, data_digest(record))
    if not resume:
        tracker.set_tags(parent_run_id, sources)
        # The driver's host and what the spec asks; what each trial really trained on is its
        # own record (nli.device), counted on the parent once the trials ended (nli.trial_devices).
        requested = {"training_device": spec.training.device, **spec.search.resources.model_dump()}
        log_provenance(tracker, parent_run_id, record, environment_record(requested))
        log_dataset(tracker, parent_run_id, dataset)
    print(ui_hint(tracker.tracking_uri, experiment_id), file=sys.stderr)
    return sources, dataset


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


TEST_DELAY_ENV = "NLI_TEST_EVALUATION_DELAY_S"  # lifecycle tests: a signal lands during selection


def _test_evaluation_delay(interruption: Interruption) -> None:
    deadline = time.monotonic() + float(os.environ.get(TEST_DELAY_ENV) or 0)
    while time.monotonic() < deadline and not interruption.requested:
        time.sleep(0.1)


def run_sweep(
    spec_path: str | Path,
    resume: bool = False,
    new: bool = False,
    verbose: int = 0,
    address: str | None = None,
    overrides: Overrides | None = None,
    tracking_uri: str | None = None,
    wait_for_resources_s: float | None = None,
    warm_start: str | None = None,
    extend: bool = False,
) -> SweepSummary:
    """Run a sweep through its lifecycle (orchestrator/lifecycle.py). Everything that can be
    checked is checked before the parent run exists; SIGINT/SIGTERM end it `interrupted`.
    `wait_for_resources_s`: how long a cluster may take to add a node that holds a trial
    (ray_adapter.check_resources; None: its default). `warm_start`: an experiment whose finished
    trials seed the sampler of this new sweep (orchestrator/warm_start.py); `extend`: add the
    spec's new trials to the experiment's completed sweep (orchestrator/extend.py)."""
    with Interruption() as interruption:
        try:
            return _run_sweep(
                Path(spec_path), resume, new, verbose, address, interruption, overrides, tracking_uri,
                wait_for_resources_s, warm_start, extend,
            )
        except SweepInterrupted:
            if interruption.armed:
                raise  # recorded by _drive
            raise SweepInterrupted("interrupted before the sweep started; nothing was recorded") from None


def trials_wait_policy(spec: SweepSpec, address: str | None) -> str | None:
    """The OMP_WAIT_POLICY the trials' processes get (orchestrator/environment.py); None when the
    user set one (their environment carries it). The CPUs of a local Ray are this process's."""
    if users_wait_policy():
        return None
    node_cpus = None if joins_a_cluster(address) else usable_cpus()
    resources = spec.search.resources
    return wait_policy(trials_own_cores(resources.cpu, spec.search.max_concurrent_trials, node_cpus))


def _run_sweep(spec_path: Path, resume: bool, new: bool, verbose: int, address: str | None,
               interruption: Interruption, overrides: Overrides | None,
               tracking_uri: str | None, wait_for_resources_s: float | None,
               warm_start: str | None, extend: bool) -> SweepSummary:
    # Every check of the input runs before the first write: addresses and stores answer within
    # seconds, data and vectors are read, and the cluster can hold a trial.
    spec = load_spec(spec_path, overrides, tracking_uri)
    data = check_input(spec, address)  # what `validate` checks too
    tracker = Tracker(spec.tracking_uri)  # creates a new store: only once the input is known good
    tracker.check_reachable()
    prior, warm_tags, extension = None, {}, None
    if warm_start is not None:  # a new sweep beside any other, as with --new
        prior, source = warm_start_prior(tracker, spec, warm_start)
        warm_tags = {rs.TAG_WARM_START: source, rs.TAG_WARM_START_CONFIGURATIONS: str(len(prior.points))}
    previous = (extension_of.completed_sweep(tracker, spec) if extend
                else _previous_sweep(tracker, spec, resume, new or warm_start is not None))
    if extend or (previous is not None and rs.TAG_EXTENSIONS in previous.data.tags):
        extension = extension_of.plan_extension(tracker, spec, previous, resuming=not extend)
        prior = extension.prior
    policy = trials_wait_policy(spec, address)
    connected_here = init_ray(address, verbose=verbose > 0, wait_policy=policy)
    try:
        check_resources(spec.search.resources.cpu, spec.search.resources.gpu, wait_for_resources_s)
        if extend:
            experiment_id, parent_run_id = previous.info.experiment_id, previous.info.run_id
            state = extension_of.open_extension(tracker, spec, spec_path, previous, overrides, extension)
        else:
            experiment_id, parent_run_id, state = _open_parent(
                tracker, spec, spec_path, previous, overrides, warm_tags
            )
        interruption.arm()
        print(
            f"sweep {spec.name}: {spec.num_trials()} trials; MLflow {mask_secrets(spec.tracking_uri)} "
            f"experiment {experiment_id}, parent run {parent_run_id}",
            file=sys.stderr,
        )
        print(f"data: {data.describe()}", file=sys.stderr)
        with Heartbeat(partial(tracker.set_tags, parent_run_id)):
            return _drive(spec, spec_path, data, tracker, experiment_id, parent_run_id, state,
                          resumed=previous is not None, verbose=verbose, interruption=interruption,
                          prior=prior, extension=extension)
    finally:
        if connected_here:
            shutdown_ray()


def _drive(spec: SweepSpec, spec_path: Path, data: PreparedData, tracker: Tracker,
           experiment_id: str, parent_run_id: str, state: SweepState, resumed: bool,
           verbose: int, interruption: Interruption, prior: PriorTrials | None = None,
           extension: extension_of.Extension | None = None) -> SweepSummary:
    """From `running` to a final state; every way out leaves no run RUNNING."""
    planned = spec.num_trials()
    tracker.set_tags(parent_run_id, {rs.TAG_PLANNED_TRIALS: str(planned), **lease_tags()})
    base_params = logged_params(spec.base_config())

    def summary(final: str, selection: Selection | None = None, evaluation: int | None = None) -> SweepSummary:
        trials = tracker.trial_runs(experiment_id, parent_run_id)
        return SweepSummary(
            experiment_id=experiment_id,
            parent_run_id=parent_run_id,
            state=final,
            planned=planned,
            done=sum(run.info.status == "FINISHED" for run in trials),
            failed=sum(run.info.status == "FAILED" and not _diverged(run) for run in trials),
            diverged=sum(_diverged(run) for run in trials),
            best_dev_accuracy=selection.best_dev if selection else None,
            test_accuracy=selection.best_test if selection else None,
            test_evaluation=evaluation,
        )

    def end_interrupted() -> SweepSummary:
        with interruption.deferred():
            _close_runs(tracker, experiment_id, parent_run_id, state, rs.SWEEP_INTERRUPTED)
        return summary(rs.SWEEP_INTERRUPTED)

    sources, dataset = _describe_for_researchers(
        tracker, spec, spec_path, data, experiment_id, parent_run_id, resumed
    )
    # One tracking path: events go to the journal (a resumed sweep reads what it holds), the
    # uploader ships them; the test metrics and states below are written directly, after it drained.
    journal = Journal(journal_file(spec.storage_path, parent_run_id), experiment_id, parent_run_id)
    uploader = JournalUploader(tracker, journal.path)
    uploader.start(journal)
    recorder = SweepRecorder(
        journal,
        base_params=base_params,
        run_tags={rs.TAG_CORPUS: spec.data.corpus, **sources},
        protocol=protocol_tags(spec.base_config(), data, spec.search.protocol.refit_on_train_dev),
        dataset=dataset,
    )
    try:
        uploader.drain()  # a resumed sweep's earlier trials are in the store before they are counted
        finished_before = [
            run for run in tracker.trial_runs(experiment_id, parent_run_id) if run.info.status == "FINISHED"
        ]
        progress = ProgressPrinter(
            planned, spec.search.metric, spec.search.mode, already_done=len(finished_before),
            epochs_per_trial=spec.training.epochs,
            best_so_far=_best_of(finished_before, spec.search.metric, spec.search.mode),
        )
        ledger = TrialLedger([recorder, progress], interruption, spec.search.time_budget_s)

        def on_tune_stop(stop) -> None:  # a signal or the time budget stops the fit
            ledger.on_tune_stop(stop)
            interruption.on_tune_stop(stop)

        state.move(rs.SWEEP_RUNNING)
        tune_name = extension_of.tune_experiment(spec.name, parent_run_id, extension.index if extension else 0)
        outcomes = run_tuner(spec, data, tune_name, [ledger], resume=resumed, verbose=min(verbose, 3),
                             on_stop=on_tune_stop, prior=prior)
        uploader.drain()  # every trial run is in the store before the selection reads it
        trials = tracker.trial_runs(experiment_id, parent_run_id)
        tracker.set_tags(parent_run_id, {rs.TAG_TRIAL_DEVICES: trial_devices(trials)})
        run_ids = {run.data.tags.get(rs.TAG_TRIAL_ID): run.info.run_id for run in trials}
        ended = {run.data.tags.get(rs.TAG_TRIAL_ID) for run in trials if run.info.status in ("FINISHED", "FAILED")}
        # A budget that ran out before any trial ended leaves nothing to complete: resumable.
        complete = len(ended) >= planned or (ledger.budget_spent() and bool(ended))
        if ledger.budget_spent() and not ended and not interruption.requested:
            progress.phase(f"the time budget (search.time_budget_s {spec.search.time_budget_s:g} s "
                           "from the first trial's start) ran out before any trial ended")
        if interruption.requested or not complete:
            return end_interrupted()
        finished = {run.data.tags.get(rs.TAG_TRIAL_ID) for run in trials if run.info.status == "FINISHED"}
        progress.phase(
            f"{len(ended)} trials ended; selecting on dev, then evaluating the selected "
            "configuration on test" if finished else
            f"{len(ended)} trials ended, none finished (failed or diverged): nothing to select"
        )
        _test_evaluation_delay(interruption)
        if extension is not None:
            outcomes += extension_of.earlier_outcomes(spec, data, parent_run_id, extension, trials)
        full_params = {o.trial_id: {**base_params, **o.params} for o in outcomes}
        # Test data is touched once, for the final selection, computed before anything is recorded.
        selection = apply_paper_protocol(
            spec, data, [o for o in outcomes if o.trial_id in finished], run_ids, full_params, interruption,
            tested_before=extension.tested if extension else None,
        )
        with interruption.deferred():
            if extension is None:
                record_selection(tracker, parent_run_id, selection)
                evaluation = 1 if selection.tested else None
            else:
                evaluation = extension_of.record_evaluation(tracker, parent_run_id, selection, extension)
            _close_runs(tracker, experiment_id, parent_run_id, state, rs.SWEEP_COMPLETED)
        _link_best(tracker, spec, spec_path, experiment_id, parent_run_id,
                   selection.best_dev, selection.best_test)
        _log_analysis(tracker, experiment_id, parent_run_id)
        print(ui_hint(tracker.tracking_uri, experiment_id), file=sys.stderr)
        return summary(rs.SWEEP_COMPLETED, selection, evaluation)
    except BaseException as exc:
        with contextlib.suppress(TrackingUnavailable):
            uploader.drain()  # what the trials recorded is in the store before they are closed
        if isinstance(exc, SweepInterrupted) or interruption.aborted:
            return end_interrupted()
        with contextlib.suppress(Exception):
            _close_runs(tracker, experiment_id, parent_run_id, state, rs.SWEEP_FAILED)
        raise
    finally:
        uploader.stop()
        journal.close()
