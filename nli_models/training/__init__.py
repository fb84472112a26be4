"""Pure PyTorch training: optimizers as the papers use them, early stopping, exact resume."""

from nli_models.training.fingerprint import protocol_fingerprint
from nli_models.training.metrics import Evaluation, evaluate
from nli_models.training.optimizers import make_optimizer
from nli_models.training.refit import refit_and_test, train_plus_dev
from nli_models.training.trainer import (
    CHECKPOINT_FILE,
    TRIAL_CONFIG_FILE,
    CheckpointRefused,
    DeviceUnavailable,
    EpochResult,
    Trainer,
    TrainingDiverged,
    TrainState,
    build_for_data,
    check_fits_data,
    make_trainer,
    read_checkpoint,
    resolve_device,
)

__all__ = [
    "CHECKPOINT_FILE",
    "TRIAL_CONFIG_FILE",
    "CheckpointRefused",
    "DeviceUnavailable",
    "EpochResult",
    "Evaluation",
    "TrainState",
    "TrainingDiverged",
    "Trainer",
    "build_for_data",
    "check_fits_data",
    "evaluate",
    "make_optimizer",
    "make_trainer",
    "protocol_fingerprint",
    "read_checkpoint",
    "refit_and_test",
    "resolve_device",
    "train_plus_dev",
]
