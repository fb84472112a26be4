"""Accuracy, loss and per-class accuracy of a model over one split."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from nli_models.data.batch import Batch


@dataclass
class Evaluation:
    loss: float
    accuracy: float
    class_accuracy: dict[str, float]  # recall of each gold class
    predictions: np.ndarray  # predicted class ids, in the split's order of examples seen
    gold: np.ndarray


def class_accuracy(gold: np.ndarray, predicted: np.ndarray, labels: tuple[str, ...]) -> dict[str, float]:
    result = {}
    for index, label in enumerate(labels):
        rows = gold == index
        result[label] = float((predicted[rows] == index).mean()) if rows.any() else float("nan")
    return result


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    labels: tuple[str, ...],
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> Evaluation:
    was_training = model.training
    model.eval()
    # Loss, predictions and labels stay on the device until the end: a float() or .cpu() per
    # batch would wait for the GPU at every batch.
    total_loss, predictions, gold = torch.zeros((), dtype=torch.float64, device=device), [], []
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(*batch.inputs())
        total_loss += nn.functional.cross_entropy(logits.float(), batch.label, reduction="sum")
        predictions.append(logits.argmax(dim=1))
        gold.append(batch.label)
    model.train(was_training)
    predicted = torch.cat(predictions).cpu().numpy() if predictions else np.zeros(0, dtype=np.int64)
    gold_ids = torch.cat(gold).cpu().numpy() if gold else np.zeros(0, dtype=np.int64)
    count = max(len(gold_ids), 1)
    return Evaluation(
        loss=float(total_loss) / count,
        accuracy=float((predicted == gold_ids).sum() / count),
        class_accuracy=class_accuracy(gold_ids, predicted, labels),
        predictions=predicted,
        gold=gold_ids,
    )
