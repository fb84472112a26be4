"""Grouped holdout and deterministic subsampling."""

import pytest

from nli_models.data import NLIExample, NLISplit, grouped_holdout, subsample

pytestmark = pytest.mark.unit


def corpus(premises=200, per_premise=3):
    examples = [
        NLIExample(f"premise {p}", f"hypothesis {p}-{h}", "neutral", pair_id=f"{p}-{h}")
        for p in range(premises)
        for h in range(per_premise)
    ]
    return NLISplit("train", examples, ("entailment", "neutral", "contradiction"))


def test_holdout_keeps_each_premise_on_one_side_and_respects_fraction():
    split = corpus()
    rest, dev = grouped_holdout(split, 0.1, seed=3)
    rest_premises = {e.premise for e in rest.examples}
    dev_premises = {e.premise for e in dev.examples}
    assert not rest_premises & dev_premises
    assert len(dev_premises) == 20  # 10% of 200 premises
    assert len(dev) == 60 and len(rest) == 540  # whole groups move
    assert dev.name == "dev" and rest.name == "train"
    assert dev.labels == split.labels
    # order within each side is the original order
    assert [e.pair_id for e in rest.examples] == [
        e.pair_id for e in split.examples if e.premise in rest_premises
    ]


def test_holdout_is_deterministic_and_depends_on_seed_not_on_file_order():
    split = corpus()
    first = grouped_holdout(split, 0.2, seed=1)[1]
    again = grouped_holdout(split, 0.2, seed=1)[1]
    other = grouped_holdout(split, 0.2, seed=2)[1]
    reversed_split = NLISplit("train", split.examples[::-1], split.labels)
    from_reversed = grouped_holdout(reversed_split, 0.2, seed=1)[1]
    assert [e.pair_id for e in first.examples] == [e.pair_id for e in again.examples]
    assert {e.premise for e in first.examples} != {e.premise for e in other.examples}
    assert {e.premise for e in first.examples} == {e.premise for e in from_reversed.examples}


def test_holdout_by_example_and_bad_fractions():
    split = corpus(premises=10, per_premise=10)
    rest, dev = grouped_holdout(split, 0.25, seed=0, group_by="example")
    assert len(dev) == 25 and len(rest) == 75
    for fraction in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            grouped_holdout(split, fraction)
    with pytest.raises(ValueError, match="one side empty"):
        grouped_holdout(corpus(premises=3), 0.1)


def test_subsample_is_deterministic_and_keeps_order():
    split = corpus()
    small = subsample(split, 50, seed=0)
    assert len(small) == 50
    ids = [e.pair_id for e in small.examples]
    positions = [split.examples.index(e) for e in small.examples]
    assert positions == sorted(positions)
    assert ids == [e.pair_id for e in subsample(split, 50, seed=0).examples]
    assert ids != [e.pair_id for e in subsample(split, 50, seed=1).examples]
    assert subsample(split, 10_000) is split
