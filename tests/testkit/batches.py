"""The one builder of model inputs for the model tests: padded id tensors and their masks."""

from __future__ import annotations

from collections.abc import Sequence


def padded(sentences: Sequence[Sequence[int]]):
    """(ids, mask): the sentences' ids, padded with PAD_INDEX to the longest, and where they are."""
    import torch

    from nli_models.embeddings import PAD_INDEX

    ids = torch.full((len(sentences), max(map(len, sentences))), PAD_INDEX, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        ids[row, : len(sentence)] = torch.as_tensor(sentence, dtype=torch.long)
    return ids, ids != PAD_INDEX


def random_batch(premise_lengths: Sequence[int], hypothesis_lengths: Sequence[int], *,
                 low: int, high: int, seed: int):
    """(premise, premise_mask, hypothesis, hypothesis_mask): sentences of the given lengths, word
    ids drawn uniformly from [low, high) (low >= 1: none is padding), a full premise matrix
    first, from a generator seeded with `seed`."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def sentences(lengths):
        mask = torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]
        return torch.randint(low, high, mask.shape, generator=generator) * mask, mask

    return (*sentences(premise_lengths), *sentences(hypothesis_lengths))
