"""The tensor batch every model consumes: token ids plus padding masks (True = real token)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch.nn import functional as F

from nli_models.embeddings import PAD_INDEX

# The padded lengths a batch takes where shapes must repeat (a CUDA graph is captured per shape):
# steps of about 1.5x, so a sentence gets at most 50% padding (SNLI: about 8 lengths per side).
# Longer sentences pad to a multiple of LONG_LENGTH_STEP (at most 50% again, too).
STATIC_LENGTHS = (8, 12, 16, 24, 32, 48, 64, 96, 128)
LONG_LENGTH_STEP = 64


def static_length(length: int) -> int:
    """The smallest of STATIC_LENGTHS that holds ``length`` (beyond them, the next multiple of
    LONG_LENGTH_STEP)."""
    for candidate in STATIC_LENGTHS:
        if length <= candidate:
            return candidate
    return -(-length // LONG_LENGTH_STEP) * LONG_LENGTH_STEP


@dataclass
class Batch:
    premise: torch.Tensor  # int64 [B, Lp]
    premise_mask: torch.Tensor  # bool [B, Lp]
    hypothesis: torch.Tensor  # int64 [B, Lh]
    hypothesis_mask: torch.Tensor  # bool [B, Lh]
    label: torch.Tensor  # int64 [B]

    def _map(self, function) -> Batch:
        return Batch(*(function(getattr(self, f.name)) for f in fields(self)))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        return self._map(lambda t: t.pin_memory())

    def padded_to_static_lengths(self) -> Batch:
        """The same batch with premise and hypothesis padded to ``static_length`` of their length
        (padding is masked, so every model's output is unchanged)."""
        def pad(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            extra = static_length(ids.shape[1]) - ids.shape[1]
            return F.pad(ids, (0, extra), value=PAD_INDEX), F.pad(mask, (0, extra), value=False)

        premise, premise_mask = pad(self.premise, self.premise_mask)
        hypothesis, hypothesis_mask = pad(self.hypothesis, self.hypothesis_mask)
        return Batch(premise, premise_mask, hypothesis, hypothesis_mask, self.label)

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positional arguments of every model's forward()."""
        return self.premise, self.premise_mask, self.hypothesis, self.hypothesis_mask

    def __len__(self) -> int:
        return int(self.label.shape[0])
