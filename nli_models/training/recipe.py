"""The `orchestrate train` recipe: prepare data, train with per-epoch output, test once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from nli_models.config import RunConfig
from nli_models.cpus import usable_cpus
from nli_models.data import PreparedData, prepare_data
from nli_models.training.metrics import Evaluation
from nli_models.training.refit import refit_and_test
from nli_models.training.trainer import (
    CHECKPOINT_FILE,
    EpochResult,
    Trainer,
    make_trainer,
    resolve_device,
)


def _format_epoch(result: EpochResult, epochs: int) -> str:
    marker = " *" if result.is_best else ""
    return (
        f"epoch {result.epoch:>3}/{epochs}  train loss {result.train_loss:.4f} "
        f"running acc {result.train_accuracy:.2%}  dev loss {result.dev_loss:.4f} "
        f"acc {result.dev_accuracy:.2%}  ({result.epoch_time_s:.1f}s){marker}"
    )


def choose_num_threads(configured: int | None, cpus: int) -> tuple[int, str]:
    """torch's thread count for `orchestrate train` and why: the config's training.num_threads,
    else one per usable CPU (as a sweep trial gets one per `resources.cpu`). Never torch's own
    default, which counts every core of the machine, not the ones this process may use."""
    if configured:
        return configured, "training.num_threads"
    return max(1, cpus), f"the CPUs this process may use: {cpus}"


def apply_num_threads(config: RunConfig) -> tuple[RunConfig, str]:
    """Set the thread count; the returned config carries it so that Trainer.fit keeps it, and
    the line says what torch now uses and why. OMP_WAIT_POLICY is part of it because it decides
    how threads wait (`orchestrate train` chooses it before torch loads: orchestrator.sweep.environment)."""
    threads, why = choose_num_threads(config.training.num_threads, usable_cpus())
    torch.set_num_threads(threads)
    policy = os.environ.get("OMP_WAIT_POLICY", "OpenMP default")
    training = config.training.model_copy(update={"num_threads": threads})
    line = f"threads: {torch.get_num_threads()} ({why}; OMP_WAIT_POLICY {policy})"
    return config.model_copy(update={"training": training}), line


def train_and_test(
    config: RunConfig,
    data: PreparedData | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> tuple[Trainer, Evaluation | None]:
    """Train one configuration; the test split (if any) is evaluated once, on the best-on-dev
    weights. Returns the trainer and the test evaluation."""
    resolve_device(config.training.device)  # a missing GPU fails before minutes of data prep
    config, threads = apply_num_threads(config)
    data = data or prepare_data(config.data)
    echo(f"data: {data.describe()}")
    trainer = make_trainer(config, data)
    echo(
        f"model {config.model.name}/{config.model.variant or '-'}: |θ|M = {trainer.theta_m:,}, "
        f"|θ|W+M = {trainer.theta_wm:,} on {trainer.device}"
    )
    echo(threads)
    if resume:
        if not (Path(checkpoint_dir) / CHECKPOINT_FILE).exists():
            raise FileNotFoundError(f"no checkpoint to resume in {checkpoint_dir}")
        trainer.load_checkpoint(checkpoint_dir)
        echo(f"resumed after epoch {trainer.state.epoch}")

    # Layerwise training runs the epoch budget once per block.
    phases = trainer.model.num_blocks if config.training.layerwise else 1

    def on_epoch(trainer: Trainer, result: EpochResult) -> None:
        phase = f" [block {trainer.state.phase}/{phases}]" if phases > 1 else ""
        echo(_format_epoch(result, config.training.epochs * phases) + phase)
        if checkpoint_dir is not None:
            trainer.save_checkpoint(checkpoint_dir)

    state = trainer.fit(on_epoch)
    echo(f"best dev accuracy {state.best_dev_accuracy:.2%} at epoch {state.best_epoch}")
    test = None
    if "test" in data.splits:
        test = trainer.evaluate_best("test")
        per_class = ", ".join(f"{k} {v:.2%}" for k, v in test.class_accuracy.items())
        echo(f"test accuracy {test.accuracy:.2%} (best-on-dev weights; {per_class})")
    return trainer, test


def refit_and_report(
    config: RunConfig, epochs: int, echo: Callable[[str], None] = print
) -> Evaluation:
    """`orchestrate train --refit EPOCHS`: a sweep's refit protocol (search.protocol.
    refit_on_train_dev, nli_models/training/refit.py) for one configuration: train on train + dev
    for EPOCHS epochs (layerwise: EPOCHS / blocks per phase, rounded up), no early stopping, and
    test once on the final weights. With the config `orchestrate best` exports and the selected
    run's best epoch it reproduces that run's test accuracy."""
    resolve_device(config.training.device)
    config, threads = apply_num_threads(config)
    data = prepare_data(config.data)
    echo(f"data: {data.describe()}")
    echo(threads)
    pairs = len(data.splits.get("train", ())) + len(data.splits.get("dev", ()))
    trainer, test = refit_and_test(config, data, epochs)
    echo(f"refit on train + dev ({pairs:,} pairs): {trainer.state.epoch} epochs, no early stopping")
    per_class = ", ".join(f"{k} {v:.4f}" for k, v in test.class_accuracy.items())
    echo(f"test accuracy {test.accuracy:.2%} (final weights of the refit; {per_class})")
    return test
