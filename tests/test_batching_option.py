"""training.batching: length-bucketed (pools sorted by length, batch order shuffled) or random
batches; validated, recorded with a run's params, deterministic per seed."""

from __future__ import annotations

import numpy as np
import pytest
from test_data_encode import random_split

from nli_models.config import ConfigError, RunConfig, validate_config
from nli_models.data import batch_indices, iterate_batches, prepare_data
from nli_models.data.encode import BUCKET_CHUNK_BATCHES, make_batch
from nli_models.training import make_trainer
from orchestrator.sweep.spec import logged_params

pytestmark = pytest.mark.unit

MODEL = {"name": "decomposable", "variant": "vanilla",
         "args": {"embedding_dim": 8, "projection_dim": 8, "hidden_size": 8}}
TOY = {"corpus": "toy", "toy": {"size": 120, "seed": 0}}


def ragged_split(n=2000, seed=0):
    return random_split(n, seed)[0]  # premises of 1-39 tokens, hypotheses of 1-14


def padded_tokens(split, batches) -> int:
    """Padding positions of the batches: batch size x longest sentence minus real tokens."""
    total = 0
    for rows in batches:
        for lengths in (split.premise_lengths[rows], split.hypothesis_lengths[rows]):
            total += int(lengths.max() * len(rows) - lengths.sum())
    return total


@pytest.mark.parametrize("pool", [None, 1, 4, BUCKET_CHUNK_BATCHES])
def test_every_example_exactly_once_and_same_batches_for_the_same_seed(pool):
    split = ragged_split(n=1001)  # a last partial batch and a last partial pool

    def epoch(seed, number):
        return [b.tolist() for b in batch_indices(split, 32, True, seed, number, pool_batches=pool)]

    rows = np.concatenate([np.asarray(b) for b in epoch(3, 1)])
    assert sorted(rows.tolist()) == list(range(len(split)))
    assert all(1 <= len(b) <= 32 for b in epoch(3, 1))
    assert epoch(3, 1) == epoch(3, 1)
    assert epoch(3, 1) != epoch(4, 1) and epoch(3, 1) != epoch(3, 2)


def test_bucketed_batches_pad_less_than_random_ones_and_more_pool_less_padding():
    split = ragged_split()
    padding = {pool: padded_tokens(split, batch_indices(split, 32, True, 0, 1, pool_batches=pool))
               for pool in (None, 1, 8, 64)}
    assert padding[64] < 0.35 * padding[None]
    assert padding[64] < padding[8] < padding[1]
    # a pool of one batch sorts inside the batch only: the same batches as random ones
    assert padding[1] == padding[None]


def test_random_batches_are_cut_from_the_seeded_permutation():
    split = ragged_split(n=100)
    batches = batch_indices(split, 32, True, 7, 2, pool_batches=None)
    order = np.random.default_rng([7, 2]).permutation(100)
    assert [b.tolist() for b in batches] == [order[i:i + 32].tolist() for i in range(0, 100, 32)]
    padded = list(iterate_batches(split, batches))
    assert [len(b) for b in padded] == [32, 32, 32, 4]
    assert padded[1].label.tolist() == split.labels[order[32:64]].tolist()


def test_bad_pool_size_is_refused():
    with pytest.raises(ValueError, match="pool_batches must be >= 1 or None, got 0"):
        batch_indices(ragged_split(n=10), 4, True, 0, 0, pool_batches=0)


def config(**training) -> RunConfig:
    return RunConfig.model_validate({"name": "t", "model": MODEL, "data": TOY,
                                     "training": {"epochs": 1, "batch_size": 16, **training}})


def test_config_validates_the_option_and_names_the_allowed_values():
    assert config().training.batching == "bucketed"
    assert config().training.bucket_pool_batches == BUCKET_CHUNK_BATCHES
    raw = {"name": "t", "model": MODEL, "data": TOY, "training": {"batching": "sorted"}}
    with pytest.raises(ConfigError, match=r"x.yaml: training.batching: .*'bucketed' or 'random'.*'sorted'"):
        validate_config(RunConfig, raw, "x.yaml")
    raw["training"] = {"bucket_pool_batches": 0}
    with pytest.raises(ConfigError, match=r"x.yaml: training.bucket_pool_batches: .*greater than or equal to 1"):
        validate_config(RunConfig, raw, "x.yaml")


def test_the_option_is_recorded_in_the_run_params():
    params = logged_params(config(batching="random", bucket_pool_batches=8))
    assert params["batching"] == "random" and params["bucket_pool_batches"] == 8


@pytest.mark.parametrize(("batching", "pool"), [("random", None), ("bucketed", 2)])
def test_the_trainer_batches_as_configured(tmp_path, batching, pool):
    run = config(batching=batching, bucket_pool_batches=2)
    trainer = make_trainer(run, prepare_data(TOY, cache_dir=tmp_path))
    train = trainer.data.splits["train"]
    expected = batch_indices(train, 16, True, run.training.seed, 1, pool_batches=pool)
    got = list(trainer._batches("train", shuffle=True, epoch=1))
    assert len(got) == len(expected)
    for batch, rows in zip(got, expected, strict=True):
        assert batch.premise.equal(make_batch(train, rows).premise)
        assert batch.hypothesis.equal(make_batch(train, rows).hypothesis)
