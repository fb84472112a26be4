"""What a sweep's driver records besides its trials, all through the sweep's journal
(recorder.SweepLog): the parent run it opens or resumes, the description a researcher reads in the
MLflow UI, the selection and test metrics, the analysis; and what it counts, read from the journal
(never from the store, which may lag or be away: its outcome must not depend on it).

The store is read here only when a sweep opens (which sweep to resume, after catching up the
journals earlier drivers left) and for the analysis, built from the uploaded trial runs.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from nli_models.config import Overrides
from nli_models.data import PreparedData
from nli_models.errors import mask_secrets
from orchestrator.journal.operations import Journal, TrialProgress, journal_file
from orchestrator.journal.provenance import data_digest, data_record, environment_record, git_state
from orchestrator.journal.recorder import BEST_RUN_ID, SweepLog
from orchestrator.sweep.lifecycle import lease_tags
from orchestrator.sweep.spec import SweepSpec, effective_spec_text
from orchestrator.tracking.run_view import (
    dataset_input,
    host_tags,
    run_path,
    runs_view_path,
    runs_view_state,
    source_tags,
    sweep_note,
    sweep_params,
)
from orchestrator.tracking.tracker import Tracker, TrackingUnavailable
from orchestrator.tracking.uploader import JournalUploader, create_parent
from results import run_schema as rs
from results.selection import SELECTION_RULE
from results.sweeps import observed_state


class SweepExists(RuntimeError):
    """The experiment already holds a sweep and neither --resume nor --new was given."""


@dataclass
class SweepSummary:
    experiment_id: str
    parent_run_id: str
    state: str  # completed | interrupted (a failure raises)
    planned: int
    done: int  # trials that ended (see lifecycle.TrialLedger)
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


def _diverged(trial: TrialProgress) -> bool:
    """A trial stopped because its loss became NaN/inf (FAILED, never selected)."""
    return trial.status == "FAILED" and trial.tags.get(rs.TAG_DIVERGED) == "true"


def count_trials(journal: Journal) -> tuple[int, int, int]:
    """(finished, failed, diverged) trials, as the journal records their last ending."""
    trials = list(journal.trials.values())
    diverged = sum(_diverged(t) for t in trials)
    failed = sum(t.status == "FAILED" for t in trials) - diverged
    return sum(t.status == "FINISHED" for t in trials), failed, diverged


def trials_with_status(journal: Journal, *statuses: str) -> dict[str, TrialProgress]:
    return {trial_id: t for trial_id, t in journal.trials.items() if t.status in statuses}


def trial_devices(trials: Iterable[TrialProgress]) -> str:
    """The nli.trial_devices tag: each device the trials recorded, with how many trained on it."""
    counts = Counter(
        f"{t.tags[rs.TAG_DEVICE]} ({t.tags.get(rs.TAG_DEVICE_NAME, '?')})"
        for t in trials if rs.TAG_DEVICE in t.tags
    )
    return "; ".join(f"{device} x{count}" for device, count in sorted(counts.items())) or "none recorded"


def best_of(trials: Iterable[TrialProgress], metric: str, mode: str) -> float | None:
    """The best value of ``metric`` the trials reached (their best_<metric>, else its last)."""
    values = [t.values.get(f"best_{metric}", t.values.get(metric)) for t in trials]
    values = [v for v in values if v is not None]
    return (max if mode == "max" else min)(values) if values else None


def git_tags() -> dict[str, str]:
    """The commit of the code that runs (this package's checkout), whatever the working folder."""
    commit, dirty = git_state(Path(__file__).resolve().parent)
    return {rs.TAG_GIT_COMMIT: commit, rs.TAG_GIT_DIRTY: "unknown" if dirty is None else str(dirty).lower()}


def _version_tags() -> dict[str, str]:
    return {
        rs.TAG_RAY_VERSION: importlib.metadata.version("ray"),  # Ray's own, without importing Ray
        rs.TAG_TORCH_VERSION: torch.__version__,
        rs.TAG_PYTHON_VERSION: platform.python_version(),
    }


def _override_tags(overrides: Overrides | None) -> dict[str, str]:
    return {rs.TAG_OVERRIDES: json.dumps(overrides.describe())} if overrides else {}


def _objective_tags(spec: SweepSpec) -> dict[str, str]:
    directions = spec.search.objective_directions
    return {rs.TAG_OBJECTIVES: json.dumps(directions)} if directions else {}


def catch_up(tracker: Tracker, spec: SweepSpec) -> None:
    """Upload what the journals of the experiment's sweeps hold and the store lacks (a driver
    SIGKILLed, or a store away at a sweep's end), before the store is read to decide what to
    resume. A sweep whose driver is alive is its own uploader's."""
    experiment_id = tracker.find_experiment(spec.name)
    for run in [] if experiment_id is None else tracker.sweeps(experiment_id):
        path = journal_file(spec.storage_path, run.info.run_id)
        if path.is_file() and observed_state(run.data.tags) != rs.SWEEP_RUNNING:
            try:
                JournalUploader(tracker, path).upload_available()
            except Exception as exc:  # the store stopped answering, or refused a record
                raise TrackingUnavailable(
                    f"uploading {path}, what an earlier driver of sweep {run.info.run_id} recorded, "
                    f"failed: {mask_secrets(str(exc))[:300]}; nothing was started"
                ) from None


def previous_sweep(tracker: Tracker, spec: SweepSpec, resume: bool, new: bool):
    """The sweep --resume continues (None: start one), read without writing anything but the
    journals' catch-up. SweepExists when the user has to choose. A sweep that ended before its
    first trial (a failed start, a signal during start-up) is ignored: it never blocks the next
    attempt."""
    catch_up(tracker, spec)
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
            "--resume; pass --new to start another sweep beside it"
        )
    if not resume:
        if not tracker.trial_runs(experiment_id, run_id):
            return None  # interrupted during start-up: nothing to continue or to lose
        raise SweepExists(
            f"experiment {spec.name!r} already holds sweep run {run_id} ({state}); pass --resume "
            "to continue it or --new to start another sweep beside it"
        )
    return latest


