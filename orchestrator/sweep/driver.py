"""`orchestrate sweep`: validate, prepare data once, run Tune, then apply the paper protocol.

Paper protocol (Rocktäschel §3): within each model configuration pick the hyperparameters with
the best mean dev accuracy over seeds, and evaluate test data for that configuration alone.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nli_models.config import Overrides
from nli_models.cpus import usable_cpus
from nli_models.data import PreparedData
from nli_models.errors import mask_secrets
from nli_models.training import make_trainer, refit_and_test
from nli_models.training.refit import refit_epochs
from orchestrator.journal.operations import Journal, journal_file
from orchestrator.journal.parent_records import (
    SweepSummary,
    best_of,
    count_trials,
    describe_for_researchers,
    log_analysis,
    open_parent,
    previous_sweep,
    record_selection,
    record_spec,
    trial_devices,
    trials_with_status,
    upload_finished,
)
from orchestrator.journal.recorder import SweepLog, SweepRecorder, protocol_tags
from orchestrator.journal.resume import check_resumable, resume_from_journal
from orchestrator.ray_adapter.ray_runtime import (
    check_resources,
    init_ray,
    joins_a_cluster,
    shutdown_ray,
)
from orchestrator.ray_adapter.ray_search import PriorTrials
from orchestrator.ray_adapter.tuner import TrialOutcome, run_tuner
from orchestrator.sweep import extend as extension_of
from orchestrator.sweep.environment import trials_own_cores, users_wait_policy, wait_policy
from orchestrator.sweep.lifecycle import (
    Heartbeat,
    Interruption,
    SweepInterrupted,
    SweepState,
    TrialLedger,
    lease_tags,
)
from orchestrator.sweep.plan import check_input, check_local_capacity
from orchestrator.sweep.progress import ProgressPrinter
from orchestrator.sweep.spec import (
    SweepSpec,
    apply_hyperparameters,
    config_key,
    load_spec,
    logged_params,
)
from orchestrator.sweep.warm_start import warm_start as warm_start_prior
from orchestrator.tracking.run_view import ui_hint
from orchestrator.tracking.tracker import Tracker
from orchestrator.tracking.uploader import JournalUploader
from results import run_schema as rs
from results.selection import FINISHED, SELECTION_RULE, seed_runs, select_configuration
from results.tracking_uri import missing_store


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
    selected: set[str] = field(default_factory=set)  # the selected configurations' seeds (ids as in tested)
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
        refit, evaluation = refit_and_test(
            config, data, outcome.result.best_epoch, _refit_progress(config, data, outcome, started)
        )
        return evaluation, {
            rs.METRIC_REFIT_EPOCHS: refit.state.epoch,
            rs.METRIC_REFIT_TIME: time.perf_counter() - started,
        }
    return trainer.evaluate_best("test"), {}


def _refit_progress(config, data, outcome: TrialOutcome, started: float):
    """A line per refit epoch on stderr, so that minutes of refit are not silent."""
    total = refit_epochs(config, outcome.result.best_epoch)
    pairs = len(data.splits["train"]) + len(data.splits["dev"])
    print(f"refit of {outcome.params} on train + dev ({pairs:,} pairs): {total} epochs "
          f"(the selection run's best epoch {outcome.result.best_epoch}), then test", file=sys.stderr)

    def progress(trainer, result) -> None:
        elapsed = time.perf_counter() - started
        left = elapsed / result.epoch * (total - result.epoch)
        print(f"  refit epoch {result.epoch}/{total}: {elapsed:.0f} s, about {left:.0f} s left",
              file=sys.stderr)

    return progress


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
    the selected configurations only (a trial in `tested_before`, trial id -> test accuracy, is
    not evaluated again: --extend). Stops with SweepInterrupted if a signal comes meanwhile; what
    was selected and tested is printed only once the whole selection completed (an interrupted
    one records no test metric, so shows none)."""
    tested_before = tested_before or {}
    finished = [
        o for o in ended
        if o.error is None and o.result.best_dev_accuracy is not None
        and rs.METRIC_DIVERGED_EPOCH not in o.metrics
    ]
    groups: dict[str, list[TrialOutcome]] = defaultdict(list)
    for outcome in finished:
        groups[rs.model_config_label(full_params[outcome.trial_id])].append(outcome)
    selection = Selection()
    selected_lines = []
    if groups:
        print(f"selection rule: {SELECTION_RULE}", file=sys.stderr)
    for label, members in sorted(groups.items()):
        records = [
            o.result.record(
                run_id=run_ids.get(o.trial_id, o.trial_id),
                config_key=config_key(full_params[o.trial_id]),
                model_config=label,
                params=full_params[o.trial_id],
                status=FINISHED,
            )
            for o in members
        ]
        chosen = select_configuration(records)
        by_run = {record.run_id: o for record, o in zip(records, members, strict=True)}
        seeds = [by_run[r.run_id] for r in seed_runs(records) if r.config_key == chosen]
        dev = sum(o.result.best_dev_accuracy for o in seeds) / len(seeds)
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
        selected_lines.append(f"selected on dev for {label}: {seeds[0].params} dev {dev:.2%}"
                              + (f" test {test:.2%}" if test is not None else ""))
        if selection.best_dev is None or dev > selection.best_dev:
            selection.best_dev, selection.best_test = dev, test
            best_run = max(seeds, key=lambda o: o.result.best_dev_accuracy)
            selection.best_run_id = run_ids.get(best_run.trial_id)
    if interruption.requested:
        raise SweepInterrupted("interrupted during the selection")
    for line in selected_lines:
        print(line, file=sys.stderr)
    return selection


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
    spec: SweepSpec | None = None,
    ray_start_timeout_s: float | None = None,
) -> SweepSummary:
    """Run a sweep through its lifecycle (orchestrator/sweep/lifecycle.py). Everything that can be
    checked is checked before the parent run exists; SIGINT/SIGTERM end it `interrupted`.
    `spec`: what load_spec(spec_path, overrides, tracking_uri) returned, when the caller has read
    it already (the CLI does, before this module's imports); None: read here.
    `wait_for_resources_s`: how long a cluster may take to add a node that holds a trial
    (ray_runtime.check_resources; None: its default). `warm_start`: an experiment whose finished
    trials seed the sampler of this new sweep (orchestrator/sweep/warm_start.py); `extend`: add the
    spec's new trials to the experiment's completed sweep (orchestrator/sweep/extend.py).
    `ray_start_timeout_s`: how long Ray's start may take (ray_runtime.init_ray; None: its
    default)."""
    with Interruption() as interruption:
        try:
            return _run_sweep(
                Path(spec_path), resume, new, verbose, address, interruption, overrides, tracking_uri,
                wait_for_resources_s, warm_start, extend, spec, ray_start_timeout_s,
            )
        except SweepInterrupted:
            if interruption.armed:
                raise  # recorded by _drive
            raise SweepInterrupted("interrupted before the sweep started; nothing was recorded") from None


