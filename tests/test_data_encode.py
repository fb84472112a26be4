"""Numericalized splits, padding masks and length-bucketed batches."""

import pickle

import numpy as np
import pytest
import torch

from nli_models.data import Vocabulary, batch_indices, iterate_batches, numericalize
from nli_models.data.encode import make_batch
from nli_models.data.text import UNK_INDEX

pytestmark = pytest.mark.unit


def random_split(n=1000, seed=0):
    """Sentences of varied lengths whose token ids encode (example, position) for checking."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(50)]
    vocab = Vocabulary(["<pad>", "<unk>", *words])
    premises = [list(rng.choice(words, rng.integers(1, 40))) for _ in range(n)]
    hypotheses = [list(rng.choice(words, rng.integers(1, 15))) for _ in range(n)]
    labels = rng.integers(0, 3, n).tolist()
    return numericalize("train", premises, hypotheses, labels, vocab), premises, vocab


def test_numericalize_flat_arrays_round_trip():
    vocab = Vocabulary(["<pad>", "<unk>", "a", "man", "sleeps"])
    split = numericalize("dev", [["a", "man"], []], [["sleeps"], ["a", "dog"]], [2, 0], vocab)
    assert split.premise_ids.dtype == np.int32 and split.premise_offsets.dtype == np.int64
    assert split.premise(0).tolist() == [2, 3]
    assert split.premise(1).tolist() == [UNK_INDEX]  # empty sentence -> one <unk>, never 0 tokens
    assert split.hypothesis(1).tolist() == [2, UNK_INDEX]
    assert split.labels.tolist() == [2, 0]
    assert split.oov_rate() == pytest.approx(2 / 6)
    with pytest.raises(ValueError, match="2 premises, 1 hypotheses"):
        numericalize("dev", [["a"], ["a"]], [["a"]], [0, 0], vocab)


def test_batches_are_padded_with_correct_masks():
    split, premises, vocab = random_split(n=37)
    batches = list(iterate_batches(split, batch_indices(split, batch_size=8, shuffle=False)))
    assert [len(b) for b in batches] == [8, 8, 8, 8, 5]
    first = batches[0]
    assert first.premise.dtype == torch.int64 and first.premise_mask.dtype == torch.bool
    for row in range(8):
        length = len(premises[row])
        assert first.premise_mask[row].sum() == length
        assert first.premise[row, :length].tolist() == vocab.encode(premises[row]).tolist()
        assert (first.premise[row, length:] == 0).all()
    assert first.premise.shape[1] == max(len(p) for p in premises[:8])
    assert first.label.tolist() == split.labels[:8].tolist()


def test_every_example_exactly_once_per_epoch():
    split, _, _ = random_split()
    for shuffle in (False, True):
        rows = np.concatenate(batch_indices(split, 32, shuffle=shuffle, seed=0, epoch=3))
        assert sorted(rows.tolist()) == list(range(len(split)))
    labels = torch.cat([b.label for b in iterate_batches(split, batch_indices(split, 32, shuffle=True, seed=1))])
    assert sorted(labels.tolist()) == sorted(split.labels.tolist())


def test_shuffled_batches_are_deterministic_per_seed_and_epoch():
    split, _, _ = random_split()

    def order(seed, epoch):
        return [b.tolist() for b in batch_indices(split, 32, shuffle=True, seed=seed, epoch=epoch)]

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)
    a, b = (list(iterate_batches(split, batch_indices(split, 32, True, seed=5, epoch=2))) for _ in range(2))
    assert all(torch.equal(x.premise, y.premise) for x, y in zip(a, b, strict=True))


def padding(batches):
    return sum(int((~b.premise_mask).sum() + (~b.hypothesis_mask).sum()) for b in batches)


def test_bucketing_reduces_padding_against_random_batches():
    split, _, _ = random_split(n=2000)
    bucketed = list(iterate_batches(split, batch_indices(split, 32, shuffle=True, seed=0)))
    rng = np.random.default_rng(0)
    order = rng.permutation(len(split))
    random_batches = [make_batch(split, order[i : i + 32]) for i in range(0, len(split), 32)]
    assert padding(bucketed) < 0.35 * padding(random_batches)


def test_encoded_split_pickles_as_a_few_arrays():
    split, _, _ = random_split(n=5000)
    payload = pickle.dumps(split)
    raw = sum(array.nbytes for array in split.to_arrays().values())
    assert len(payload) < raw + 2000
