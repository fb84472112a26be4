"""The tensor batch every model consumes: token ids plus padding masks (True = real token)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    premise: torch.Tensor  # int64 [B, Lp]
    premise_mask: torch.Tensor  # bool [B, Lp]
    hypothesis: torch.Tensor  # int64 [B, Lh]
    hypothesis_mask: torch.Tensor  # bool [B, Lh]
    label: torch.Tensor  # int64 [B]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            *(
                t.to(device, non_blocking=non_blocking)
                for t in (
                    self.premise,
                    self.premise_mask,
                    self.hypothesis,
                    self.hypothesis_mask,
                    self.label,
                )
            )
        )

    def pin_memory(self) -> Batch:
        return Batch(
            *(
                t.pin_memory()
                for t in (
                    self.premise,
                    self.premise_mask,
                    self.hypothesis,
                    self.hypothesis_mask,
                    self.label,
                )
            )
        )

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positional arguments of every model's forward()."""
        return self.premise, self.premise_mask, self.hypothesis, self.hypothesis_mask

    def __len__(self) -> int:
        return int(self.label.shape[0])
