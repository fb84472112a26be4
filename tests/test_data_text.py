"""Tokenizer and vocabulary."""

import pickle

import numpy as np
import pytest

from nli_models.data import Vocabulary, tokenize
from nli_models.data.text import PAD, UNK, UNK_INDEX

pytestmark = pytest.mark.unit


def test_tokenizer_splits_raw_text_like_the_tokenized_snli_test_set():
    raw = "A man's dog doesn't like \"cats\"... He is 3.5 ft tall, wears a t-shirt."
    assert tokenize(raw) == [
        "A", "man", "'s", "dog", "does", "n't", "like", '"', "cats", '"', "...",
        "He", "is", "3.5", "ft", "tall", ",", "wears", "a", "t-shirt", ".",
    ]  # fmt: skip
    already = "Two women are n't holding `` to go '' packages ."
    assert tokenize(already) == already.split()
    assert tokenize("The DOG .", lowercase=True) == ["the", "dog", "."]


def test_vocabulary_min_count_order_and_special_rows():
    sentences = [["the", "cat", "sat"], ["the", "dog", "sat"], ["the", "cat"]]
    vocab = Vocabulary.build(sentences, min_count=2)
    assert vocab.itos == [PAD, UNK, "the", "cat", "sat"]  # by count, ties alphabetical
    assert vocab.index("dog") == UNK_INDEX
    ids = vocab.encode(["cat", "bird"])
    assert ids.dtype == np.int32 and ids.tolist() == [3, UNK_INDEX]
    assert len(Vocabulary.build(sentences, min_count=1)) == 6
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.build(sentences, min_count=0)


def test_vocabulary_lowercase_merges_cases_and_lowercases_lookups():
    vocab = Vocabulary.build([["The", "cat"], ["the", "Cat"]], min_count=2, lowercase=True)
    assert vocab.itos == [PAD, UNK, "cat", "the"]
    assert vocab.index("THE") == vocab.index("the") == 3
    cased = Vocabulary.build([["The", "cat"], ["the", "Cat"]], min_count=2)
    assert cased.itos == [PAD, UNK]


def test_vocabulary_extend_save_load_and_pickle(tmp_path):
    vocab = Vocabulary.build([["a", "b"]]).extend(["zebra", "a", "yak"])
    assert vocab.itos[-2:] == ["yak", "zebra"]
    vocab.save(tmp_path / "vocab.json")
    loaded = Vocabulary.load(tmp_path / "vocab.json")
    assert loaded == vocab and loaded.stoi == vocab.stoi
    assert pickle.loads(pickle.dumps(vocab)).index("yak") == vocab.index("yak")
    with pytest.raises(ValueError, match="starts with"):
        Vocabulary(["a", "b"])
