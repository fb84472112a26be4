"""Training throughput of every paper configuration (pairs/s), torch threads = 1 and 2, and the
achieved matmul FLOP/s against this machine's dense torch.mm FLOP/s at the same thread count.

Setup: paper size (300-d embeddings, vocabulary 20,000, every row trained: the embedding table
gets a dense gradient and an Adam update, as without pretrained vectors; frozen_embeddings_check
measures the papers' partly and wholly fixed tables), batch 32, Adam (the trainer's optimizer
with its parameter groups). Sentence lengths are drawn from SNLI
dev (whole pairs resampled; synthetic gamma lengths without the data), clipped to 40 tokens (ABCNN-1/3
are built with max_length=40). 2,048 pairs are batched exactly as the trainer batches an epoch
(``batch_indices``: one 64-batch chunk sorted by length, i.e. little padding), and a fixed,
length-stratified subset of those batches is timed: forward + loss, zero_grad + backward,
optimizer step — the body of ``Trainer.train_epoch``. Repeats alternate 1 and 2 threads; medians.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.common import Context, log, md_table, median, sample_lengths, spread
from benchmarks.flops import BatchShape, training_flops

NAME = "throughput"
TITLE = "Training throughput per paper configuration"

VOCAB_SIZE = 20_000
BATCH_SIZE = 32
POOL_PAIRS = 2_048  # one bucketing chunk (BUCKET_CHUNK_BATCHES x 32)
THREADS = (1, 2)
CONFIG_BUDGET_S = 15.0  # per paper configuration: no further repeats once spent
MATMUL_SIZES = {"representative": (512, 512, 512), "large": (1024, 1024, 1024), "lstm_step": (32, 100, 400)}


def matmul_flops(threads: int, m: int, k: int, n: int, repeats: int, min_seconds: float) -> dict:
    """Dense float32 torch.mm FLOP/s (2mkn per product), median of repeats."""
    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    for _ in range(3):
        torch.mm(a, b, out=out)
    rates = []
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b, out=out)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(2 * m * k * n * count / elapsed)
    return spread(rates)


def omp_wait_policy_check(repeats: int, seconds: float) -> dict[str, Any]:
    """torch.mm GFLOP/s at 1 and 2 threads with OpenMP's default wait policy and with
    OMP_WAIT_POLICY=PASSIVE (read when torch loads, so each runs in a fresh process)."""
    import json
    import os
    import subprocess
    import sys

    out = {}
    for policy in ("default", "PASSIVE"):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if policy != "default":
            env["OMP_WAIT_POLICY"] = policy
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.throughput", "--mm-worker", str(repeats), str(seconds)],
            capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).resolve().parents[1],
        )
        if done.returncode != 0:
            raise RuntimeError(f"mm worker failed: {done.stderr[-2000:]}")
        out[policy] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _mm_worker(repeats: int, seconds: float) -> dict[str, Any]:
    return {str(t): {name: matmul_flops(t, *dims, repeats, seconds)["median"] for name, dims in MATMUL_SIZES.items()}
            for t in THREADS}


def make_pool(ctx: Context) -> tuple[Any, dict]:
    """POOL_PAIRS synthetic pairs with SNLI lengths and uniform random token ids."""
    from nli_models.data import EncodedSplit

    shared = ctx.shared_data if ctx.has_snli() else None
    premise_len, hypothesis_len, info = sample_lengths(POOL_PAIRS, shared, seed=0)
    rng = np.random.default_rng(1)

    def flat(lengths):
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = rng.integers(2, VOCAB_SIZE, int(offsets[-1])).astype(np.int32)
        return ids, offsets

    p_ids, p_off = flat(premise_len)
    h_ids, h_off = flat(hypothesis_len)
    labels = rng.integers(0, 3, POOL_PAIRS).astype(np.int64)
    return EncodedSplit("train", p_ids, p_off, h_ids, h_off, labels), info


def select_batches(split, count: int, batch_size: int = BATCH_SIZE) -> list:
    """``count`` batches of one trainer epoch over the pool, stratified by padded size."""
    from nli_models.data.encode import batch_indices, make_batch

    rows = batch_indices(split, batch_size, shuffle=True, seed=0, epoch=1)
    rows = [r for r in rows if len(r) == batch_size]
    size = [split.premise_lengths[r].max() + split.hypothesis_lengths[r].max() for r in rows]
    ordered = [rows[i] for i in np.argsort(size, kind="stable")]
    picks = [ordered[int((i + 0.5) * len(ordered) / count)] for i in range(count)]
    return [make_batch(split, r) for r in picks]


def shape_of(batch) -> BatchShape:
    return BatchShape(
        batch=len(batch),
        premise_padded=int(batch.premise.shape[1]),
        hypothesis_padded=int(batch.hypothesis.shape[1]),
        premise_tokens=int(batch.premise_mask.sum()),
        hypothesis_tokens=int(batch.hypothesis_mask.sum()),
        distinct_words=int(torch.cat([batch.premise.flatten(), batch.hypothesis.flatten()]).unique().numel()),
    )


def paper_trainer(paper_config, device: str = "cpu", precision: str = "fp32", batch_size: int = BATCH_SIZE,
                  cuda_graphs: str = "off"):
    """The paper configuration built at paper size, wrapped in the project's Trainer (for its
    optimizer: Adam with the trainer's parameter groups) on ``device``; ``cuda_graphs`` as
    ``training.cuda_graphs`` (off: the eager step these CPU figures time)."""
    from nli_models.config import TrainingConfig
    from nli_models.data import PreparedData, Vocabulary
    from nli_models.registry import build_model
    from nli_models.training import Trainer

    torch.manual_seed(0)
    model = build_model(paper_config.model, vocab_size=VOCAB_SIZE, **paper_config.config)
    stub = PreparedData("synthetic", Vocabulary(["<pad>", "<unk>"]), ("a", "b", "c"), {})
    return Trainer(model, stub, TrainingConfig(device=device, precision=precision, batch_size=batch_size,
                                               cuda_graphs=cuda_graphs))


def train_pass(trainer, batches, num_classes: int) -> dict[str, float]:
    """One timed pass over ``batches``: the body of Trainer.train_epoch, phase by phase (on a GPU
    the phases time kernel launches, not kernels; the total is waited for)."""
    model, optimizer, device = trainer.model, trainer.optimizer, trainer.device
    autocast = {"dtype": trainer.autocast_dtype, "enabled": trainer.autocast_dtype is not None}
    model.train()
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    cpu_start, start = time.process_time(), time.perf_counter()
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        labels = batch.label % num_classes
        t0 = time.perf_counter()
        with torch.autocast(device.type, **autocast):
            logits = model(*batch.inputs())
        loss = nn.functional.cross_entropy(logits.float(), labels)
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["optimizer"] += t3 - t2
    if device.type == "cuda":  # kernels run asynchronously: the pass ends when they are done
        torch.cuda.synchronize(device)
    phases["total"] = time.perf_counter() - start
    # CPU seconds of this process per wall second: < 1 thread's worth means other processes
    # took the cores (the machine is shared); with 2 threads, OpenMP spin-waits count as CPU.
    phases["cpu_share"] = (time.process_time() - cpu_start) / phases["total"]
    return phases


FUSED_CHECK_ROWS = ("Table 1: Conditional encoding, shared (k=100)", "Table 1: Our approach (vanilla)",
                    "Table IV: Combined Attention (SNLI)")


def compare_variants(trainer, batches, classes: int, repeats: int, variants: dict) -> dict[str, dict]:
    """Pairs/s and optimizer share of one trainer under each variant (a function that sets the
    trainer up), alternating the variants every repeat; 1 thread."""
    torch.set_num_threads(1)
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    for apply in variants.values():
        apply(trainer)
        train_pass(trainer, batches[:1], classes)
    for _ in range(repeats):
        for name, apply in variants.items():
            apply(trainer)
            samples[name].append(train_pass(trainer, batches, classes))
    return {name: {"pairs_per_s": len(batches) * BATCH_SIZE / median(x["total"] for x in runs),
                   "optimizer_share": median(x["optimizer"] / x["total"] for x in runs)}
            for name, runs in samples.items()}


def fused_optimizer_check(paper_configs_, batches, repeats: int) -> list[dict]:
    """Adam as torch runs it on CPU by default (a Python loop over parameter tensors: the
    trainer's optimizer before commit 3d37aab) against Adam(fused=True) (the trainer's since),
    same parameter groups, 1 thread."""
    rows = []
    for pc in paper_configs_:
        if pc.table_row not in FUSED_CHECK_ROWS:
            continue
        trainer = paper_trainer(pc)
        base_groups = [(g["params"], g["weight_decay"]) for g in trainer.optimizer.param_groups]
        # Fresh group dicts per optimizer: an Optimizer writes its defaults (fused, foreach) into them.
        optimizers = {
            "for_loop": torch.optim.Adam([{"params": p, "weight_decay": w} for p, w in base_groups], lr=1e-3,
                                         foreach=False, fused=False),
            "fused": torch.optim.Adam([{"params": p, "weight_decay": w} for p, w in base_groups], lr=1e-3, fused=True),
        }
        assert not optimizers["for_loop"].defaults["fused"] and optimizers["fused"].param_groups[0]["fused"]
        variants = {name: (lambda tr, o=optimizer: setattr(tr, "optimizer", o)) for name, optimizer in optimizers.items()}
        row = {"table_row": pc.table_row, "model": pc.model,
               **compare_variants(trainer, batches, pc.config["num_classes"], repeats, variants)}
        row["speedup"] = row["fused"]["pairs_per_s"] / row["for_loop"]["pairs_per_s"]
        rows.append(row)
        log(f"throughput: fused vs for-loop Adam, {pc.table_row[:40]}: x{row['speedup']:.2f}")
    return rows


FROZEN_CHECK_ROWS = ("Table 1: Our approach (vanilla)", "Table 6 (SICK): ABCNN-3 one-conv",
                     "Table 1: Word-by-word attention (k=100)", "Table IV: Combined Attention (SNLI)")
OOV_FRACTION = 0.05  # rows tuned as out-of-vocabulary; 3.5% of SNLI dev's vocabulary with GloVe 6B


def frozen_embeddings_check(paper_configs_, batches, repeats: int) -> list[dict]:
    """The table above trains every row. The papers do not: Parikh et al. and Yin et al. keep every
    row fixed, Rocktäschel et al. and CAM tune only out-of-vocabulary rows. Here the same models
    with all 20k rows trained, 5% of rows trained and none trained (see nli_models/embeddings.py:
    only tuned rows get a gradient and an optimizer step), 1 thread; each variant with the
    optimizer the trainer builds for it."""
    from nli_models.training import make_optimizer

    oov_rows = torch.rand(VOCAB_SIZE, generator=torch.Generator().manual_seed(0)) < OOV_FRACTION
    masks = {"all_trained": torch.ones(VOCAB_SIZE, dtype=torch.bool), "oov_trained": oov_rows,
             "all_frozen": torch.zeros(VOCAB_SIZE, dtype=torch.bool)}
    rows = []
    for pc in paper_configs_:
        if pc.table_row not in FROZEN_CHECK_ROWS:
            continue
        trainer = paper_trainer(pc)
        weight = trainer.model.word_embeddings.full_weight().clone()

        def tuning(mask, weight=weight):
            def apply(tr):
                tr.model.word_embeddings.load(weight, mask)
                tr.optimizer = make_optimizer(tr.model, tr.config)  # the trainer builds it after load
            return apply

        variants = {name: tuning(mask) for name, mask in masks.items()}
        row = {"table_row": pc.table_row, "model": pc.model,
               **compare_variants(trainer, batches, pc.config["num_classes"], repeats, variants)}
        for name in ("oov_trained", "all_frozen"):
            row[f"speedup_{name}"] = row[name]["pairs_per_s"] / row["all_trained"]["pairs_per_s"]
        rows.append(row)
        log(f"throughput: embeddings, {pc.table_row[:40]}: 5% rows trained x{row['speedup_oov_trained']:.2f}, "
            f"frozen x{row['speedup_all_frozen']:.2f} against all trained")
    return rows


def run(ctx: Context) -> dict[str, Any]:
    from nli_models.registry import count_parameters, paper_configs

    n_batches, repeats = (2, 1) if ctx.quick else (6, 3)
    mm_repeats, mm_seconds = (2, 0.1) if ctx.quick else (5, 0.3)
    split, length_info = make_pool(ctx)
    batches = select_batches(split, n_batches)
    shapes = [shape_of(b) for b in batches]
    log(
        f"throughput: {n_batches} batches x {repeats} repeats per config and thread count; lengths "
        f"from {length_info['source']} (mean {length_info['mean_premise']}/{length_info['mean_hypothesis']})"
    )

    matmul = {t: {name: matmul_flops(t, *dims, mm_repeats, mm_seconds) for name, dims in MATMUL_SIZES.items()} for t in THREADS}
    peak = {t: matmul[t]["representative"]["median"] for t in THREADS}
    log("throughput: torch.mm 512^3 GFLOP/s " + ", ".join(f"{t} thread(s) {peak[t] / 1e9:.1f}" for t in THREADS))

    configs = paper_configs()
    if ctx.quick:  # smoke run: the first paper configuration of each model
        configs = [pc for i, pc in enumerate(configs) if pc.model not in {c.model for c in configs[:i]}]
    rows = []
    for pc in configs:
        trainer = paper_trainer(pc)
        classes = pc.config["num_classes"]
        flops_pass = sum(training_flops(pc.model, pc.config, s) for s in shapes)
        for t in THREADS:  # warm-up: first-call allocations, thread pool start
            torch.set_num_threads(t)
            train_pass(trainer, batches[:1], classes)
        samples: dict[int, list[dict]] = {t: [] for t in THREADS}
        spent = time.perf_counter()
        for rep in range(repeats):
            # Every thread count gets one repeat; more only within the per-config budget (with
            # 2 threads on a loaded 2-core machine a pass can take a minute).
            if rep > 0 and time.perf_counter() - spent > CONFIG_BUDGET_S:
                break
            for t in THREADS:
                torch.set_num_threads(t)
                samples[t].append(train_pass(trainer, batches, classes))
        theta_m, _ = count_parameters(trainer.model)
        row: dict[str, Any] = {
            "model": pc.model,
            "table_row": pc.table_row,
            "config": pc.config,
            "theta_m": theta_m,
            "repeats": len(samples[THREADS[0]]),
            "train_gflop_per_batch": flops_pass / n_batches / 1e9,
        }
        for t in THREADS:
            seconds = median(s["total"] for s in samples[t])
            row[f"threads_{t}"] = {
                "pairs_per_s": n_batches * BATCH_SIZE / seconds,
                "pairs_per_s_all": [n_batches * BATCH_SIZE / s["total"] for s in samples[t]],
                "seconds_per_batch": seconds / n_batches,
                "achieved_gflop_s": flops_pass / seconds / 1e9,
                "fraction_of_matmul_peak": flops_pass / seconds / peak[t],
                "cpu_share": median(s["cpu_share"] for s in samples[t]),
                "phase_share": {
                    k: median(s[k] / s["total"] for s in samples[t]) for k in ("forward", "backward", "optimizer")
                },
            }
        row["speedup_2_threads"] = row["threads_2"]["pairs_per_s"] / row["threads_1"]["pairs_per_s"]
        rows.append(row)
        log(
            f"throughput: {pc.model:12s} {pc.table_row[:48]:48s} "
            f"{row['threads_1']['pairs_per_s']:7.1f} / {row['threads_2']['pairs_per_s']:7.1f} pairs/s "
            f"(1/2 threads), {row['threads_1']['fraction_of_matmul_peak']:.1%} of mm peak (1 thread)"
        )
        del trainer
    fused_rows = fused_optimizer_check(configs, batches, repeats)
    frozen_rows = frozen_embeddings_check(configs, batches, repeats)
    omp = omp_wait_policy_check(mm_repeats, mm_seconds)
    torch.set_num_threads(max(THREADS))

    result = {
        "params": {"vocab_size": VOCAB_SIZE, "batch_size": BATCH_SIZE, "batches": n_batches, "repeats": repeats,
                   "lengths": length_info, "batch_shapes": [s.__dict__ for s in shapes]},
        "matmul_flops": {str(t): v for t, v in matmul.items()},
        "rows": rows,
        "fused_optimizer_check": fused_rows,
        "frozen_embeddings_check": frozen_rows,
        "omp_wait_policy": omp,
        "targets": [],
    }
    result["summary_md"] = render(result)
    return result


def _loop(row: dict) -> str:
    return "for_loop" if "for_loop" in row else "default"  # JSON of the first runs: "default"


def render(result: dict[str, Any]) -> str:
    """The Markdown summary of a throughput result (also re-renders a stored JSON)."""
    p, rows, fused_rows = result["params"], result["rows"], result["fused_optimizer_check"]
    info = p["lengths"]
    matmul = result["matmul_flops"]
    table = md_table(
        ["model", "paper row", "θM (params)", "GFLOP/batch (train)", "pairs/s 1 thr", "pairs per CPU-s 1 thr",
         "pairs/s 2 thr", "2 thr / 1 thr", "GFLOP/s 1 thr", "% of mm peak 1 thr", "% of mm peak 2 thr",
         "optimizer share 1 thr", "CPU share 1/2 thr"],
        [
            (r["model"], r["table_row"], f"{r['theta_m']:,}", r["train_gflop_per_batch"],
             round(r["threads_1"]["pairs_per_s"], 1),
             round(r["threads_1"]["pairs_per_s"] / r["threads_1"]["cpu_share"], 1),
             round(r["threads_2"]["pairs_per_s"], 1), round(r["speedup_2_threads"], 2),
             round(r["threads_1"]["achieved_gflop_s"], 2),
             f"{r['threads_1']['fraction_of_matmul_peak']:.1%}", f"{r['threads_2']['fraction_of_matmul_peak']:.1%}",
             f"{r['threads_1']['phase_share']['optimizer']:.0%}",
             f"{r['threads_1']['cpu_share']:.2f} / {r['threads_2']['cpu_share']:.2f}")
            for r in rows
        ],
    )
    mm_line = "; ".join(
        f"{t} thread(s): " + ", ".join(f"{name} {matmul[str(t)][name]['median'] / 1e9:.1f}" for name in MATMUL_SIZES)
        for t in THREADS
    )
    mean_repeats = sum(r.get("repeats", p["repeats"]) for r in rows) / max(len(rows), 1)
    return (
        f"Batch {p['batch_size']}, vocabulary {p['vocab_size']:,}, 300-d embeddings, Adam; {p['batches']} "
        f"length-stratified batches x up to {p['repeats']} repeats (median; fewer once a configuration used "
        f"{CONFIG_BUDGET_S:.0f} s: {mean_repeats:.1f} on average). Lengths: {info['source']}, mean premise "
        f"{info['mean_premise']} / hypothesis {info['mean_hypothesis']} tokens, clipped to {info['clipped_to']} "
        f"({info['share_of_pairs_clipped']:.2%} of pairs).\n\n"
        f"torch.mm GFLOP/s ({', '.join(f'{k} {m}x{kk}x{n}' for k, (m, kk, n) in MATMUL_SIZES.items())}) — "
        f"{mm_line}. '% of mm peak' divides the analytic matmul FLOPs of a training step "
        f"(benchmarks/flops.py, forward x 3) by the time of the whole step and by the 512^3 rate at the same "
        f"thread count. 'CPU share' = process CPU seconds per wall second during the timed passes (below 1.0 with "
        f"1 thread: other processes held the core; with 2 threads OpenMP spin-waiting also counts); 'pairs per "
        f"CPU-s' = pairs/s / CPU share, the 1-thread rate with the contention taken out.\n\n" + table
        + "\n\nAdam as torch runs it on CPU by default (a Python loop over the parameter tensors; the trainer's "
        "optimizer before commit 3d37aab) against `Adam(..., fused=True)` (the trainer's since), same parameter "
        "groups, 1 thread:\n\n"
        + md_table(["paper row", "pairs/s for-loop", "pairs/s fused", "speedup", "optimizer share for-loop", "fused"],
                   [(r["table_row"], round(r[_loop(r)]["pairs_per_s"], 1), round(r["fused"]["pairs_per_s"], 1),
                     round(r["speedup"], 2), f"{r[_loop(r)]['optimizer_share']:.0%}",
                     f"{r['fused']['optimizer_share']:.0%}") for r in fused_rows])
        + _render_frozen(result.get("frozen_embeddings_check"))
        + _render_omp(result.get("omp_wait_policy"))
    )


def _render_frozen(rows: list[dict] | None) -> str:
    if not rows or "speedup_all_frozen" not in rows[0]:  # JSON from before the check had three variants
        return ""
    return (
        "\n\nEmbedding rows trained as in the papers, against every row trained (the table above): 5% of "
        "rows (out-of-vocabulary words: Rocktäschel et al., CAM) and none (Parikh et al., Yin et al.), "
        "pairs/s at 1 thread:\n\n"
        + md_table(["paper row", "all trained", "5% trained", "none trained", "speedup 5%", "speedup none",
                    "optimizer share all / 5% / none"],
                   [(r["table_row"], round(r["all_trained"]["pairs_per_s"], 1), round(r["oov_trained"]["pairs_per_s"], 1),
                     round(r["all_frozen"]["pairs_per_s"], 1), round(r["speedup_oov_trained"], 2),
                     round(r["speedup_all_frozen"], 2),
                     " / ".join(f"{r[v]['optimizer_share']:.0%}" for v in ("all_trained", "oov_trained", "all_frozen")))
                    for r in rows])
    )


def _render_omp(omp: dict | None) -> str:
    if not omp:
        return ""
    rows = [(policy, f"{t}", *(round(omp[policy][str(t)][name] / 1e9, 1) for name in MATMUL_SIZES))
            for policy in omp for t in THREADS]
    return (
        "\n\ntorch.mm GFLOP/s with OpenMP's default wait policy and with `OMP_WAIT_POLICY=PASSIVE` (fresh process "
        "each; on a loaded 2-core machine a spinning OpenMP thread waits for one that was descheduled):\n\n"
        + md_table(["OMP_WAIT_POLICY", "threads", *MATMUL_SIZES], rows)
    )


if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "--mm-worker":
        print(json.dumps(_mm_worker(int(sys.argv[2]), float(sys.argv[3]))))
    else:
        print("usage: python -m benchmarks.run throughput", file=sys.stderr)
        sys.exit(2)
