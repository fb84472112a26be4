"""Training pairs/s of four paper models against public PyTorch implementations at issue 17's
setup, and against a minimal reference of each public implementation's style timed in the same run.

Setup (issue 17, item 3): 2 torch threads, batch 32, real SNLI dev pairs (our tokenizer,
lowercased) padded to the batch maximum, in random order and in length-bucketed order
(``batch_indices`` with pools of 64 batches), 300-d vectors, the training step of the trainer
(forward + cross-entropy, zero_grad + backward, optimizer step). The vectors are random N(0, 1)
(GloVe 300d is not available here; the values do not change the cost), fixed where the paper
fixes them: every row for Parikh et al. and Yin et al.; Rocktäschel et al. tune the
out-of-vocabulary rows, here a random 5% of rows (3.5% of SNLI dev's words lack a GloVe 6B
vector). Optimizers as the papers: Adagrad for decomposable attention and ABCNN, Adam for
Rocktäschel. Ours runs through ``make_optimizer`` (the trainer's); the references use
``torch.optim.X(model.parameters())`` as public code does.

The target (ours >= 1.5x the public implementation) is checked against the top of the issue's
public range, in pairs/s on an idle machine. The machine is shared, so absolute numbers move with
the load; every repeat therefore also times the reference on the same batches back to back,
alternating which goes first, and the ratio of the two medians is reported beside it: a stricter
bar where the reference is faster than the published code, and one the load moves less.

OpenMP's wait policy decides what 2 threads give here: `orchestrate` sets OMP_WAIT_POLICY=PASSIVE
(orchestrator/sweep/environment.py, for busy shared machines), which on an idle machine runs these
small-matrix steps at about half the speed of OpenMP's default spinning. The public figures come
from plain PyTorch, so the comparison with them is run as `OMP_WAIT_POLICY=ACTIVE python -m
benchmarks.run public_setup` (the same as OpenMP's default here); the policy is in the summary.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn

from benchmarks import public_references as ref
from benchmarks.common import SNLI_DEV, Context, loadavg, log, md_table, median, spread, target

NAME = "public_setup"
TITLE = "Paper models vs public implementations at issue 17's setup (2 threads, SNLI dev, batch 32)"

THREADS = 2
BATCH_SIZE = 32
EMBEDDING_DIM = 300
TUNED_SHARE = 0.05  # Rocktäschel: rows tuned (out-of-vocabulary words)
GOAL = 1.5
POOL_BATCHES = 64


def _rocktaschel(variant: str, public_random: tuple[int, int]) -> dict[str, Any]:
    """Rocktäschel et al. at k=100 (Table 1's attention rows), ours and the reference alike."""
    return {
        "model": "rocktaschel",
        "args": {"variant": variant, "hidden_size": 100, "dropout": 0.1},
        "optimizer": "adam", "lr": 1e-3, "tuned": True,
        "public": {"random": public_random},
        "reference": lambda vectors, max_length: ref.Rocktaschel(
            vectors, 100, variant == "word_by_word", 0.1
        ),
    }


# name -> (our model and constructor arguments, optimizer, lr, public range random / bucketed)
CONFIGS: dict[str, dict[str, Any]] = {
    "decomposable (vanilla, hidden 200)": {
        "model": "decomposable",
        "args": {"variant": "vanilla", "hidden_size": 200, "projection_dim": 200, "dropout": 0.2,
                 "init": "gaussian_0.01"},
        "optimizer": "adagrad", "lr": 0.05, "tuned": False,
        "public": {"random": (920, 1060), "bucketed": (1190, 1690)},
        "reference": lambda vectors, max_length: ref.Decomposable(vectors, 200, 0.2),
    },
    "rocktaschel attention (k=100)": _rocktaschel("attention", public_random=(650, 820)),
    "rocktaschel word-by-word (k=100)": _rocktaschel("word_by_word", public_random=(440, 520)),
    "ABCNN-3 (one block, 50 filters, w=3)": {
        "model": "abcnn",
        "args": {"variant": "abcnn3", "hidden_size": 50, "filter_width": 3, "num_blocks": 1},
        "optimizer": "adagrad", "lr": 0.05, "tuned": False,
        "public": {"random": (240, 290)},
        "reference": lambda vectors, max_length: ref.ABCNN3(vectors, max_length, 50, 3),
    },
}


def load_snli_dev(ctx: Context):
    """SNLI dev as an EncodedSplit over its own vocabulary (every word has a vector here)."""
    from nli_models.data import Vocabulary, numericalize, read_snli, tokenize

    split = read_snli(ctx.require_snli() / SNLI_DEV, "dev")
    premises = [tokenize(e.premise, True) for e in split.examples]
    hypotheses = [tokenize(e.hypothesis, True) for e in split.examples]
    vocab = Vocabulary.build(premises + hypotheses, lowercase=True)
    labels = [split.labels.index(e.label) for e in split.examples]
    return numericalize("dev", premises, hypotheses, labels, vocab), len(vocab)


def batches_in(split, order: str, count: int) -> list:
    """The first ``count`` full batches of one shuffled epoch, random or length-bucketed."""
    from nli_models.data.encode import batch_indices, make_batch

    pool = POOL_BATCHES if order == "bucketed" else None
    rows = [r for r in batch_indices(split, BATCH_SIZE, True, seed=0, epoch=1, pool_batches=pool)
            if len(r) == BATCH_SIZE]
    return [make_batch(split, r) for r in rows[:count]]


def padding_share(batches: list) -> float:
    """Padding positions over all positions of the padded premise and hypothesis tensors."""
    padded = sum(int((~b.premise_mask).sum() + (~b.hypothesis_mask).sum()) for b in batches)
    real = sum(int(b.premise_mask.sum() + b.hypothesis_mask.sum()) for b in batches)
    return padded / (padded + real)


def build_ours(config: dict, vocab_size: int, vectors: torch.Tensor, max_length: int):
    from nli_models.config import TrainingConfig
    from nli_models.registry import build_model
    from nli_models.training import make_optimizer

    args = dict(config["args"])
    if config["model"] == "abcnn":
        args["max_length"] = max_length
    model = build_model(config["model"], vocab_size=vocab_size, num_classes=3,
                        embedding_dim=EMBEDDING_DIM, **args)
    tuned = torch.zeros(vocab_size, dtype=torch.bool)
    if config["tuned"]:
        tuned[torch.randperm(vocab_size, generator=torch.Generator().manual_seed(0))[: int(TUNED_SHARE * vocab_size)]] = True
    model.word_embeddings.load(vectors, tuned)
    training = TrainingConfig(optimizer=config["optimizer"], lr=config["lr"], device="cpu")
    return model, make_optimizer(model, training)


def build_reference(config: dict, vectors: torch.Tensor, max_length: int):
    model = config["reference"](vectors, max_length)
    optimizer = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[config["optimizer"]]
    return model, optimizer([p for p in model.parameters() if p.requires_grad], lr=config["lr"])


def train_steps(model: nn.Module, optimizer, batches: list) -> tuple[float, float]:
    """Wall and CPU seconds (this process) for one training step per batch (the body of
    Trainer.train_epoch). Under load, CPU time moves less than wall time."""
    model.train()
    started, cpu_started = time.perf_counter(), time.process_time()
    for batch in batches:
        logits = model(batch.premise, batch.premise_mask, batch.hypothesis, batch.hypothesis_mask)
        loss = nn.functional.cross_entropy(logits, batch.label)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - started, time.process_time() - cpu_started


def measure(config: dict, batches: list, vocab_size: int, vectors, max_length: int,
            repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    ours = build_ours(config, vocab_size, vectors, max_length)
    reference = build_reference(config, vectors, max_length)
    pairs = BATCH_SIZE * len(batches)
    for model, optimizer in (ours, reference):  # warm-up: allocator, first-call costs
        train_steps(model, optimizer, batches[:2])
    rates: dict[str, list[float]] = {"ours": [], "reference": [], "ours_cpu": [], "reference_cpu": []}
    for repeat in range(repeats):
        sides = (("ours", ours), ("reference", reference))
        for side, (model, optimizer) in sides if repeat % 2 == 0 else sides[::-1]:
            wall, cpu = train_steps(model, optimizer, batches)
            rates[side].append(pairs / wall)
            rates[f"{side}_cpu"].append(pairs / cpu)
    return {side: spread(values) for side, values in rates.items()} | {
        "ratio_per_repeat": [o / r for o, r in zip(rates["ours"], rates["reference"], strict=True)],
        "ratio": median(rates["ours"]) / median(rates["reference"]),
        "cpu_ratio": median(rates["ours_cpu"]) / median(rates["reference_cpu"]),
    }


def run(ctx: Context) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    torch.set_flush_denormal(True)  # as the trainer does on CPU
    split, vocab_size = load_snli_dev(ctx)
    max_length = int(max(split.premise_lengths.max(), split.hypothesis_lengths.max()))
    vectors = torch.randn(vocab_size, EMBEDDING_DIM, generator=torch.Generator().manual_seed(0))
    vectors[0] = 0
    count, repeats = (4, 3) if ctx.quick else (24, 5)
    results, rows, targets = {}, [], []
    for order in ("random", "bucketed"):
        batches = batches_in(split, order, count)
        for name, config in CONFIGS.items():
            load = loadavg()
            log(f"{name}, {order} batches (load {load})")
            result = measure(config, batches, vocab_size, vectors, max_length, repeats)
            result.update(load=load, padding_share=padding_share(batches))
            results[f"{name} / {order}"] = result
            public = config["public"].get(order)
            ours = result["ours"]["median"]
            rows.append([name, order, round(ours), round(result["reference"]["median"]),
                         f"{result['ratio']:.2f} ({min(result['ratio_per_repeat']):.2f}-{max(result['ratio_per_repeat']):.2f})",
                         f"{result['cpu_ratio']:.2f}",
                         f"{public[0]:,}-{public[1]:,}" if public else "-",
                         f"{ours / public[1]:.2f}-{ours / public[0]:.2f}" if public else "-",
                         f"{load[0]:.1f}"])
            if order == "random":
                # The issue's target is the public implementations' pairs/s on this kind of
                # machine, so it is checked against the top of their range; it needs an idle
                # machine (the load is in the table). The in-run reference is a stricter bar
                # (it runs faster than the published code: e.g. Rocktäschel attention ~2,000
                # pairs/s against 650-820) and is reported beside it, not hidden.
                targets.append(target(
                    f"{name} vs public", f">= {GOAL}x the public implementation ({GOAL}x {public[1]:,} pairs/s)",
                    f"{ours:.0f} pairs/s = {ours / public[1]:.2f}x the top of the public range, "
                    f"{result['ratio']:.2f}x our in-run reference; load {load[0]:.1f}",
                    ours >= GOAL * public[1],
                    "absolute pairs/s move with the machine's load; the ratio to the in-run reference does less"))
    table = md_table(["model", "batches", "ours pairs/s", "reference pairs/s", "ours / reference, wall (per-repeat range)",
                      "ours / reference, per CPU-second",
                      "public pairs/s (issue 17)", "ours / public", "load 1 min"], rows)
    policy = os.environ.get("OMP_WAIT_POLICY", "OpenMP default")
    summary = (f"{count} batches of 32 real SNLI dev pairs per timing, {repeats} repeats alternating ours and the "
               f"reference; {THREADS} threads, OMP_WAIT_POLICY {policy}; medians.\n\n{table}\n")
    return {"results": results, "vocab_size": vocab_size, "max_length": max_length, "omp_wait_policy": policy,
            "summary_md": summary, "targets": targets}
