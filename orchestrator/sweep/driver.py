"""`orchestrate sweep`: validate, prepare data once, run Tune, then apply the paper protocol
(orchestrator/sweep/protocol.py). ``run_sweep`` takes one ``SweepRequest``; every check runs before
the parent run exists, and ``_drive`` takes the sweep from `running` to a final state in steps.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nli_models.config import Overrides
from nli_models.cpus import usable_cpus
from nli_models.data import PreparedData
from nli_models.errors import mask_secrets
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
from orchestrator.journal.resume import check_resumable, member_history, resume_from_journal
from orchestrator.ray_adapter.ray_runtime import (
    check_resources,
    init_ray,
    joins_a_cluster,
    shutdown_ray,
    trial_slots,
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
from orchestrator.sweep.plan import check_input, check_local_capacity, describe_stacking
from orchestrator.sweep.progress import ProgressPrinter
from orchestrator.sweep.protocol import Selection, apply_paper_protocol
from orchestrator.sweep.spec import (
    SweepSpec,
    load_spec,
    logged_params,
)
from orchestrator.sweep.warm_start import warm_start as warm_start_prior
from orchestrator.tracking.run_view import ui_hint
from orchestrator.tracking.tracker import Tracker
from orchestrator.tracking.uploader import JournalUploader
from results import run_schema as rs
from results.tracking_uri import missing_store

if TYPE_CHECKING:
    from mlflow.entities import Run


@dataclass(frozen=True)
class SweepRequest:
    """What `orchestrate sweep` asks of the driver: the spec and how to run it.

    Args:
        spec_path: the sweep's spec file.
        resume: continue the experiment's latest sweep (interrupted or failed).
        new: start another sweep in an experiment that has one.
        verbose: how much of Ray's own output and trial tables to show (0: none).
        address: the Ray cluster to join; None: RAY_ADDRESS or a local Ray.
        overrides: the command line's --set and --data-dir.
        tracking_uri: the command line's --tracking-uri (results/tracking_uri.py says which wins).
        wait_for_resources_s: how long a cluster may take to add a node that holds a trial
            (ray_runtime.check_resources; None: its default).
        warm_start: an experiment whose finished trials seed the sampler of this new sweep
            (orchestrator/sweep/warm_start.py).
        extend: add the spec's new trials to the experiment's completed sweep
            (orchestrator/sweep/extend.py).
        spec: what load_spec(spec_path, overrides, tracking_uri) returned, when the caller has read
            it already (the CLI does, before this module's imports); None: read here.
        ray_start_timeout_s: how long Ray's start may take (ray_runtime.init_ray; None: its default).
    """

    spec_path: Path
    resume: bool = False
    new: bool = False
    verbose: int = 0
    address: str | None = None
    overrides: Overrides | None = None
    tracking_uri: str | None = None
    wait_for_resources_s: float | None = None
    warm_start: str | None = None
    extend: bool = False
    spec: SweepSpec | None = None
    ray_start_timeout_s: float | None = None


def run_sweep(request: SweepRequest) -> SweepSummary:
    """Run a sweep through its lifecycle (orchestrator/sweep/lifecycle.py). Everything that can be
    checked is checked before the parent run exists; SIGINT/SIGTERM end it `interrupted`.

    Args:
        request: the spec and how to run it.
    """
    with Interruption() as interruption:
        try:
            return _run_sweep(request, interruption)
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


@dataclass
class _Sweep:
    """A sweep whose input passed every check and whose Ray runs: what each step of the driver
    reads."""

    request: SweepRequest
    spec: SweepSpec
    data: PreparedData
    tracker: Tracker
    interruption: Interruption


@dataclass
class _Continuation:
    """What the sweep continues, read from the store before anything is written: the previous
    sweep (resumed, or extended), the tags of a --warm-start, the extension, what the sampler is
    told of earlier trials, and why Tune's own state cannot resume it (None: it can)."""

    previous: Run | None = None
    warm_tags: dict[str, str] = field(default_factory=dict)
    extension: extension_of.Extension | None = None
    prior: PriorTrials | None = None
    tune_problem: str | None = None


def _run_sweep(request: SweepRequest, interruption: Interruption) -> SweepSummary:
    # Every check of the input runs before the first write: addresses and stores answer within
    # seconds, data and vectors are read, and the cluster can hold a trial.
    spec = request.spec or load_spec(request.spec_path, request.overrides, request.tracking_uri)
    data = check_input(spec, request.address)  # what `validate` checks too
    if not joins_a_cluster(request.address):
        check_local_capacity(spec)  # refused before Ray starts (check_resources would, after)
    with contextlib.ExitStack() as ray_session:

        def start_ray() -> None:
            if init_ray(request.address, verbose=request.verbose > 0,
                        wait_policy=trials_wait_policy(spec, request.address),
                        start_timeout_s=request.ray_start_timeout_s):
                ray_session.callback(shutdown_ray)
            check_resources(spec.search.resources.cpu, spec.search.resources.gpu, request.wait_for_resources_s)

        # A new local store is created only once Ray has started and holds a trial: a failed start
        # leaves nothing behind. An existing store is read first: a sweep it refuses (one exists,
        # nothing to resume) is refused without Ray's start.
        new_store = missing_store(spec.tracking_uri) is not None
        if new_store:
            start_ray()
        tracker = Tracker(spec.tracking_uri)  # creates a new store
        tracker.check_reachable()
        continuation = _continuation(request, spec, tracker)
        if not new_store:
            start_ray()
        return _open_and_drive(_Sweep(request, spec, data, tracker, interruption), continuation)


def _continuation(request: SweepRequest, spec: SweepSpec, tracker: Tracker) -> _Continuation:
    found = _Continuation()
    if request.warm_start is not None:  # a new sweep beside any other, as with --new
        found.prior, source = warm_start_prior(tracker, spec, request.warm_start)
        found.warm_tags = {rs.TAG_WARM_START: source, rs.TAG_WARM_START_CONFIGURATIONS: str(len(found.prior.points))}
    found.previous = (extension_of.completed_sweep(tracker, spec) if request.extend
                      else previous_sweep(tracker, spec, request.resume, request.new or request.warm_start is not None))
    if request.extend or (found.previous is not None and rs.TAG_EXTENSIONS in found.previous.data.tags):
        found.extension = extension_of.plan_extension(tracker, spec, found.previous, resuming=not request.extend)
        found.prior = found.extension.prior
    # Tune's state of the resumed sweep torn or missing: it goes on from its journal. (An
    # extension runs a Tune experiment of its own: extend.tune_experiment.)
    if not request.extend:
        found.tune_problem = check_resumable(spec, found.previous.info.run_id if found.previous is not None else None)
    return found


def _open_and_drive(sweep: _Sweep, continuation: _Continuation) -> SweepSummary:
    """Every check passed and Ray runs: the parent run is opened (or reopened) and the sweep driven
    through the journal and its uploader."""
    spec, request, previous = sweep.spec, sweep.request, continuation.previous
    if request.extend:  # the completed parent run, reopened by the move to `running` (_drive)
        experiment_id, parent_run_id = previous.info.experiment_id, previous.info.run_id
        current = rs.SWEEP_COMPLETED
    else:
        experiment_id, parent_run_id, current = open_parent(
            sweep.tracker, spec, request.spec_path, previous, request.overrides, continuation.warm_tags
        )
    # From here every write is a journal append (recorder.SweepLog); one uploader applies them.
    journal = Journal(journal_file(spec.storage_path, parent_run_id), experiment_id, parent_run_id)
    log = SweepLog(journal)
    uploader = JournalUploader(sweep.tracker, journal.path)
    uploader.start(journal)
    try:
        if request.extend:
            extension_of.open_extension(log, spec, request.spec_path, request.overrides, continuation.extension)
        elif previous is None:
            record_spec(log, request.spec_path, request.overrides)
        sweep.interruption.arm()
        print(
            f"sweep {spec.name}: {spec.num_trials()} trial{'s' * (spec.num_trials() != 1)}; MLflow {mask_secrets(spec.tracking_uri)} "
            f"experiment {experiment_id}, parent run {parent_run_id}",
            file=sys.stderr,
        )
        print(f"data: {sweep.data.describe()}", file=sys.stderr)
        if stacking_line := describe_stacking(spec, trial_slots(spec)):
            print(stacking_line, file=sys.stderr)
        with Heartbeat(log.add):
            outcome = _drive(sweep, log, SweepState(log.state, current), continuation)
        # The store may be away until the end: the outcome stands, the journal keeps the rest.
        if upload_finished(uploader) and outcome.state == rs.SWEEP_COMPLETED:
            _log_analysis(sweep.tracker, log, experiment_id)
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


def _drive(sweep: _Sweep, log: SweepLog, state: SweepState, continuation: _Continuation) -> SweepSummary:
    """From `running` to a final state, counting and selecting from the journal (what the driver
    recorded), never from the store; every way out leaves no run RUNNING (lifecycle.SweepState:
    a final state closes the trial runs still RUNNING). The steps: record what the sweep is and
    reads (_recorder), run the trials (_run_trials), end `interrupted` unless every planned trial
    ended (_all_ended), select on dev and evaluate test once (protocol.apply_paper_protocol), and
    record the selection with the move to `completed` (_record_completion)."""
    spec, interruption, journal = sweep.spec, sweep.interruption, log.journal
    planned = spec.num_trials()
    log.add(tags={rs.TAG_PLANNED_TRIALS: str(planned), **lease_tags()})
    base_params = logged_params(spec.base_config())
    recorder = _recorder(sweep, log, base_params, resumed=continuation.previous is not None)
    try:
        finished_before = trials_with_status(journal, "FINISHED")  # a resumed sweep's
        progress = ProgressPrinter(
            planned, spec.search.metric, spec.search.mode, finished_before=finished_before,
            epochs_per_trial=spec.training.epochs,
            best_so_far=best_of(finished_before.values(), spec.search.metric, spec.search.mode),
        )
        ledger = TrialLedger([recorder, progress], interruption, spec.search.time_budget_s)
        state.move(rs.SWEEP_RUNNING)
        outcomes = _run_trials(sweep, journal, ledger, continuation)
        log.add(tags={rs.TAG_TRIAL_DEVICES: trial_devices(journal.trials.values())})
        if not _all_ended(sweep, journal, ledger, progress, planned):
            return _end_interrupted(interruption, journal, state, planned)
        extension = continuation.extension
        if extension is not None:
            outcomes += extension_of.earlier_outcomes(spec, journal.parent_run_id, extension)
        full_params = {o.trial_id: {**base_params, **o.params} for o in outcomes}
        finished = trials_with_status(journal, "FINISHED")
        # Trials are named by their trial ids: the uploader knows their runs. Test data is touched
        # once, for the final selection, computed before anything is recorded.
        selection = apply_paper_protocol(
            spec, sweep.data, [o for o in outcomes if o.trial_id in finished],
            {trial_id: trial_id for trial_id in journal.trials}, full_params, interruption,
            tested_before=extension.tested if extension else None,
        )
        return _record_completion(sweep, log, state, extension, selection)
    except BaseException as exc:
        if isinstance(exc, SweepInterrupted) or interruption.aborted:
            return _end_interrupted(interruption, journal, state, planned)
        with contextlib.suppress(Exception):
            state.move(rs.SWEEP_FAILED)
        raise


def _recorder(sweep: _Sweep, log: SweepLog, base_params: dict, resumed: bool) -> SweepRecorder:
    """The sweep's description, sources and dataset recorded on its parent run, and the recorder
    of its trials' events."""
    spec, journal = sweep.spec, log.journal
    sources, dataset = describe_for_researchers(log, spec, sweep.request.spec_path, sweep.data,
                                                journal.experiment_id, resumed)
    print(ui_hint(sweep.tracker.tracking_uri, journal.experiment_id), file=sys.stderr)
    return SweepRecorder(
        journal,
        base_params=base_params,
        run_tags={rs.TAG_CORPUS: spec.data.corpus, **sources},
        protocol=protocol_tags(spec.base_config(), sweep.data, spec.search.protocol.refit_on_train_dev),
        dataset=dataset,
    )


def _run_trials(sweep: _Sweep, journal: Journal, ledger: TrialLedger,
                continuation: _Continuation) -> list[TrialOutcome]:
    """The trials run (or resumed) by Tune, or, when Tune's state of the sweep is torn or missing,
    from the journal; a signal or the time budget stops the fit."""
    spec, interruption = sweep.spec, sweep.interruption
    verbose = min(sweep.request.verbose, 3)

    def on_tune_stop(stop) -> None:
        ledger.on_tune_stop(stop)
        interruption.on_tune_stop(stop)

    if continuation.tune_problem is not None:
        return resume_from_journal(spec, sweep.data, journal, continuation.tune_problem, ledger, verbose,
                                   on_tune_stop)
    extension = continuation.extension
    tune_name = extension_of.tune_experiment(spec.name, journal.parent_run_id, extension.index if extension else 0)
    resume = continuation.previous is not None
    return run_tuner(spec, sweep.data, tune_name, [ledger], resume=resume, verbose=verbose,
                     on_stop=on_tune_stop, prior=continuation.prior,
                     members=member_history(journal.path) if resume else None)


def _all_ended(sweep: _Sweep, journal: Journal, ledger: TrialLedger, progress: ProgressPrinter,
               planned: int) -> bool:
    """Whether the sweep can complete: every planned trial ended (or the time budget ran out after
    one did) and no signal came. Says what comes next, or why a budget spent on no ended trial
    needs a larger one."""
    ended = trials_with_status(journal, "FINISHED", "FAILED")
    # A budget that ran out before any trial ended leaves nothing to complete: resumable.
    complete = len(ended) >= planned or (ledger.budget_spent() and bool(ended))
    if ledger.budget_spent() and not ended and not sweep.interruption.requested:
        budget = sweep.spec.search.time_budget_s
        progress.phase(
            f"the time budget (search.time_budget_s {budget:g} s from the first trial's start) ran "
            "out before any trial ended" + (
                "; a --resume continues the trials from their last epoch with the budget again"
                if progress.epochs else
                "; no trial finished an epoch in it: a --resume with it would start them over "
                "and run out again. Raise it above one epoch's time: add --set "
                "search.time_budget_s=SECONDS to the resume command (`orchestrate validate SPEC "
                "--estimate` measures an epoch)"))
    if sweep.interruption.requested or not complete:
        return False
    trials = f"{len(ended)} trial{'s' * (len(ended) != 1)} ended"
    progress.phase(
        f"{trials}; selecting on dev, then evaluating the selected configuration on test"
        if trials_with_status(journal, "FINISHED") else
        f"{trials}, none finished (failed or diverged): nothing to select"
    )
    return True


def _record_completion(sweep: _Sweep, log: SweepLog, state: SweepState,
                       extension: extension_of.Extension | None, selection: Selection) -> SweepSummary:
    """The selection, the test metrics and the move to `completed`, recorded together (a signal
    meanwhile waits until they are)."""
    journal, spec, spec_path = log.journal, sweep.spec, sweep.request.spec_path
    with sweep.interruption.deferred():
        if extension is None:
            record_selection(log, journal, spec, spec_path, journal.experiment_id, selection)
            evaluation = 1 if selection.tested else None
        else:
            evaluation = extension_of.record_evaluation(log, journal, spec, spec_path, journal.experiment_id,
                                                        selection, extension)
        state.move(rs.SWEEP_COMPLETED)
    return _summary(journal, spec.num_trials(), rs.SWEEP_COMPLETED, selection, evaluation)


def _end_interrupted(interruption: Interruption, journal: Journal, state: SweepState,
                     planned: int) -> SweepSummary:
    with interruption.deferred():
        state.move(rs.SWEEP_INTERRUPTED)
    return _summary(journal, planned, rs.SWEEP_INTERRUPTED)


def _summary(journal: Journal, planned: int, final: str, selection: Selection | None = None,
             evaluation: int | None = None) -> SweepSummary:
    """What the sweep ended with, counted from its journal."""
    done, failed, diverged = count_trials(journal)
    return SweepSummary(
        experiment_id=journal.experiment_id,
        parent_run_id=journal.parent_run_id,
        state=final,
        planned=planned,
        done=done,
        failed=failed,
        diverged=diverged,
        best_dev_accuracy=selection.best_dev if selection else None,
        test_accuracy=selection.best_test if selection else None,
        test_evaluation=evaluation,
    )
