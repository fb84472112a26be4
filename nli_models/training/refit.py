"""The protocol "refit the selected configuration on train + dev, then test once".

Yin et al. (§5.4) select hyperparameters on dev, then train the final system on train and dev
(4,934 SICK pairs) and report test. ``refit_and_test`` does that for one configuration: a fresh
model (same seed) trained on train + dev for a given number of epochs, with no early stopping,
and the test split evaluated once on the final weights; the vocabulary stays the one prepared
from train (plus vectors). Dev is part of the training data, yet still read after every epoch:
without layerwise training nothing is chosen on it. With layerwise training each phase gets
ceil(epochs / blocks) epochs (the selected run's epoch count spans its phases), and the next
phase starts from the previous phase's best-on-dev weights (``Trainer._next_phase``), so the
phase boundary is still selected on dev, which the refit also trains on; only the last phase
ends on its final weights.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from nli_models.config import RunConfig
from nli_models.data import EncodedSplit, PreparedData
from nli_models.training.metrics import Evaluation
from nli_models.training.trainer import EpochCallback, Trainer, make_trainer


def concatenate(name: str, first: EncodedSplit, second: EncodedSplit) -> EncodedSplit:
    def ids_and_offsets(kind: str) -> tuple[np.ndarray, np.ndarray]:
        ids = np.concatenate([getattr(first, f"{kind}_ids"), getattr(second, f"{kind}_ids")])
        a, b = getattr(first, f"{kind}_offsets"), getattr(second, f"{kind}_offsets")
        return ids, np.concatenate([a, b[1:] + a[-1]])

    premise_ids, premise_offsets = ids_and_offsets("premise")
    hypothesis_ids, hypothesis_offsets = ids_and_offsets("hypothesis")
    labels = np.concatenate([first.labels, second.labels])
    return EncodedSplit(
        name, premise_ids, premise_offsets, hypothesis_ids, hypothesis_offsets, labels
    )


def train_plus_dev(data: PreparedData) -> PreparedData:
    """The same prepared data with train + dev as the training split."""
    if "dev" not in data.splits or "test" not in data.splits:
        raise ValueError("refit on train + dev needs dev and test splits")
    splits = dict(data.splits)
    splits["train"] = concatenate("train", data.splits["train"], data.splits["dev"])
    return replace(data, splits=splits)


def _phases(config: RunConfig) -> int:
    return int(config.model.args.get("num_blocks", 1)) if config.training.layerwise else 1


def refit_epochs(config: RunConfig, epochs: int) -> int:
    """Epochs a refit for the selected run's ``epochs`` trains in all (every phase runs its
    ceil(epochs / blocks) epochs: no early stopping)."""
    return math.ceil(epochs / _phases(config)) * _phases(config)


def refit_and_test(
    config: RunConfig, data: PreparedData, epochs: int, callback: EpochCallback | None = None
) -> tuple[Trainer, Evaluation]:
    """Train ``config`` on train + dev for ``epochs`` epochs; test once on the final weights.
    ``callback`` runs after each epoch (the sweep prints progress: a refit takes minutes)."""
    if epochs < 1:
        raise ValueError(f"refit needs at least one epoch, got {epochs}")
    per_phase = refit_epochs(config, epochs) // _phases(config)
    training = config.training.model_copy(
        update={"epochs": per_phase, "patience": None, "max_steps": None}
    )
    trainer = make_trainer(config.model_copy(update={"training": training}), train_plus_dev(data))
    trainer.fit(callback)
    return trainer, trainer.evaluate("test")
