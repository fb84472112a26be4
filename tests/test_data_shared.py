"""The readers and prepare_data on the real corpora in ../shared/data (development machines).

The ``shared_data`` fixture (conftest.py) skips these tests with a reason where it is absent.
"""

import os
from collections import Counter

import pytest

from nli_models.data import Columns, prepare_data, read_rte, read_sick, read_snli, read_tsv

pytestmark = pytest.mark.shared_data


def test_snli_dev(shared_data):
    split = read_snli(shared_data / "snli_1.0" / "snli_1.0_dev.jsonl", "dev")
    assert len(split) == 9842
    assert Counter(e.label for e in split.examples) == {
        "entailment": 3329,
        "neutral": 3235,
        "contradiction": 3278,
    }


def test_sick_split_counts(shared_data):
    path = shared_data / "sick" / "SICK.txt"
    assert [len(read_sick(path, name)) for name in ("train", "dev", "test")] == [4439, 495, 4906]


def test_rte_and_mnli_samples(shared_data):
    rte = {
        name: read_rte(shared_data / "rte" / f"{name}.tsv", name)
        for name in ("train", "dev", "test")
    }
    assert sum(len(split) for split in rte.values()) == 2767
    assert {e.label for e in rte["train"].examples} == {"entailment", "not_entailment"}
    mnli = read_tsv(
        shared_data / "mnli_samples" / "mnli_matched",
        Columns(label=0, premise=1, hypothesis=2),
        header=False,
    )
    assert len(mnli) == 1000


def test_prepare_snli_dev_holdout_and_test(shared_data, tmp_path):
    config = {
        "corpus": "snli",
        "data_dir": os.path.relpath(shared_data),
        "files": {"train": "snli_1.0/snli_1.0_dev.jsonl"},
        "dev_holdout": {"fraction": 0.1, "seed": 0},
    }
    prepared = prepare_data(config, cache_dir=tmp_path)
    sizes = {name: len(split) for name, split in prepared.splits.items()}
    assert sizes["train"] + sizes["dev"] == 9842 and sizes["test"] == 9824
    assert 0.08 < sizes["dev"] / 9842 < 0.12
    assert prepared.splits["test"].oov_rate() < 0.1
    assert prepare_data(config, cache_dir=tmp_path).from_cache