def trials_wait_policy(spec: SweepSpec, address: str | None) -> str | None:
    """The OMP_WAIT_POLICY the trials' processes get (orchestrator/sweep/environment.py); None when the
    user set one (their environment carries it). The CPUs of a local Ray are this process's."""
    if users_wait_policy():
        return None
    node_cpus = None if joins_a_cluster(address) else usable_cpus()
    resources = spec.search.resources
    return wait_policy(trials_own_cores(resources.cpu, spec.search.max_concurrent_trials, node_cpus))


def _run_sweep(spec_path: Path, resume: bool, new: bool, verbose: int, address: str | None,
               interruption: Interruption, overrides: Overrides | None,
               tracking_uri: str | None, wait_for_resources_s: float | None,
               warm_start: str | None, extend: bool, spec: SweepSpec | None,
               ray_start_timeout_s: float | None) -> SweepSummary:
    # Every check of the input runs before the first write: addresses and stores answer within
    # seconds, data and vectors are read, and the cluster can hold a trial.
    spec = spec or load_spec(spec_path, overrides, tracking_uri)
    data = check_input(spec, address)  # what `validate` checks too
    if not joins_a_cluster(address):
        check_local_capacity(spec)  # refused before Ray starts (check_resources would, after)
    with contextlib.ExitStack() as ray_session:

        def start_ray() -> None:
            if init_ray(address, verbose=verbose > 0, wait_policy=trials_wait_policy(spec, address),
                        start_timeout_s=ray_start_timeout_s):
                ray_session.callback(shutdown_ray)
            check_resources(spec.search.resources.cpu, spec.search.resources.gpu, wait_for_resources_s)

        # A new local store is created only once Ray has started and holds a trial: a failed start
        # leaves nothing behind. An existing store is read first: a sweep it refuses (one exists,
        # nothing to resume) is refused without Ray's start.
        new_store = missing_store(spec.tracking_uri) is not None
        if new_store:
            start_ray()
        tracker = Tracker(spec.tracking_uri)  # creates a new store
        tracker.check_reachable()
        prior, warm_tags, extension = None, {}, None
        if warm_start is not None:  # a new sweep beside any other, as with --new
            prior, source = warm_start_prior(tracker, spec, warm_start)
            warm_tags = {rs.TAG_WARM_START: source, rs.TAG_WARM_START_CONFIGURATIONS: str(len(prior.points))}
        previous = (extension_of.completed_sweep(tracker, spec) if extend
                    else previous_sweep(tracker, spec, resume, new or warm_start is not None))
        if extend or (previous is not None and rs.TAG_EXTENSIONS in previous.data.tags):
            extension = extension_of.plan_extension(tracker, spec, previous, resuming=not extend)
            prior = extension.prior
        # Tune's state of the resumed sweep torn or missing: it goes on from its journal. (An
        # extension runs a Tune experiment of its own: extend.tune_experiment.)
        tune_problem = None if extend else check_resumable(spec, previous.info.run_id if previous is not None else None)
        if not new_store:
            start_ray()
        return _open_and_drive(spec, spec_path, data, tracker, previous, overrides, warm_tags, extend,
                               extension, prior, tune_problem, verbose, interruption)


