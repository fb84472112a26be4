"""Numericalized splits as flat numpy arrays, their on-disk cache, and length-bucketed batches.

An ``EncodedSplit`` holds every sentence's token ids concatenated into one int32 array plus an
offsets array (sentence i is ``ids[offsets[i]:offsets[i + 1]]``): a handful of arrays pickle
in milliseconds and Ray's object store shares them zero-copy between the trials of a sweep,
where a list of 500k Python lists would be slow to pickle and copied into every worker.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from nli_models.data.batch import Batch
from nli_models.data.text import UNK, UNK_INDEX, Vocabulary

# The default pool of length-bucketed batching (training.bucket_pool_batches): each shuffled
# example lands in a pool of this many batches, sorted by length inside the pool: batches of
# similar lengths (little padding, Parikh et al. sort by length) that still differ every epoch.
BUCKET_CHUNK_BATCHES = 64

_FIELDS = ("premise_ids", "premise_offsets", "hypothesis_ids", "hypothesis_offsets", "labels")


@dataclass
class EncodedSplit:
    name: str
    premise_ids: np.ndarray  # int32 [total premise tokens]
    premise_offsets: np.ndarray  # int64 [N + 1]
    hypothesis_ids: np.ndarray  # int32 [total hypothesis tokens]
    hypothesis_offsets: np.ndarray  # int64 [N + 1]
    labels: np.ndarray  # int64 [N], index into the corpus's label tuple

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def premise_lengths(self) -> np.ndarray:
        return np.diff(self.premise_offsets)

    @property
    def hypothesis_lengths(self) -> np.ndarray:
        return np.diff(self.hypothesis_offsets)

    def premise(self, i: int) -> np.ndarray:
        return self.premise_ids[self.premise_offsets[i] : self.premise_offsets[i + 1]]

    def hypothesis(self, i: int) -> np.ndarray:
        return self.hypothesis_ids[self.hypothesis_offsets[i] : self.hypothesis_offsets[i + 1]]

    def oov_rate(self) -> float:
        """Share of tokens (premises and hypotheses) that map to <unk>."""
        tokens = self.premise_ids.size + self.hypothesis_ids.size
        unknown = np.count_nonzero(self.premise_ids == UNK_INDEX) + np.count_nonzero(
            self.hypothesis_ids == UNK_INDEX
        )
        return float(unknown / tokens) if tokens else 0.0

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {f"{self.name}/{field}": getattr(self, field) for field in _FIELDS}

    @classmethod
    def from_arrays(cls, name: str, arrays: dict[str, np.ndarray]) -> EncodedSplit:
        return cls(name, *(arrays[f"{name}/{field}"] for field in _FIELDS))


def _flatten(
    sentences: Sequence[Sequence[str]], vocab: Vocabulary
) -> tuple[np.ndarray, np.ndarray]:
    # An empty sentence would give an all-False mask row, and attention over no tokens is a
    # softmax of nothing (NaN); it is encoded as one <unk> instead.
    sentences = [tokens or [UNK] for tokens in sentences]
    offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
    np.cumsum(
        np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences)), out=offsets[1:]
    )
    return vocab.encode(chain.from_iterable(sentences)), offsets


def numericalize(
    name: str,
    premises: Sequence[Sequence[str]],
    hypotheses: Sequence[Sequence[str]],
    labels: Sequence[int],
    vocab: Vocabulary,
) -> EncodedSplit:
    """Tokenized sentences and class indices -> an ``EncodedSplit``."""
    if not len(premises) == len(hypotheses) == len(labels):
        raise ValueError(
            f"split {name!r}: {len(premises)} premises, {len(hypotheses)} hypotheses, "
            f"{len(labels)} labels"
        )
    premise_ids, premise_offsets = _flatten(premises, vocab)
    hypothesis_ids, hypothesis_offsets = _flatten(hypotheses, vocab)
    label_array = np.asarray(labels, dtype=np.int64).reshape(len(labels))
    return EncodedSplit(
        name, premise_ids, premise_offsets, hypothesis_ids, hypothesis_offsets, label_array
    )


# --- on-disk cache -----------------------------------------------------------------------------


def save_arrays(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write an .npz atomically (temp file + rename): trials of a sweep that prepare the same
    data at the same time never read a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**arrays, "__meta__": np.array(json.dumps(meta))}
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as handle:
        np.savez(handle, **payload)
    os.replace(handle.name, path)


def load_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict] | None:
    """The arrays and metadata of a cache file, or None when there is none (or it is corrupt,
    e.g. from a killed writer on a filesystem without atomic rename: it is then rebuilt)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    meta = json.loads(str(arrays.pop("__meta__")))
    return arrays, meta


# --- batching -----------------------------------------------------------------------------------


def batch_indices(
    split: EncodedSplit,
    batch_size: int,
    shuffle: bool,
    seed: int | None = None,
    epoch: int = 0,
    pool_batches: int | None = BUCKET_CHUNK_BATCHES,
) -> list[np.ndarray]:
    """The example indices of each batch of one epoch.

    ``shuffle=False``: file order, so predictions line up with the split's examples.
    ``shuffle=True``: a permutation drawn from (seed, epoch). With ``pool_batches`` (length-bucketed
    batching, as AllenNLP's bucket sampler): the permutation is cut into pools of ``pool_batches``
    batches, each pool is sorted by (premise, hypothesis) length and cut into batches, and the
    batch order is shuffled. With ``pool_batches=None`` (random batching): the permutation is cut
    into batches as it is. Same seed and epoch, same batches; ``seed=None`` draws fresh randomness.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if pool_batches is not None and pool_batches < 1:
        raise ValueError(f"pool_batches must be >= 1 or None, got {pool_batches}")
    n = len(split)
    if not shuffle:
        return [np.arange(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
    rng = np.random.default_rng(None if seed is None else [seed, epoch])
    order = rng.permutation(n)
    if pool_batches is None:
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    pool = batch_size * pool_batches
    premise_lengths, hypothesis_lengths = split.premise_lengths, split.hypothesis_lengths
    batches = []
    for start in range(0, n, pool):
        part = order[start : start + pool]
        # lexsort sorts by the last key first; it is stable, so ties keep the random order.
        part = part[np.lexsort((hypothesis_lengths[part], premise_lengths[part]))]
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def pad(ids: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sentences ``rows`` as a zero-padded int64 [B, L] matrix and its bool mask, without a
    Python loop over tokens: a [B, L] gather index is masked and read from ``ids`` at once."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    mask = np.arange(lengths.max(initial=0)) < lengths[:, None]
    out = np.zeros(mask.shape, dtype=np.int64)
    out[mask] = ids[(starts[:, None] + np.arange(mask.shape[1]))[mask]]
    return out, mask


def make_batch(split: EncodedSplit, rows: np.ndarray) -> Batch:
    premise, premise_mask = pad(split.premise_ids, split.premise_offsets, rows)
    hypothesis, hypothesis_mask = pad(split.hypothesis_ids, split.hypothesis_offsets, rows)
    return Batch(
        torch.from_numpy(premise),
        torch.from_numpy(premise_mask),
        torch.from_numpy(hypothesis),
        torch.from_numpy(hypothesis_mask),
        torch.from_numpy(split.labels[rows]),
    )


def iterate_batches(split: EncodedSplit, batches: Iterable[np.ndarray]) -> Iterator[Batch]:
    """The padded batch of each array of rows of ``batches``, lazily: one epoch of
    ``batch_indices(split, ...)`` as tensors, one batch in memory at a time."""
    for rows in batches:
        yield make_batch(split, rows)
