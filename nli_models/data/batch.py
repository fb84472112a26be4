"""The tensor batch every model consumes: token ids plus padding masks (True = real token)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


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

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positional arguments of every model's forward()."""
        return self.premise, self.premise_mask, self.hypothesis, self.hypothesis_mask

    def __len__(self) -> int:
        return int(self.label.shape[0])
