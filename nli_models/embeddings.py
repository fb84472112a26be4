"""The word-embedding table every model exposes as ``model.word_embeddings``.

Papers differ in which rows are tuned: Rocktäschel and CAM keep pretrained vectors fixed and tune
only out-of-vocabulary rows; Parikh and Yin keep every row fixed; without vectors every row is
tuned. One table with a per-row trainable mask covers all of them: the gradient of frozen rows is
zeroed by a hook, so Adam/Adagrad never move them (a zero gradient gives a zero update). When no
row is tuned, the lookup reads a detached table: no [V, D] gradient is zeroed, scattered into and
stepped over every batch (at vocabulary 20k x 300 that was most of a CPU step for small models).
"""

from __future__ import annotations

import torch
from torch import nn

PAD_INDEX = 0


def _count_tuned_after_load(module: WordEmbeddings, _incompatible_keys) -> None:
    module._count_tuned()  # trainable_rows came from the state dict


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
        self._tuned = "all"  # "all" | "some" | "none": read per batch, so kept off the device
        self.embedding.weight.register_hook(self._mask_gradient)
        self.register_load_state_dict_post_hook(_count_tuned_after_load)

    @property
    def vocab_size(self) -> int:
        return self.embedding.num_embeddings

    @property
    def embedding_dim(self) -> int:
        return self.embedding.embedding_dim

    def _count_tuned(self) -> None:
        tuned = int(self.trainable_rows.sum())
        self._tuned = "all" if tuned == self.vocab_size else "some" if tuned else "none"

    def _mask_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        if self._tuned == "all":
            return grad
        return grad * self.trainable_rows.unsqueeze(1).to(grad.dtype)

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
        self._count_tuned()

    def num_trainable(self) -> int:
        """Number of tuned embedding parameters (the W in |θ|W+M)."""
        return int(self.trainable_rows.sum()) * self.embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self._tuned == "none":
            return nn.functional.embedding(ids, self.embedding.weight.detach(), PAD_INDEX)
        return self.embedding(ids)