def open_parent(tracker: Tracker, spec: SweepSpec, spec_path: Path, previous,
                overrides: Overrides | None, warm_tags: dict[str, str] | None = None) -> tuple[str, str, str]:
    """(experiment id, parent run id, its state): a new parent run in state `planned` (created
    at once: uploader.create_parent, with `warm_tags`: --warm-start), or the resumed one as
    readers see it (a driver that died left `running` or `planned`: `interrupted`)."""
    if previous is not None:
        if previous.data.tags.get(rs.TAG_SPEC_HASH) != spec.spec_hash():
            print(
                f"warning: {spec_path} changed since sweep {previous.info.run_id} started; "
                "resuming with the search recorded by Ray Tune",
                file=sys.stderr,
            )
        return previous.info.experiment_id, previous.info.run_id, observed_state(previous.data.tags)
    tags = {
        rs.TAG_SPEC_HASH: spec.spec_hash(),
        rs.TAG_SPEC_NAME: spec.name,
        rs.TAG_CORPUS: spec.data.corpus,
        rs.TAG_SWEEP_STATE: rs.SWEEP_PLANNED,
        rs.TAG_PLANNED_TRIALS: str(spec.num_trials()),
        **lease_tags(),
        **git_tags(),
        **_version_tags(),
        **host_tags(),
        **_override_tags(overrides),
        **_objective_tags(spec),
        **(warm_tags or {}),
    }
    if spec.search.time_budget_s is not None:
        tags[rs.TAG_TIME_BUDGET] = str(spec.search.time_budget_s)
    experiment_id, parent_run_id = create_parent(tracker, spec.name, f"sweep-{spec.name}", tags)
    return experiment_id, parent_run_id, rs.SWEEP_PLANNED


def record_spec(log: SweepLog, spec_path: Path, overrides: Overrides | None) -> None:
    """The spec with its overrides applied, with no password of a tracking URI in it (artifacts
    are readable by everyone who can read the experiment)."""
    log.add(files={rs.ARTIFACT_SPEC: mask_secrets(effective_spec_text(spec_path, overrides))})


