"""Carving splits: a grouped holdout (dev out of train) and a deterministic subsample.

Both decide with a seeded hash of a key instead of a shuffled list, so the choice depends only on
the seed and the key, not on the file's order, and holding out from a grown corpus keeps the
groups it held out before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from nli_models.data.records import NLIExample, NLISplit

GroupBy = Literal["premise", "example"]


def _rank(seed: int, key: str) -> bytes:
    """Stable pseudo-random rank of a key (Python's hash() is salted per process)."""
    return hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()


def _group_keys(split: NLISplit, group_by: GroupBy) -> list[str]:
    key: Callable[[int, NLIExample], str] = {
        # A premise with all its hypotheses goes to one side, so a model never sees at test time
        # a premise it was trained on (SNLI pairs every premise with ~3 hypotheses).
        "premise": lambda i, example: example.premise,
        "example": lambda i, example: str(i),
    }[group_by]
    return [key(i, example) for i, example in enumerate(split.examples)]


def grouped_holdout(
    split: NLISplit,
    fraction: float,
    seed: int = 0,
    group_by: GroupBy = "premise",
    holdout_name: str = "dev",
) -> tuple[NLISplit, NLISplit]:
    """Move ``round(fraction * groups)`` whole groups of ``split`` into a new split.

    The fraction is of groups (e.g. of distinct premises), so the share of examples is close to,
    not exactly, ``fraction``. Returns ``(rest, holdout)``, both in the original order.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must be between 0 and 1 (exclusive), got {fraction}")
    keys = _group_keys(split, group_by)
    groups = sorted(set(keys), key=lambda key: _rank(seed, key))
    count = round(fraction * len(groups))
    if count == 0 or count == len(groups):
        raise ValueError(
            f"a {fraction:.0%} holdout of {len(groups)} groups ({group_by}) of split "
            f"{split.name!r} would leave one side empty"
        )
    held = set(groups[:count])
    rest = [example for example, key in zip(split.examples, keys, strict=True) if key not in held]
    out = [example for example, key in zip(split.examples, keys, strict=True) if key in held]
    meta = {"holdout_of": split.name, "fraction": fraction, "seed": seed, "group_by": group_by}
    return (
        replace(split, examples=rest, meta={**split.meta, "holdout_removed": meta}),
        replace(split, name=holdout_name, examples=out, meta={**split.meta, "holdout": meta}),
    )


def subsample(split: NLISplit, max_examples: int, seed: int = 0) -> NLISplit:
    """At most ``max_examples`` examples, chosen by a seeded hash, kept in file order."""
    if max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    if len(split) <= max_examples:
        return split
    ranked = sorted(range(len(split)), key=lambda i: _rank(seed, str(i)))
    chosen = sorted(ranked[:max_examples])
    return replace(
        split,
        examples=[split.examples[i] for i in chosen],
        meta={**split.meta, "subsampled_from": len(split)},
    )
