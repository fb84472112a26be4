"""What a sweep records, as operations appended to its journal (orchestrator/journal/operations.py): the
trials' events (``SweepRecorder``, a TrialListener) and the parent run's states, lease,
description, selection and files (``SweepLog``). Nothing here talks to MLflow: the uploader
(orchestrator/tracking/uploader.py) applies the journal to the store, so neither the Tune loop nor the end
of a sweep waits for the tracking server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from nli_models.config import RunConfig
from nli_models.data import PreparedData
from nli_models.training import protocol_fingerprint
from orchestrator.journal.operations import PARENT, Journal, Op
from orchestrator.sweep.lifecycle import RUN_STATUS
from orchestrator.sweep.spec import apply_hyperparameters
from orchestrator.tracking.run_view import trial_start_extras
from results import run_schema as rs
from results.atomic_files import write_output
from results.trial_result import TrialResult

EPOCH_METRICS = (
    rs.METRIC_TRAIN_LOSS,
    rs.METRIC_TRAIN_ACCURACY,
    rs.METRIC_DEV_LOSS,
    rs.METRIC_DEV_ACCURACY,
    rs.METRIC_EPOCH_TIME,
)



ProtocolTags = Callable[[dict[str, Any]], dict[str, str]]


def protocol_tags(base: RunConfig, data: PreparedData, refit_on_train_dev: bool) -> ProtocolTags:
    """Trial params -> the nli.protocol.* tags of that trial's protocol fingerprint."""

    def tags(params: dict[str, Any]) -> dict[str, str]:
        fingerprint = protocol_fingerprint(
            apply_hyperparameters(base, params), data, refit_on_train_dev
        )
        return {rs.TAG_PROTOCOL_PREFIX + k: str(v) for k, v in fingerprint.items()}

    return tags


class SweepRecorder:
    """A TrialListener (see ray_adapter) that appends every trial event to the sweep's journal;
    the uploader makes them child runs of the sweep. Appending is all the Tune loop waits
    for. An epoch the journal already holds for a trial (a trial restarted from an older
    checkpoint, by Tune or by a resumed driver: training is deterministic) is not recorded again."""

    def __init__(
        self,
        journal: Journal,
        base_params: dict[str, Any],
        run_tags: dict[str, str],
        protocol: ProtocolTags | None = None,
        dataset: dict[str, Any] | None = None,
    ):
        self.journal = journal
        self.base_params = base_params
        self.run_tags = run_tags
        self.protocol = protocol
        self.dataset = dataset  # see dataset_input
        self._devices: dict[str, dict[str, str]] = {}  # trial id -> the device tags recorded
        # Retries of trials that never started (an actor lost while pending, e.g. its node was
        # removed): they have no run to tag yet, so the tags ride on the start record.
        self._unstarted_retries: dict[str, dict[str, str]] = {}

    # -- TrialListener ----------------------------------------------------------------------
    def trial_started(self, trial_id: str, params: dict[str, Any]) -> None:
        full = {**self.base_params, **params}
        tags = {
            **self.run_tags,
            **(self.protocol(params) if self.protocol else {}),
            rs.TAG_PARAMS_JSON: rs.params_json(full),
            **self._unstarted_retries.pop(trial_id, {}),
        }
        self.journal.append(Op.START, trial_id, {"params": full, "tags": tags,
                                                **trial_start_extras(params, self.dataset)})

    def trial_result(self, trial_id: str, metrics: dict[str, Any]) -> None:
        if rs.METRIC_DIVERGED_EPOCH in metrics:
            return  # not an epoch's metrics: trial_completed records the divergence
        step = int(metrics[rs.METRIC_EPOCHS_TRAINED])
        progress = self.journal.trials.get(trial_id)
        if progress is not None and step <= progress.last_epoch:
            return
        values = {k: float(metrics[k]) for k in EPOCH_METRICS if k in metrics}
        record: dict[str, Any] = {"step": step, "values": values}
        # What the trial's process trained on (ray_trial.run_trial reports it with every
        # epoch): with the epoch's metrics when it first comes, and when a retry ran elsewhere.
        device = {tag: str(metrics[tag]) for tag in rs.DEVICE_TAGS.values() if tag in metrics}
        if device and self._devices.get(trial_id) != device:
            self._devices[trial_id] = record["tags"] = device
        self.journal.append(Op.EPOCH, trial_id, record)

    def trial_completed(self, trial_id: str, last: dict[str, Any], checkpoint_dir: str | None) -> None:
        if rs.METRIC_DIVERGED_EPOCH in last:
            self._diverged(trial_id, last)
            return
        values = {name: float(value) for name, value in TrialResult.from_metrics(last).metrics().items()}
        if "time_total_s" in last:
            values[rs.METRIC_TRIAL_TIME] = float(last["time_total_s"])
        early = bool(last) and not last.get(rs.RESULT_TRIAL_FINISHED, 0)
        tags = {rs.TAG_EARLY_STOPPED: str(early).lower()}
        self.journal.append(Op.FINISH, trial_id, {"values": values, "tags": tags, "status": "FINISHED"})
        if checkpoint_dir:
            self.trial_checkpoint(trial_id, checkpoint_dir)

    def trial_checkpoint(self, trial_id: str, checkpoint_dir: str) -> None:
        """The trial's checkpoint folder, uploaded as its run's checkpoint artifact (a stack
        member's comes once its stack completed: stacks.StackEvents)."""
        self.journal.append(Op.ARTIFACTS, trial_id, {"path": checkpoint_dir, "dest": rs.ARTIFACT_CHECKPOINT_DIR})

    def trial_errored(self, trial_id: str, params: dict[str, Any], error: str) -> None:
        tags = {rs.TAG_ERROR: error[-4000:]}
        self.journal.append(Op.FINISH, trial_id, {"values": {}, "tags": tags, "status": "FAILED"})

    def trial_retried(self, trial_id: str, retries: int, cause: str, resumed_from_epoch: int) -> None:
        tags = {
            rs.TAG_RETRIES: str(retries),
            rs.TAG_RETRY_CAUSE: cause[-4000:],
            rs.TAG_RESUMED_FROM_EPOCH: str(resumed_from_epoch),
        }
        progress = self.journal.trials.get(trial_id)
        if progress is None or not progress.started:
            self._unstarted_retries[trial_id] = tags
            return
        self.journal.append(Op.TAGS, trial_id, {"tags": tags})

    def _diverged(self, trial_id: str, last: dict[str, Any]) -> None:
        """FAILED with the epoch and step where the loss stopped being finite: `results` and the
        selection read FINISHED runs only, so a diverged configuration is never selected."""
        epoch, step = int(last[rs.METRIC_DIVERGED_EPOCH]), int(last[rs.METRIC_DIVERGED_STEP])
        values = {rs.METRIC_DIVERGED_EPOCH: float(epoch), rs.METRIC_DIVERGED_STEP: float(step)}
        values.update({rs.METRIC_THETA_M: float(last[rs.METRIC_THETA_M]), rs.METRIC_THETA_WM: float(last[rs.METRIC_THETA_WM])})
        tags = {
            rs.TAG_DIVERGED: "true",
            rs.TAG_ERROR: (
                f"diverged: the training loss became {last.get(rs.RESULT_DIVERGED_LOSS, 'non-finite')} "
                f"at epoch {epoch}, step {step}; lower the learning rate or clip gradients"
            ),
        }
        self.journal.append(Op.FINISH, trial_id, {"values": values, "tags": tags, "status": "FAILED"})

    def trial_cut(self, trial_id: str) -> None:
        # Epoch metrics stay; no final metrics: the trial is resumed from its checkpoint.
        self.journal.append(Op.FINISH, trial_id, {"values": {}, "tags": {}, "status": "KILLED"})

    def sweep_ended(self) -> None:
        pass  # the sweep drains the uploader after Tune returns


