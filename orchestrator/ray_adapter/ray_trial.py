"""The Ray Tune trainable's side of the adapter (with ray_runtime.py and tuner.py, the driver, and ray_search.py,
the search): what runs inside a trial. Ray 2.60 runs Train V2: inside a trial only
ray.tune.report / get_checkpoint / get_context work.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
import yaml
from ray import tune
from ray.tune.search.repeater import TRIAL_INDEX

from nli_models.config import RunConfig
from nli_models.data import PreparedData
from nli_models.training import (
    TRIAL_CONFIG_FILE,
    EpochResult,
    Trainer,
    TrainingDiverged,
    TrainState,
    make_trainer,
)
from nli_models.training.device_info import describe_device
from nli_models.training.gpu_memory import cap_memory
from orchestrator.sweep.environment import trial_threads
from orchestrator.sweep.spec import apply_hyperparameters
from results import run_schema as rs
from results.trial_result import TrialResult

CONFIGURATION_KEY = "configuration"
POINT_KEY = "point"  # a grid --extend: Tune's grid runs over the points still to run, whole


# -- inside a trial ---------------------------------------------------------------------------
def trial_params(tune_config: dict[str, Any], spec_search: dict[str, Any]) -> dict[str, Any]:
    """Flat hyperparameters of a trial (the names logged to MLflow) from Tune's config."""
    tune_config = tune_config.get(POINT_KEY, tune_config)
    params = {k: v for k, v in tune_config.items() if k not in (CONFIGURATION_KEY, TRIAL_INDEX)}
    if CONFIGURATION_KEY in tune_config:
        params.update(spec_search["configurations"][tune_config[CONFIGURATION_KEY]])
    if TRIAL_INDEX in tune_config:  # Repeater: the n-th repeat of a sampled configuration
        params["seed"] = spec_search["seeds"][tune_config[TRIAL_INDEX]]
    elif "seed" not in params:  # one seed and no grid over it
        params["seed"] = spec_search["seeds"][0]
    return params


def trial_result(trainer: Trainer | StackMember, epochs_trained: int) -> TrialResult:
    """What the trial (or a stack's member) has achieved after `epochs_trained` epochs."""
    state = trainer.state
    return TrialResult(
        best_dev_accuracy=state.best_dev_accuracy,
        best_train_accuracy=state.best_train_accuracy,
        best_epoch=state.best_epoch,
        epochs_trained=epochs_trained,
        theta_m=trainer.theta_m,
        theta_wm=trainer.theta_wm,
    )


@dataclass(frozen=True)
class StackMember:
    """A stack's member where a trial's Trainer is read: its TrainState and parameter counts."""

    state: TrainState
    theta_m: int
    theta_wm: int


def epoch_metrics(trainer: Trainer | StackMember, result: EpochResult, finished: bool) -> dict[str, Any]:
    """The Tune result of an epoch: its metrics and the trial's TrialResult, named as MLflow
    records them (results/run_schema.py)."""
    return {
        rs.METRIC_TRAIN_LOSS: result.train_loss,
        rs.METRIC_TRAIN_ACCURACY: result.train_accuracy,
        rs.METRIC_DEV_LOSS: result.dev_loss,
        rs.METRIC_DEV_ACCURACY: result.dev_accuracy,
        rs.METRIC_EPOCH_TIME: result.epoch_time_s,
        **trial_result(trainer, result.epoch).metrics(),
        rs.RESULT_TRIAL_FINISHED: int(finished),
    }


def trial_device(configured: str) -> str:
    """The training.device of a trial, which sees only the GPUs Ray gave it. Ray 2.60 sets
    CUDA_VISIBLE_DEVICES only for workers it gives GPUs (ray/_private/accelerators/accelerator.py,
    ray-project/ray#54868): a trial with resources.gpu 0 would see every GPU of its node, and
    `auto` would take cuda:0. Without GPU ids the GPUs are hidden before torch initialises CUDA
    here, and `auto` is the CPU whatever CUDA says."""
    if ray.get_gpu_ids():
        return configured
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return "cpu" if configured == "auto" else configured


def device_tags(device: torch.device, autocast_dtype: torch.dtype | None = None) -> dict[str, str]:
    """What the trial trains on, under its MLflow tag names (reported with every epoch: the
    recorder tags the run when it first comes and when a retry ran elsewhere)."""
    described = describe_device(device, autocast_dtype)
    return {tag: described[key] for key, tag in rs.DEVICE_TAGS.items()}


def trial_config(base: dict, params: dict[str, Any]) -> RunConfig:
    """The run config of a trial (or of a stack's member) with `params`, on the device the
    trial may use (trial_device)."""
    config = apply_hyperparameters(RunConfig.model_validate(base), params)
    training = config.training
    return config.model_copy(
        update={"training": training.model_copy(update={"device": trial_device(training.device)})}
    )


def trial_gpus() -> float:
    """The GPUs Ray gave this trial (a fraction packs trials); torch's threads set to its CPUs."""
    resources = tune.get_context().get_trial_resources().required_resources
    torch.set_num_threads(trial_threads(resources.get("CPU", 1)))
    return resources.get("GPU", 0)


def config_yaml(config: RunConfig) -> str:
    """The config as it travels with a checkpoint (TRIAL_CONFIG_FILE): `orchestrate attention`
    rebuilds the model (and its vocabulary) from the checkpoint artifact alone."""
    return yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True), sort_keys=False)


def run_trial(tune_config: dict[str, Any], *, base: dict, search: dict, data: PreparedData) -> None:
    """A Tune function trainable: the foundation's trainer with a report and checkpoint per epoch."""
    config = trial_config(base, trial_params(tune_config, search))
    gpus = trial_gpus()
    trainer = make_trainer(config, data)
    cap_memory(trainer.device, gpus)  # a packed trial keeps to its share
    saved_config = config_yaml(config)
    device = device_tags(trainer.device, trainer.autocast_dtype)  # once: one device throughout
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            trainer.load_checkpoint(directory)

    def report(trainer: Trainer, result: EpochResult) -> None:
        finished = trainer.finished()
        with tempfile.TemporaryDirectory() as directory:
            trainer.save_checkpoint(directory)
            (Path(directory) / TRIAL_CONFIG_FILE).write_text(saved_config)
            tune.report(
                {**epoch_metrics(trainer, result, finished), **device},
                checkpoint=tune.Checkpoint.from_directory(directory),
            )

    try:
        trainer.fit(report)
    except TrainingDiverged as exc:
        # Ends the trial (no retry: training is deterministic, it would diverge again) with a
        # last result that marks it; the worst possible metric keeps schedulers and Optuna off it.
        tune.report(diverged_result(trainer, exc))


def diverged_result(trainer: Trainer | StackMember, exc: TrainingDiverged) -> dict[str, Any]:
    """The last result of a trial (or member) whose training loss stopped being finite."""
    return {
        **trial_result(trainer, exc.epoch).metrics(),
        rs.METRIC_DEV_ACCURACY: 0.0,
        rs.METRIC_DEV_LOSS: float("inf"),
        rs.RESULT_TRIAL_FINISHED: 1,
        rs.METRIC_DIVERGED_EPOCH: exc.epoch,
        rs.METRIC_DIVERGED_STEP: exc.step,
        rs.RESULT_DIVERGED_LOSS: str(exc.loss),
    }