def _open_and_drive(spec: SweepSpec, spec_path: Path, data: PreparedData, tracker: Tracker, previous,
                    overrides: Overrides | None, warm_tags: dict[str, str], extend: bool,
                    extension: extension_of.Extension | None, prior: PriorTrials | None,
                    tune_problem: str | None, verbose: int, interruption: Interruption) -> SweepSummary:
    """Every check passed and Ray runs: the parent run is opened (or reopened) and the sweep driven
    through the journal and its uploader."""
    if extend:  # the completed parent run, reopened by the move to `running` (_drive)
        experiment_id, parent_run_id = previous.info.experiment_id, previous.info.run_id
        current = rs.SWEEP_COMPLETED
    else:
        experiment_id, parent_run_id, current = open_parent(
            tracker, spec, spec_path, previous, overrides, warm_tags
        )
    # From here every write is a journal append (recorder.SweepLog); one uploader applies them.
    journal = Journal(journal_file(spec.storage_path, parent_run_id), experiment_id, parent_run_id)
    log = SweepLog(journal)
    uploader = JournalUploader(tracker, journal.path)
    uploader.start(journal)
    try:
        if extend:
            extension_of.open_extension(log, spec, spec_path, overrides, extension)
        elif previous is None:
            record_spec(log, spec_path, overrides)
        interruption.arm()
        print(
            f"sweep {spec.name}: {spec.num_trials()} trial{'s' * (spec.num_trials() != 1)}; MLflow {mask_secrets(spec.tracking_uri)} "
            f"experiment {experiment_id}, parent run {parent_run_id}",
            file=sys.stderr,
        )
        print(f"data: {data.describe()}", file=sys.stderr)
        with Heartbeat(log.add):
            outcome = _drive(spec, spec_path, data, tracker, journal, SweepState(log.state, current),
                             resumed=previous is not None, verbose=verbose, interruption=interruption,
                             prior=prior, extension=extension, tune_problem=tune_problem)
        # The store may be away until the end: the outcome stands, the journal keeps the rest.
        if upload_finished(uploader) and outcome.state == rs.SWEEP_COMPLETED:
            _log_analysis(tracker, log, experiment_id)
            upload_finished(uploader)
        return outcome
    except BaseException:
        with contextlib.suppress(BaseException):
            upload_finished(uploader)  # what was recorded is in the store before the error shows
        raise
    finally:
        uploader.stop()
        journal.close()


_log_analysis = log_analysis  # a module attribute: benchmarks/scale_cluster.py replaces it


