"""The contract every registered model meets: a batch of (premise, hypothesis) pairs in, class
logits out, and on request the attention maps that the figures draw.

A model subclasses ``PairClassifier`` and implements ``classify``; ``forward`` is the one place
that states the inputs and what ``return_attention`` returns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch
from torch import nn

from nli_models.models import layers


class Sentences(NamedTuple):
    """One side of a batch of pairs: token ids [B, L] and their padding mask [B, L] (True = word)."""

    ids: torch.Tensor
    mask: torch.Tensor


class PairClassifier(nn.Module, ABC):
    def forward(
        self,
        premise: torch.Tensor,
        premise_mask: torch.Tensor,
        hypothesis: torch.Tensor,
        hypothesis_mask: torch.Tensor,
        return_attention: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Logits [B, num_classes]; with ``return_attention``, (logits, attention maps by name),
        the names and shapes each model's ``classify`` documents (empty where it has none)."""
        if not layers.lengths_checked():
            self.check_lengths(premise_mask, hypothesis_mask)
        logits, attention = self.classify(
            Sentences(premise, premise_mask), Sentences(hypothesis, hypothesis_mask)
        )
        return (logits, attention) if return_attention else logits

    @classmethod
    def check_longest_sentence(cls, args, tokens: int) -> None:
        """Refuse, before any model is built, a corpus whose longest sentence has more tokens than
        a model of these arguments takes (what ``check_lengths`` would refuse in its first batch
        that holds it): a ``ValueError`` naming the argument and the value it needs. None by
        default; a sweep checks every configuration against its corpus before launch.

        Args:
            args: the model's validated ``Arguments``.
            tokens: the corpus's longest sentence (premise or hypothesis, every split).
        """

    def check_lengths(self, premise_mask: torch.Tensor, hypothesis_mask: torch.Tensor) -> None:
        """Refuse sentences longer than the model takes (none by default): a ``ValueError`` where
        the masks are on the host, a device-side assertion elsewhere (no host read).

        Args:
            premise_mask, hypothesis_mask: the batch's masks, [..., L] (True = word).
        """

    @abstractmethod
    def classify(
        self, premise: Sentences, hypothesis: Sentences
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(logits [B, num_classes], attention maps by name) of each pair of the batch."""
