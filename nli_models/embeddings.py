"""The word-embedding table every model exposes as ``model.word_embeddings``.

Papers differ in which rows are tuned: Rocktäschel and CAM keep pretrained vectors fixed and tune
only out-of-vocabulary rows; Parikh and Yin keep every row fixed; without vectors every row is
tuned. ``trainable_rows`` (a per-row mask) says which, and the lookup is shaped so that only tuned
rows ever get a gradient and an optimizer step:

- all rows tuned: an ordinary embedding;
- no row tuned: the table is not a trainable parameter, so there is no [V, D] gradient at all;
- some rows tuned: the table is not trainable either, and the tuned rows come from ``tuned_weight``, a
  small [n_tuned, D] parameter of their own. A masked [V, D] gradient would be zeroed, scattered
  into and stepped over every batch; at vocabulary 20k x 300 that was most of a CPU step for
  small models (benchmarks/README.md, "throughput").

Checkpoints keep one [V, D] table: ``state_dict()`` folds ``tuned_weight`` into
``embedding.weight`` and leaves it out; loading splits the table again.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

PAD_INDEX = 0
TUNED_KEY = "tuned_weight"


class WordEmbeddings(nn.Module):
    def __init__(self, vocab_size: int, embedding_dim: int):
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (padding + one word), got {vocab_size}")
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {embedding_dim}")
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=PAD_INDEX)
        nn.init.uniform_(self.embedding.weight, -0.05, 0.05)
        with torch.no_grad():
            self.embedding.weight[PAD_INDEX].zero_()
        self.register_buffer("trainable_rows", torch.ones(vocab_size, dtype=torch.bool))
        self.tuned_weight = nn.Parameter(torch.empty(0, embedding_dim), requires_grad=False)
        # Row -> its index in tuned_weight, -1 for a fixed row.
        self.register_buffer("tuned_slot", torch.full((vocab_size,), -1), persistent=False)
        self._tuned = "all"  # "all" | "some" | "none": read per batch, so kept off the device
        self.register_state_dict_pre_hook(_fold_tuned_rows)
        self.register_state_dict_post_hook(_drop_tuned_key)
        self.register_load_state_dict_pre_hook(_expect_tuned_key)
        self.register_load_state_dict_post_hook(_split_after_load)

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    @property
    def embedding_dim(self) -> int:
        return self.embedding.embedding_dim

    def _split(self) -> None:
        """Set the lookup mode from ``trainable_rows`` and copy tuned rows into tuned_weight."""
        rows = self.trainable_rows.nonzero().squeeze(1)
        self._tuned = "all" if len(rows) == self.vocab_size else "some" if len(rows) else "none"
        if self._tuned != "some":
            rows = rows[:0]
        self.tuned_slot.fill_(-1)
        self.tuned_slot[rows] = torch.arange(len(rows), device=rows.device)
        self.tuned_weight.data = self.embedding.weight.detach()[rows].clone()
        # Only what gets a gradient is a trainable parameter: the optimizer keeps no state (Adagrad
        # a [V, D] accumulator) for the rest. Set once the rows are known, before the optimizer.
        self.tuned_weight.requires_grad_(self._tuned == "some")
        self.embedding.weight.requires_grad_(self._tuned == "all")

    def fold(self) -> None:
        """Write the tuned rows' current values back into ``embedding.weight``."""
        if self._tuned == "some":
            with torch.no_grad():
                self.embedding.weight[self.trainable_rows] = self.tuned_weight

    def full_weight(self) -> torch.Tensor:
        """The whole [V, D] table as trained so far (detached)."""
        self.fold()
        return self.embedding.weight.detach()

    def load(self, weight: torch.Tensor, trainable_rows: torch.Tensor) -> None:
        """Copy a (vocab_size, embedding_dim) matrix in and set which rows are tuned."""
        expected = tuple(self.embedding.weight.shape)
        if tuple(weight.shape) != expected:
            raise ValueError(
                f"embedding matrix has shape {tuple(weight.shape)} but the model was built with "
                f"vocab_size={expected[0]}, embedding_dim={expected[1]}"
            )
        if tuple(trainable_rows.shape) != (expected[0],):
            raise ValueError(
                f"trainable_rows has shape {tuple(trainable_rows.shape)}, expected ({expected[0]},)"
            )
        with torch.no_grad():
            self.embedding.weight.copy_(weight)
            self.trainable_rows.copy_(trainable_rows.to(torch.bool))
        self._split()

    def num_trainable(self) -> int:
        """Number of tuned embedding parameters (the W in |θ|W+M)."""
        return int(self.trainable_rows.sum()) * self.embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self._tuned == "all":
            return self.embedding(ids)
        fixed = F.embedding(ids, self.embedding.weight, PAD_INDEX)  # not trainable: no gradient
        if self._tuned == "none":
            return fixed
        slot = self.tuned_slot[ids]
        tuned = F.embedding(slot.clamp(min=0), self.tuned_weight)
        return torch.where((slot >= 0).unsqueeze(-1), tuned, fixed)


def _fold_tuned_rows(module: WordEmbeddings, prefix: str, keep_vars: bool) -> None:
    module.fold()


def _drop_tuned_key(module: WordEmbeddings, state_dict: dict, prefix: str, local_metadata) -> None:
    state_dict.pop(prefix + TUNED_KEY, None)


def _expect_tuned_key(module: WordEmbeddings, state_dict: dict, prefix: str, *args) -> None:
    # Saved tables hold no tuned_weight (folded in); the post hook splits the loaded table.
    state_dict.setdefault(prefix + TUNED_KEY, module.tuned_weight.detach())


def _split_after_load(module: WordEmbeddings, _incompatible_keys) -> None:
    module._split()
