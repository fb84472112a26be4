"""What a trial has achieved so far, under the contract's metric names (results/run_schema.py).

One producer, where epochs are measured: the trainable (orchestrator.ray_adapter.ray_runtime) builds a
TrialResult after every epoch and reports its metrics() to Tune, which the sweep's recorder
copies to the trial's MLflow run as they are named. Two readers, one builder: the sweep's
paper protocol reads a trial's last Tune result and `orchestrate results` reads the trial's MLflow
run, both through from_metrics() and record(), so the selection sees the same TrialRecord either
way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from results import run_schema as rs
from results.params import as_int
from results.selection import TrialRecord


@dataclass(frozen=True)
class TrialResult:
    best_dev_accuracy: float | None  # None: a run recorded without it (failed, older stores)
    best_train_accuracy: float | None  # the running train accuracy of the best-dev epoch
    best_epoch: int | None
    epochs_trained: int | None  # also the epoch number of a Tune result (MLflow: its step)
    theta_m: int | None
    theta_wm: int | None

    def metrics(self) -> dict[str, float | int]:
        """The metrics under their contract names (what Tune is told, what MLflow records)."""
        values = {
            rs.METRIC_BEST_DEV_ACCURACY: self.best_dev_accuracy,
            rs.METRIC_BEST_TRAIN_ACCURACY: self.best_train_accuracy,
            rs.METRIC_BEST_EPOCH: self.best_epoch,
            rs.METRIC_EPOCHS_TRAINED: self.epochs_trained,
            rs.METRIC_THETA_M: self.theta_m,
            rs.METRIC_THETA_WM: self.theta_wm,
        }
        return {name: value for name, value in values.items() if value is not None}

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> TrialResult:
        """From a Tune result or an MLflow run's latest metrics (absent names: None)."""
        best_dev, best_train = metrics.get(rs.METRIC_BEST_DEV_ACCURACY), metrics.get(rs.METRIC_BEST_TRAIN_ACCURACY)
        return cls(
            best_dev_accuracy=None if best_dev is None else float(best_dev),
            best_train_accuracy=None if best_train is None else float(best_train),
            best_epoch=as_int(metrics.get(rs.METRIC_BEST_EPOCH)),
            epochs_trained=as_int(metrics.get(rs.METRIC_EPOCHS_TRAINED)),
            theta_m=as_int(metrics.get(rs.METRIC_THETA_M)),
            theta_wm=as_int(metrics.get(rs.METRIC_THETA_WM)),
        )

    def record(
        self, *, run_id: str, config_key: str, model_config: str, params: Mapping[str, object], status: str
    ) -> TrialRecord:
        """The selection's view of the trial (results/selection.py)."""
        return TrialRecord(
            run_id=run_id,
            config_key=config_key,
            model_config=model_config,
            params=dict(params),
            best_dev_accuracy=self.best_dev_accuracy,
            seed=as_int(params.get(rs.PARAM_SEED)),
            status=status,
            theta_m=self.theta_m,
            epochs_trained=self.epochs_trained,
        )