def describe_sweep(log: SweepLog, spec: SweepSpec, spec_path: str | Path, experiment_id: str,
                   resume: bool) -> str:
    """Summary params, description and source tags on the parent; the experiment holds the
    trials view, listed by name in the UI's Views menu. Returns the view's relative link
    (``runs_view_path``)."""
    link = runs_view_path(experiment_id)
    searched = sorted(
        {*spec.search.space, *(k for c in spec.search.configurations for k in c), rs.PARAM_SEED}
    )
    metrics = [rs.METRIC_BEST_DEV_ACCURACY, rs.METRIC_TEST_ACCURACY, rs.METRIC_TRIAL_TIME]
    log.experiment_tags({rs.EXPERIMENT_TAG_KIND: rs.EXPERIMENT_KIND_ML}, runs_view_state(searched, metrics))
    if not resume:  # params are immutable: a resumed sweep keeps the ones it started with
        log.params(sweep_params(spec))
    log.add(tags={rs.TAG_MLFLOW_NOTE: sweep_note(spec, spec_path, link)})
    return link


def describe_for_researchers(log: SweepLog, spec: SweepSpec, spec_path: Path,
                             data: PreparedData, experiment_id: str, resume: bool
                             ) -> tuple[dict[str, str], dict]:
    """What the MLflow UI shows of the sweep: its summary and description, MLflow's source tags,
    the data and environment records, the dataset input. Returns the source tags and the
    dataset input for the trial runs."""
    describe_sweep(log, spec, spec_path, experiment_id, resume)
    sources = source_tags(spec_path, git_tags()[rs.TAG_GIT_COMMIT])
    record = data_record(spec.data, data)
    dataset = dataset_input(record, data_digest(record))
    if not resume:
        # The driver's host and what the spec asks; what each trial really trained on is its
        # own record (nli.device), counted on the parent once the trials ended (nli.trial_devices).
        requested = {"training_device": spec.training.device, **spec.search.resources.model_dump()}
        log.add(tags=sources, files={
            rs.ARTIFACT_DATA_RECORD: json.dumps(record, indent=2),
            rs.ARTIFACT_ENVIRONMENT: json.dumps(environment_record(requested), indent=2),
        })
        log.dataset(dataset)
    return sources, dataset


def record_selection(log: SweepLog, journal: Journal, spec: SweepSpec, spec_path: Path,
                     experiment_id: str, selection, step: int = 0) -> None:
    """The selection (protocol.Selection, keyed by trial id): test metrics, predictions and the
    `selected` mark on the tested trials' runs; the sweep's summary metrics (at `step`: the
    test evaluation's index - 1, see extend.record_evaluation), its best run and the
    description linking it on the parent."""
    for trial_id, metrics in selection.tested.items():
        log.add(tags={rs.TAG_SELECTED: "true"}, metrics=metrics,
                files={rs.ARTIFACT_TEST_PREDICTIONS: selection.predictions[trial_id]}, trial_id=trial_id)
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
        log.add(metrics=summary, step=step)
    best = selection.best_run_id
    if best is not None and selection.best_dev is not None:
        test = "" if selection.best_test is None else f", test {selection.best_test:.2%}"
        summary_line = f"{journal.trials[best].run_name}: dev {selection.best_dev:.2%}{test}"
        link = f"[{summary_line}]({run_path(experiment_id, BEST_RUN_ID)})"
        log.add(tags={rs.TAG_SELECTION_RULE: SELECTION_RULE})
        log.best(best, sweep_note(spec, spec_path, runs_view_path(experiment_id), best=link))


def log_analysis(tracker: Tracker, log: SweepLog, experiment_id: str) -> None:
    """Hyperparameter importance, parallel coordinates, EVP and the top learning curves of the
    experiment's finished trials, logged to the parent under analysis/ (what `orchestrate
    results --analysis` writes), built from the uploaded trial runs. An analysis that fails
    costs a warning, never the sweep."""
    from results.analysis import analysis_files, importance_table
    from results.atomic_files import write_output

    try:
        experiment, trials, histories = tracker.analysis_inputs(experiment_id)
        folder = log.folder()
        for path, content in analysis_files(trials, importance_table(trials), histories, experiment.name, folder):
            write_output(path, content)
        log.add_folder(folder, rs.ARTIFACT_ANALYSIS_DIR)
    except Exception as exc:  # the sweep's results stand without the analysis
        print(f"warning: the sweep analysis was not logged: {exc}", file=sys.stderr)


def upload_finished(uploader: JournalUploader) -> bool:
    """Wait for the uploader to apply everything journaled. False, with how to upload later,
    when the store stayed away NLI_TRACKING_MAX_WAIT_S: the sweep's outcome stands regardless."""
    try:
        uploader.drain()
        return True
    except TrackingUnavailable as exc:
        print(f"warning: {exc}", file=sys.stderr)
        return False
