"""What static shapes cost in padding: the training batches of one epoch (length-bucketed, as the
trainer makes them) padded to their longest sentence, as in eager training, and to
``nli_models.data.batch.STATIC_LENGTHS``, as when the training step runs as CUDA graphs (one
graph per distinct shape). Lengths: every pair of SNLI dev (``../shared/data``; 9,842 pairs, as
they are), else 10,000 pairs of synthetic SNLI-like lengths; batch sizes 32 and 128.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import Context, log, md_table

NAME = "static_shapes"
TITLE = "Static shapes for CUDA graphs: padding cost and distinct batch shapes per epoch"
BATCH_SIZES = (32, 128)


def epoch_shapes(split, batch_size: int) -> dict[str, Any]:
    """Real, eagerly padded and statically padded token positions of one bucketed epoch, and how
    many distinct (batch, premise, hypothesis) shapes each gives."""
    from nli_models.data.batch import static_length
    from nli_models.data.encode import batch_indices

    real = eager = static = 0
    eager_shapes, static_shapes = set(), set()
    for rows in batch_indices(split, batch_size, shuffle=True, seed=1, epoch=1):
        premise, hypothesis = split.premise_lengths[rows], split.hypothesis_lengths[rows]
        lp, lh = int(premise.max()), int(hypothesis.max())
        real += int(premise.sum() + hypothesis.sum())
        eager += len(rows) * (lp + lh)
        static += len(rows) * (static_length(lp) + static_length(lh))
        eager_shapes.add((len(rows), lp, lh))
        static_shapes.add((len(rows), static_length(lp), static_length(lh)))
    return {"batch_size": batch_size, "real_positions": real, "eager_positions": eager,
            "static_positions": static, "static_over_eager": static / eager,
            "eager_shapes": len(eager_shapes), "static_shapes": len(static_shapes)}


def lengths_split(premise_lengths, hypothesis_lengths):
    """An EncodedSplit with these lengths (token ids are irrelevant here: all 2)."""
    import numpy as np

    from nli_models.data import EncodedSplit

    def flat(lengths):
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return np.full(int(offsets[-1]), 2, dtype=np.int32), offsets

    labels = np.zeros(len(premise_lengths), dtype=np.int64)
    return EncodedSplit("train", *flat(premise_lengths), *flat(hypothesis_lengths), labels)


def run(ctx: Context) -> dict[str, Any]:
    from benchmarks.common import sample_lengths, snli_lengths

    premise, hypothesis, source = snli_lengths(ctx.shared_data if ctx.has_snli() else None)
    if not len(premise):
        premise, hypothesis, info = sample_lengths(10_000, None)
        source = info["source"]
    split = lengths_split(premise, hypothesis)
    lengths = {"source": source, "pairs": len(premise), "longest": [int(premise.max()), int(hypothesis.max())]}
    rows = [epoch_shapes(split, b) for b in BATCH_SIZES]
    for row in rows:
        log(f"b{row['batch_size']}: static/eager positions {row['static_over_eager']:.3f}, "
            f"shapes {row['eager_shapes']} -> {row['static_shapes']}")
    table = md_table(
        ["batch", "real positions", "eager padding", "static padding", "static / eager", "shapes eager", "shapes static"],
        [[r["batch_size"], f"{r['real_positions']:,}", f"{r['eager_positions']:,}", f"{r['static_positions']:,}",
          f"{r['static_over_eager']:.3f}", r["eager_shapes"], r["static_shapes"]] for r in rows])
    return {"lengths": lengths, "rows": rows, "summary_md": table}