class SweepLog:
    """The parent run's writes (and the selection's marks on trial runs), each one journal append:
    ``add`` is the one call for a tag, a metric or a file on the parent (``trial_id``: on a trial's
    run instead). A file's content is written beside the journal first (JOURNAL.files/), so the
    journal holds only its path and a later `orchestrate sync` still finds it."""

    def __init__(self, journal: Journal):
        self.journal = journal
        # Named like the journal's other files (JOURNAL.uploaded): the same patterns leave them
        # out of a job's upload (ray_jobs) and of the git-dirty check (provenance).
        self.files = journal.path.with_name(journal.path.name + ".files")

    def add(
        self,
        tags: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        files: dict[str, str | bytes] | None = None,
        trial_id: str = PARENT,
        step: int = 0,
    ) -> None:
        """Tags, metrics (at `step`) and files (artifact path -> content) on the parent run."""
        if tags:
            self.journal.append(Op.TAGS, trial_id, {"tags": {k: str(v) for k, v in tags.items()}})
        if metrics:
            values = {"values": {k: float(v) for k, v in metrics.items()}}
            # A record without "step" (every journal before --extend) is at step 0.
            self.journal.append(Op.METRICS, trial_id, {**values, **({"step": step} if step else {})})
        for artifact_file, content in (files or {}).items():
            artifact = PurePosixPath(artifact_file)
            path = self.folder() / artifact.name
            write_output(path, content)
            self.add_folder(path, str(artifact.parent).strip("."), trial_id)

    def folder(self) -> Path:
        """A new folder beside the journal for files an operation will point to."""
        folder = self.files / str(self.journal.appended)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def add_folder(self, path: Path, dest: str, trial_id: str = PARENT) -> None:
        """A file or a folder's files as artifacts under ``dest`` of the parent (or a trial's) run."""
        self.journal.append(Op.ARTIFACTS, trial_id, {"path": str(path), "dest": dest})

    def state(self, target: str) -> None:
        """A state move (lifecycle.SweepState): the tag and the run status that goes with it; a
        final state also closes the trial runs still RUNNING (KILLED: resumable)."""
        self.journal.append(Op.STATE, PARENT, {"state": target, "status": RUN_STATUS.get(target, "RUNNING")})

    def params(self, params: dict[str, str]) -> None:
        self.journal.append(Op.PARAMS, PARENT, {"params": params})

    def dataset(self, dataset: dict[str, Any]) -> None:
        self.journal.append(Op.INPUTS, PARENT, {"dataset": dataset})

    def experiment_tags(self, tags: dict[str, str], runs_view: str) -> None:
        """Tags of the experiment, and its runs view (run_view.runs_view_state; the uploader wraps
        it in the envelope the UI lists, keeping the creation time of a view written before)."""
        self.journal.append(Op.EXPERIMENT_TAGS, PARENT, {"tags": tags, "runs_view": runs_view})

    def best(self, trial_id: str, note: str) -> None:
        """The best trial (its run id becomes nli.best_run_id) and the description linking its run
        page (``BEST_RUN_ID`` in ``note`` stands for the run id the store gave it)."""
        self.journal.append(Op.BEST, PARENT, {"trial_id": trial_id, "note": note})


BEST_RUN_ID = "{best_run_id}"