def _drive(spec: SweepSpec, spec_path: Path, data: PreparedData, tracker: Tracker, journal: Journal,
           state: SweepState, resumed: bool, verbose: int, interruption: Interruption,
           prior: PriorTrials | None = None, extension: extension_of.Extension | None = None,
           tune_problem: str | None = None) -> SweepSummary:
    """From `running` to a final state, counting and selecting from the journal (what the driver
    recorded), never from the store; every way out leaves no run RUNNING (lifecycle.SweepState:
    a final state closes the trial runs still RUNNING). `prior`: what the sampler is told of
    earlier trials (--warm-start, --extend); `extension`: the extension this run is (--extend)."""
    log = SweepLog(journal)
    experiment_id, parent_run_id = journal.experiment_id, journal.parent_run_id
    planned = spec.num_trials()
    log.add(tags={rs.TAG_PLANNED_TRIALS: str(planned), **lease_tags()})
    base_params = logged_params(spec.base_config())

    def summary(final: str, selection: Selection | None = None, evaluation: int | None = None) -> SweepSummary:
        done, failed, diverged = count_trials(journal)
        return SweepSummary(
            experiment_id=experiment_id,
            parent_run_id=parent_run_id,
            state=final,
            planned=planned,
            done=done,
            failed=failed,
            diverged=diverged,
            best_dev_accuracy=selection.best_dev if selection else None,
            test_accuracy=selection.best_test if selection else None,
            test_evaluation=evaluation,
        )

    def end_interrupted() -> SweepSummary:
        with interruption.deferred():
            state.move(rs.SWEEP_INTERRUPTED)
        return summary(rs.SWEEP_INTERRUPTED)

    sources, dataset = describe_for_researchers(log, spec, spec_path, data, experiment_id, resumed)
    print(ui_hint(tracker.tracking_uri, experiment_id), file=sys.stderr)
    recorder = SweepRecorder(
        journal,
        base_params=base_params,
        run_tags={rs.TAG_CORPUS: spec.data.corpus, **sources},
        protocol=protocol_tags(spec.base_config(), data, spec.search.protocol.refit_on_train_dev),
        dataset=dataset,
    )
    try:
        finished_before = trials_with_status(journal, "FINISHED")  # a resumed sweep's
        progress = ProgressPrinter(
            planned, spec.search.metric, spec.search.mode, finished_before=finished_before,
            epochs_per_trial=spec.training.epochs,
            best_so_far=best_of(finished_before.values(), spec.search.metric, spec.search.mode),
        )
        ledger = TrialLedger([recorder, progress], interruption, spec.search.time_budget_s)

        def on_tune_stop(stop) -> None:  # a signal or the time budget stops the fit
            ledger.on_tune_stop(stop)
            interruption.on_tune_stop(stop)

        state.move(rs.SWEEP_RUNNING)
        if tune_problem is None:
            tune_name = extension_of.tune_experiment(spec.name, parent_run_id, extension.index if extension else 0)
            outcomes = run_tuner(spec, data, tune_name, [ledger], resume=resumed, verbose=min(verbose, 3),
                                 on_stop=on_tune_stop, prior=prior)
        else:
            outcomes = resume_from_journal(spec, data, journal, tune_problem, ledger, min(verbose, 3), on_tune_stop)
        log.add(tags={rs.TAG_TRIAL_DEVICES: trial_devices(journal.trials.values())})
        ended = trials_with_status(journal, "FINISHED", "FAILED")
        # A budget that ran out before any trial ended leaves nothing to complete: resumable.
        complete = len(ended) >= planned or (ledger.budget_spent() and bool(ended))
        if ledger.budget_spent() and not ended and not interruption.requested:
            budget = spec.search.time_budget_s
            progress.phase(
                f"the time budget (search.time_budget_s {budget:g} s from the first trial's start) ran "
                "out before any trial ended" + (
                    "; a --resume continues the trials from their last epoch with the budget again"
                    if progress.epochs else
                    "; no trial finished an epoch in it: a --resume with it would start them over "
                    "and run out again. Raise it above one epoch's time: add --set "
                    "search.time_budget_s=SECONDS to the resume command (`orchestrate validate SPEC "
                    "--estimate` measures an epoch)"))
        if interruption.requested or not complete:
            return end_interrupted()
        finished = trials_with_status(journal, "FINISHED")
        progress.phase(
            f"{len(ended)} trial{'s' * (len(ended) != 1)} ended; selecting on dev, then evaluating the selected "
            "configuration on test" if finished else
            f"{len(ended)} trial{'s' * (len(ended) != 1)} ended, none finished (failed or diverged): nothing to select"
        )
        if extension is not None:
            outcomes += extension_of.earlier_outcomes(spec, data, parent_run_id, extension)
        full_params = {o.trial_id: {**base_params, **o.params} for o in outcomes}
        # Trials are named by their trial ids: the uploader knows their runs.
        run_ids = {trial_id: trial_id for trial_id in journal.trials}
        # Test data is touched once, for the final selection, computed before anything is recorded.
        selection = apply_paper_protocol(
            spec, data, [o for o in outcomes if o.trial_id in finished], run_ids, full_params, interruption,
            tested_before=extension.tested if extension else None,
        )
        with interruption.deferred():
            if extension is None:
                record_selection(log, journal, spec, spec_path, experiment_id, selection)
                evaluation = 1 if selection.tested else None
            else:
                evaluation = extension_of.record_evaluation(log, journal, spec, spec_path, experiment_id,
                                                            selection, extension)
            state.move(rs.SWEEP_COMPLETED)
        return summary(rs.SWEEP_COMPLETED, selection, evaluation)
    except BaseException as exc:
        if isinstance(exc, SweepInterrupted) or interruption.aborted:
            return end_interrupted()
        with contextlib.suppress(Exception):
            state.move(rs.SWEEP_FAILED)
        raise
