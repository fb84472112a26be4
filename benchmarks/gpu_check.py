"""The project's GPU check: `python -m benchmarks.gpu_check [--device cuda|cpu] [--out DIR]`
(`make gpu-check`).

Needs only torch and what nli_models needs (numpy, pydantic, pyyaml): it runs on a bare GPU
machine, from the repository root with the repository on PYTHONPATH. Where Ray, MLflow and Optuna
are importable it also runs a quickstart sweep of two 0.5-GPU trials at once; otherwise that part
is SKIP, with the reason. Checks, on the device:

- train: each paper model as the check names it (rocktaschel word_by_word, decomposable intra,
  abcnn abcnn3, cam full, paper sizes, the paper's optimizer) trains on the toy corpus through the
  Trainer in fp32 and bf16: finite training and dev loss;
- checkpoint: saved and loaded into a fresh trainer on the device, same weights, same dev result;
- determinism: training.deterministic: true, the same seed twice, parameters bit-identical;
- step: pairs/s of the trainer's training step (``Trainer.training_step``: Adam, autocast as
  configured; SNLI dev lengths, else synthetic ones) at batch 32 and 128 in fp32 and bf16, eager
  and as CUDA graphs (batches padded to the static lengths), with peak GPU memory, kernel and
  graph launches per step and host syncs per step (a sync is a FAIL);
- graphs_match: the same seed trained with graphs and eagerly (dropout off): equal losses;
- packing: 1, 2, 4 and 8 decomposable-attention trial processes training at once on the GPU:
  aggregate pairs/s, and 8 against 1 (goal >= 5x);
- stacking: snli_wbw's 36-configuration grid (word-by-word attention) as one stacked model
  against one trial at a time and against the best packing of 4 or 8 trial processes
  (configurations/hour; issue 47's goals >= 10x and >= 3x on one GPU), and 5 seeds of one
  configuration as a stack against one trial's wall time (goal <= 1.5x);
- goal rows: b32 fp32 pairs/s per model against the goals, b128 >= 3x b32, bf16 >= fp32;
- sweep: `orchestrate sweep search_spaces/quickstart.yaml` with resources.gpu 0.5: its exit code
  and whether two trials ran at once (MLflow run times).

`--device cpu` is a dry run of the same code with tiny models and sizes (tests/test_gpu_check.py
runs it). Writes summary.json and summary.md to --out and prints the markdown. Exit status: 0 no
FAIL, 1 some FAIL, 2 --device cuda without CUDA. On CUDA no check starts after --budget-s
(default 420 s; each later check is SKIP, saying so) and the sweep gets what is left of it (at
least 30 s), so a run ends about 7.5 minutes after its start at most (a check already started
finishes): within the 8 minutes asked of it on one GPU. The CPU dry run's default budget is an
hour (a loaded CI machine is slow, and every check should run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The check's models: one variant per paper (the one its README section trains), paper sizes.
CHECKED = {"rocktaschel": "word_by_word", "decomposable": "intra", "abcnn": "abcnn3", "cam": "full"}
# The optimizer each paper trains with (Adagrad: decomposable, ABCNN), for the train, checkpoint
# and determinism checks; throughput uses Adam, as benchmarks/throughput.py's CPU figures do.
OPTIMIZERS = {"rocktaschel": "adam", "decomposable": "adagrad", "abcnn": "adagrad", "cam": "adam"}
PRECISIONS = ("fp32", "bf16")
TINY_WIDTHS = {"embedding_dim": 8, "hidden_size": 8, "projection_dim": 8}


@dataclass(frozen=True)
class Sizes:
    train_steps: int
    batch_sizes: tuple[int, ...]
    timed_batches: int  # per timed pass of the step check
    min_seconds: float  # timed passes repeat until this much time has passed
    tiny: bool  # tiny model widths (the CPU dry run)
    toy_pairs: int


GPU_SIZES = Sizes(train_steps=20, batch_sizes=(32, 128), timed_batches=8, min_seconds=2.0, tiny=False,
                  toy_pairs=3000)
DRY_SIZES = Sizes(train_steps=3, batch_sizes=(32,), timed_batches=1, min_seconds=0.0, tiny=True,
                  toy_pairs=300)


@dataclass
class Row:
    check: str
    status: str  # PASS | FAIL | SKIP | INFO
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def paper_config(model: str):
    """The registry's paper configuration of ``model`` with the checked variant (the first listed)."""
    from nli_models.registry import paper_configs

    return next(pc for pc in paper_configs()
                if pc.model == model and pc.config.get("variant") == CHECKED[model])


def model_block(model: str, sizes: Sizes) -> dict:
    args = {k: v for k, v in paper_config(model).config.items() if k not in ("num_classes", "variant")}
    if sizes.tiny:
        args.update({k: v for k, v in TINY_WIDTHS.items() if k in args})
    return {"name": model, "variant": CHECKED[model], "args": args}


def run_config(model: str, device: str, sizes: Sizes, **training):
    from nli_models.config import RunConfig

    return RunConfig.model_validate({
        "name": f"gpu_check_{model}",
        "model": model_block(model, sizes),
        "data": {"corpus": "toy", "toy": {"size": sizes.toy_pairs, "seed": 0}},
        "training": {"optimizer": OPTIMIZERS[model], "epochs": 1, "max_steps": sizes.train_steps,
                     "batch_size": 32, "lr": 1e-3, "device": device, **training},
    })


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def check_training(model: str, precision: str, device: str, sizes: Sizes, data) -> Row:
    from nli_models.training import make_trainer

    trainer = make_trainer(run_config(model, device, sizes, precision=precision), data)
    trainer.fit()
    result = trainer.state.history[-1]
    ok = _finite(result.train_loss, result.dev_loss) and trainer.state.steps == sizes.train_steps
    return Row(f"train.{model}.{precision}", "PASS" if ok else "FAIL",
               f"{trainer.state.steps} steps on {trainer.device}: train loss {result.train_loss:.4f}, "
               f"dev loss {result.dev_loss:.4f}",
               {"train_loss": result.train_loss, "dev_loss": result.dev_loss, "steps": trainer.state.steps})


def check_checkpoint(model: str, device: str, sizes: Sizes, data, folder: Path) -> Row:
    """Save on the device, load into a fresh trainer there: what a Tune retry, --resume and a
    sweep's test evaluation do."""
    import torch

    from nli_models.training import make_trainer

    config = run_config(model, device, sizes)
    trainer = make_trainer(config, data)
    trainer.fit()
    trainer.save_checkpoint(folder)
    before = trainer.evaluate("dev")
    loaded = make_trainer(config, data)
    loaded.load_checkpoint(folder)
    after = loaded.evaluate("dev")
    same_weights = all(torch.equal(a, b) for a, b in
                       zip(trainer.model.state_dict().values(), loaded.model.state_dict().values(), strict=True))
    ok = same_weights and after.accuracy == before.accuracy and math.isclose(after.loss, before.loss, rel_tol=1e-6)
    return Row(f"checkpoint.{model}", "PASS" if ok else "FAIL",
               f"saved and loaded on {loaded.device}: weights {'equal' if same_weights else 'DIFFER'}, "
               f"dev loss {before.loss:.6f} -> {after.loss:.6f}")


def check_determinism(model: str, precision: str, device: str, sizes: Sizes, data) -> Row:
    import torch

    from nli_models.training import make_trainer

    def run():
        trainer = make_trainer(run_config(model, device, sizes, precision=precision, deterministic=True), data)
        trainer.fit()
        return [p.detach().cpu() for p in trainer.model.state_dict().values()]

    try:
        first, second = run(), run()
    finally:
        torch.use_deterministic_algorithms(False)
    differing = sum(not torch.equal(a, b) for a, b in zip(first, second, strict=True))
    return Row(f"determinism.{model}.{precision}", "FAIL" if differing else "PASS",
               f"same seed twice, deterministic: true: {differing} of {len(first)} tensors differ")


MODES = ("eager", "graphs")
# Issue 43's goals on one H100/H200 (paper size, SNLI lengths, pairs/s of a training step, b32 fp32,
# the step as it trains by default: graphs); b128 >= 3x b32; bf16 >= fp32; 8 packed >= 5x one.
B32_FP32_GOALS = {"decomposable": 10_000, "abcnn": 8_000, "cam": 6_000, "rocktaschel": 4_000}
B128_OVER_B32 = 3.0
PACKED_GOAL = 5.0


def _labelled(batch, classes: int, static: bool):
    """A pool batch with labels in range, padded to the static lengths where graphs train."""
    from dataclasses import replace

    batch = replace(batch, label=batch.label % classes)
    return batch.padded_to_static_lengths() if static else batch


def _launches_and_syncs(trainer, batch) -> tuple[int, int]:
    """Kernel and graph launches (CUDA runtime calls) and host synchronisations of one step."""
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trainer.training_step(batch)
        torch.cuda.synchronize(trainer.device)
    launches = sum(1 for e in prof.events()
                   if e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch")))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.training_step(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = sum(1 for w in caught if "synchroniz" in str(w.message))
    return launches, syncs


def check_step(model: str, batch_size: int, precision: str, mode: str, device: str, sizes: Sizes,
               batches) -> Row:
    """Pairs/s of the trainer's own training step (``Trainer.training_step``: the CUDA graphs'
    replay with ``mode`` graphs, on batches padded to the static lengths as the trainer pads them),
    peak GPU memory, and on CUDA kernel launches and host syncs per step."""
    import torch

    from benchmarks.throughput import paper_trainer

    name = f"step.{model}.b{batch_size}.{precision}.{mode}"
    if mode == "graphs" and device != "cuda":
        return Row(name, "SKIP", "CUDA graphs need a CUDA device")
    pc = paper_config(model)
    if sizes.tiny:
        pc = type(pc)(**{**asdict(pc), "config": {**pc.config, **{k: v for k, v in TINY_WIDTHS.items()
                                                                    if k in pc.config}}})
    trainer = paper_trainer(pc, device, precision, batch_size, cuda_graphs="on" if mode == "graphs" else "off")
    classes = pc.config["num_classes"]
    prepared = [_labelled(b, classes, static=mode == "graphs").to(trainer.device) for b in batches]
    trainer.model.train()
    trainer.optimizer  # noqa: B018 - built (and graphs set up) before the clock starts
    for batch in prepared:  # warm-up: allocator, cuDNN plans, each shape's capture
        trainer.training_step(batch)
    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(trainer.device)
        torch.cuda.reset_peak_memory_stats(trainer.device)
    pairs, seconds = 0, 0.0
    while seconds == 0.0 or seconds < sizes.min_seconds:
        started = time.perf_counter()
        for batch in prepared:
            trainer.training_step(batch)
        if cuda:
            torch.cuda.synchronize(trainer.device)
        seconds += time.perf_counter() - started
        pairs += sum(len(b) for b in prepared)
    data = {"model": model, "batch_size": batch_size, "precision": precision, "mode": mode,
            "pairs_per_s": pairs / seconds, "pairs": pairs, "seconds": seconds,
            "peak_mib": torch.cuda.max_memory_allocated(trainer.device) / 2**20 if cuda else None}
    detail = f"{data['pairs_per_s']:,.0f} pairs/s"
    status = "INFO"
    if cuda:
        data["launches_per_step"], data["syncs_per_step"] = _launches_and_syncs(trainer, prepared[-1])
        detail += (f", peak {data['peak_mib']:,.0f} MiB, {data['launches_per_step']} launches and "
                   f"{data['syncs_per_step']} host syncs per step")
        status = "FAIL" if data["syncs_per_step"] else "INFO"
    return Row(name, status, detail, data)


def check_graphs_match_eager(model: str, device: str, sizes: Sizes, batches) -> Row:
    """The same seed trained with graphs and eagerly (dropout off: the two draw masks in another
    order): the losses of every step agree."""
    import torch

    from benchmarks.throughput import paper_trainer

    name = f"graphs_match.{model}"
    if device != "cuda":
        return Row(name, "SKIP", "CUDA graphs need a CUDA device")
    pc = paper_config(model)
    pc = type(pc)(**{**asdict(pc), "config": {**pc.config, **({"dropout": 0.0} if "dropout" in pc.config else {})}})
    losses = {}
    for mode in ("off", "on"):
        trainer = paper_trainer(pc, device, "fp32", 32, cuda_graphs=mode)
        trainer.model.train()
        steps = []
        for batch in batches * 2:  # every shape twice: captured, then replayed
            batch = _labelled(batch, pc.config["num_classes"], static=True).to(trainer.device)
            steps.append(float(trainer.training_step(batch)[0]))
        losses[mode] = torch.tensor(steps)
    worst = float((losses["on"] - losses["off"]).abs().max())
    ok = torch.allclose(losses["on"], losses["off"], rtol=1e-4, atol=1e-5)
    return Row(name, "PASS" if ok else "FAIL",
               f"{len(losses['on'])} steps, graphs against eager: largest loss difference {worst:.2e}",
               {"max_abs_difference": worst})


PACKED_TRIALS = (1, 2, 4, 8)
PACKED_SCRIPT = """
import pathlib, sys, time, torch
from benchmarks.gpu_check import _labelled, paper_config
from benchmarks.throughput import make_pool, paper_trainer, select_batches
from benchmarks.common import Context
barrier, trials, seconds = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
device, index = sys.argv[4], sys.argv[5]
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
pool, _ = make_pool(Context())
batches = [_labelled(b, 3, static=True).to(device) for b in select_batches(pool, 8, 32)]
trainer = paper_trainer(paper_config(sys.argv[6]), device, "fp32", 32, cuda_graphs="auto")
trainer.model.train()
for b in batches:  # warm-up and every shape's capture, before the clock
    trainer.training_step(b)
sync()
(barrier / f"ready-{trials}-{index}").touch()
waited = time.time()
while len(list(barrier.glob(f"ready-{trials}-*"))) < trials and time.time() - waited < 300:
    time.sleep(0.05)
started, pairs = time.perf_counter(), 0
while time.perf_counter() - started < seconds:
    for b in batches:
        trainer.training_step(b)
    sync()
    pairs += 32 * len(batches)
print(pairs / (time.perf_counter() - started))
"""


def packed_rates(device: str, trials: tuple[int, ...], seconds: float, model: str = "decomposable"
                 ) -> tuple[dict[int, float], list[Row]]:
    """For each k of ``trials``: k trials of ``model``'s checked variant (separate processes, as
    Ray runs trials) training at once on ``device``; each warms up and captures its graphs, waits
    until all k have, then trains for ``seconds``. Their aggregate pairs/s by k, and a FAIL row
    per k where a process failed.

    Args:
        device: where the trials train.
        trials: the numbers of trials to run at once, one after another.
        seconds: how long each set trains once all its trials are ready.
        model: a key of CHECKED.
    """
    rates, failed = {}, []
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    barrier = Path(tempfile.mkdtemp(prefix="gc_packing_"))
    for k in trials:
        processes = [subprocess.Popen([sys.executable, "-c", PACKED_SCRIPT, str(barrier), str(k), str(seconds),
                                       device, str(i), model],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for i in range(k)]
        outputs = [p.communicate(timeout=400) for p in processes]
        if any(p.returncode for p in processes):
            err = next(o[1] for o, p in zip(outputs, processes, strict=True) if p.returncode)
            failed.append(Row(f"packing.{k}", "FAIL", f"a trial process failed: {err.strip()[-300:]}"))
            continue
        rates[k] = sum(float(o[0].split()[-1]) for o in outputs)
    return rates, failed


# snli_wbw.yaml's grid (lr x dropout x ℓ2, 36 configurations) and issue 47's goals on one GPU: the
# stack's configurations/hour >= 10x one trial at a time, >= 3x the best packing of trials.
STACK_GRID = {"lr": (1e-4, 3e-4, 1e-3), "dropout": (0.0, 0.1, 0.2), "l2": (0.0, 1e-4, 3e-4, 1e-3)}
STACK_GOALS = {"one_at_a_time": 10.0, "best_packing": 3.0}
# "A configuration's 5 seeds cost about one trial's wall time" (issue 47), read as at most 1.5x.
SEEDS, SEEDS_GOAL = 5, 1.5
STACK_PACKINGS = (4, 8)
DRY_STACK_MEMBERS = 4


def stack_configs(device: str, sizes: Sizes) -> list:
    """The word-by-word model's snli_wbw grid as RunConfigs (DRY_STACK_MEMBERS of it in the dry
    run), Adam at batch 32, fp32, eager (stacks do not capture graphs).

    Args:
        device: the training device.
        sizes: the check's sizes (tiny: the dry run's).
    """
    import itertools

    from nli_models.config import RunConfig

    block = model_block("rocktaschel", sizes)
    points = list(itertools.product(*STACK_GRID.values()))
    if sizes.tiny:  # spread over the grid: members of their own dropout rates, lr and ℓ2
        points = points[:: len(points) // DRY_STACK_MEMBERS][:DRY_STACK_MEMBERS]
    return [RunConfig.model_validate({
        "name": f"gpu_check_stack_{i}", "model": {**block, "args": {**block["args"], "dropout": dropout}},
        "data": {"corpus": "toy"},
        "training": {"optimizer": "adam", "batch_size": 32, "lr": lr, "l2": l2, "seed": 1, "device": device}})
        for i, (lr, dropout, l2) in enumerate(points)]


def _pairs_per_s(step, batches, sizes: Sizes, device: str) -> float:
    """Pairs/s of ``step`` over ``batches`` (after one warm-up pass), for at least min_seconds."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for batch in batches:
        step(batch)
    sync()
    pairs, seconds = 0, 0.0
    while seconds == 0.0 or seconds < sizes.min_seconds:
        started = time.perf_counter()
        for batch in batches:
            step(batch)
        sync()
        seconds += time.perf_counter() - started
        pairs += sum(b.label.shape[-1] for b in batches)  # a MemberBatch's per member
    return pairs / seconds


def check_stacking(device: str, sizes: Sizes, batches) -> list[Row]:
    """The snli_wbw grid (word-by-word attention, k=100) as one stack against its trials: the
    stack's member-pairs/s (members x pairs/s of its step) against one trial's pairs/s as it
    trains by default (graphs on CUDA), and on CUDA against the best of STACK_PACKINGS trial
    processes at once (``packed_rates``). Configurations/hour go as these rates (every
    configuration trains the same epochs), so their ratio is the configurations/hour ratio.

    Args:
        device: "cuda" (goal rows PASS/FAIL) or "cpu" (the dry run: INFO rows).
        sizes: the check's sizes.
        batches: the timed batches (SNLI dev lengths, ids below throughput.VOCAB_SIZE).
    """
    import torch

    from benchmarks.throughput import VOCAB_SIZE
    from nli_models.data import PreparedData, Vocabulary
    from nli_models.stacked import MemberBatch, StackedTrainer
    from nli_models.training import make_trainer

    configs = stack_configs(device, sizes)
    # The timed batches' token ids are below VOCAB_SIZE (SNLI dev lengths, throughput's pool).
    vocabulary = Vocabulary(["<pad>", "<unk>", *(f"w{i}" for i in range(VOCAB_SIZE - 2))])
    data = PreparedData("synthetic", vocabulary, ("entailment", "neutral", "contradiction"), {})
    solo = make_trainer(configs[0], data)
    solo.model.train()
    # On CUDA the trial trains as CUDA graphs (training.cuda_graphs auto), on static lengths.
    solo_rate = _pairs_per_s(solo.training_step, [_labelled(b, 3, static=device == "cuda").to(solo.device)
                                                  for b in batches], sizes, device)
    del solo
    stack = StackedTrainer(configs, data)
    stack.model.train()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    stack_rate = _pairs_per_s(stack.training_step,
                              [_labelled(b, 3, static=False).to(stack.device) for b in batches], sizes, device)
    members = len(configs)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    rows = [Row("stacking.rates", "INFO",
                f"one trial {solo_rate:,.0f} pairs/s; a stack of {members}: {stack_rate:,.0f} pairs/s per member, "
                f"{members * stack_rate:,.0f} member-pairs/s" + (f", peak {peak:,.0f} MiB" if peak else ""),
                {"members": members, "solo_pairs_per_s": solo_rate, "stack_pairs_per_s": stack_rate,
                 "peak_mib": peak})]
    over_one = members * stack_rate / solo_rate
    goal = STACK_GOALS["one_at_a_time"]
    rows.append(Row("stacking.one_at_a_time", ("PASS" if over_one >= goal else "FAIL") if device == "cuda" else "INFO",
                    f"the stack trains {over_one:.2f}x the configurations/hour of one trial at a time "
                    f"(goal on one GPU >= {goal}x)", {"ratio": over_one}))
    del stack
    # A configuration's seeds as one stack: each member on batches of its own (MemberBatch).
    seeds = StackedTrainer([configs[0].model_copy(update={"training": configs[0].training.model_copy(
        update={"seed": seed})}) for seed in range(1, SEEDS + 1)], data)
    seeds.model.train()
    host = [_labelled(b, 3, static=False) for b in batches]
    per_member = [MemberBatch.of([host[(t + j) % len(host)] for j in range(SEEDS)], seeds.order_of_member)
                  .to(seeds.device) for t in range(len(host))]
    seeds_rate = _pairs_per_s(seeds.training_step, per_member, sizes, device)
    over_solo = solo_rate / seeds_rate  # wall time of the stack's epoch against one trial's
    rows.append(Row("stacking.seeds", ("PASS" if over_solo <= SEEDS_GOAL else "FAIL") if device == "cuda" else "INFO",
                    f"{SEEDS} seeds of one configuration as a stack take {over_solo:.2f}x one trial's wall time "
                    f"(goal on one GPU <= {SEEDS_GOAL}x)", {"ratio": over_solo, "seeds_pairs_per_s": seeds_rate}))
    if device != "cuda":
        return rows
    packed, failed = packed_rates(device, STACK_PACKINGS, 10.0, model="rocktaschel")
    rows += failed
    if packed:
        best_k, best = max(packed.items(), key=lambda item: item[1])
        over_packing = members * stack_rate / best
        goal = STACK_GOALS["best_packing"]
        rows.append(Row("stacking.best_packing", "PASS" if over_packing >= goal else "FAIL",
                        f"the stack trains {over_packing:.2f}x the configurations/hour of the best packing "
                        f"({best_k} trials at once: {best:,.0f} pairs/s in all; goal >= {goal}x)",
                        {"ratio": over_packing, "packed": packed}))
    return rows


def check_packing(device: str, seconds: float = 10.0) -> list[Row]:
    """1, 2, 4 and 8 packed trials on one GPU (``packed_rates``), and 8 against 1."""
    if device != "cuda":
        return [Row("packing", "SKIP", "packing trials on a GPU needs a CUDA device")]
    rates, rows = packed_rates(device, PACKED_TRIALS, seconds)
    for k, rate in sorted(rates.items()):
        rows.append(Row(f"packing.{k}", "INFO",
                        f"{k} trials at once: {rate:,.0f} pairs/s in all, "
                        f"{rate * 3600 / 549_367:,.1f} SNLI epochs/hour in all",
                        {"trials": k, "pairs_per_s": rate}))
    if 1 in rates and 8 in rates:
        gain = rates[8] / rates[1]
        rows.append(Row("packing.goal", "PASS" if gain >= PACKED_GOAL else "FAIL",
                        f"8 packed trials give {gain:.2f}x the throughput of one (goal >= {PACKED_GOAL}x)"))
    return rows


def check_goals(rows: list[Row]) -> list[Row]:
    """The goals over the step rows (CUDA only): b32 fp32 pairs/s, b128 over b32, bf16 over fp32,
    each for the step as it trains by default (graphs)."""
    steps = {(r.data["model"], r.data["batch_size"], r.data["precision"], r.data["mode"]): r.data["pairs_per_s"]
             for r in rows if r.check.startswith("step.") and r.data.get("pairs_per_s")}
    found = []
    for model, goal in B32_FP32_GOALS.items():
        b32 = steps.get((model, 32, "fp32", "graphs"))
        if b32 is None:
            continue
        found.append(Row(f"goal.{model}.b32", "PASS" if b32 >= goal else "FAIL",
                         f"{b32:,.0f} pairs/s at b32 fp32 (goal >= {goal:,})"))
        b128 = steps.get((model, 128, "fp32", "graphs"))
        if b128 is not None:
            found.append(Row(f"goal.{model}.b128", "PASS" if b128 >= B128_OVER_B32 * b32 else "FAIL",
                             f"b128 gives {b128 / b32:.2f}x b32 (goal >= {B128_OVER_B32}x)"))
        for batch_size in (32, 128):
            fp32, bf16 = (steps.get((model, batch_size, p, "graphs")) for p in PRECISIONS)
            if fp32 and bf16:
                found.append(Row(f"goal.{model}.b{batch_size}.bf16", "PASS" if bf16 >= fp32 else "FAIL",
                                 f"bf16 {bf16:,.0f} against fp32 {fp32:,.0f} pairs/s (goal: bf16 >= fp32)"))
    return found


def missing_packages(*names: str) -> list[str]:
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def check_sweep(device: str, sizes: Sizes, work: Path, timeout_s: float) -> list[Row]:
    """The quickstart sweep on the toy corpus of ``sizes``, two trials at once sharing one GPU
    (0.5 each); on CPU, 0 GPUs."""
    missing = missing_packages("ray", "mlflow", "optuna", "click")
    if missing:
        return [Row("sweep", "SKIP", f"needs {', '.join(missing)} (not importable here)")]
    fraction = 0.5 if device == "cuda" else 0
    uri = f"sqlite:///{work}/mlruns.db"
    sets = [f"search.resources.gpu={fraction}", "search.resources.cpu=1", "search.max_concurrent_trials=2",
            "search.space.hidden_size.grid=[50]", "training.epochs=2", f"training.device={device}",
            f"data.toy.size={sizes.toy_pairs}",
            f"search.storage_path={work}/ray_results"]
    command = [sys.executable, "-m", "orchestrator.cli.orchestrate", "sweep", str(REPO / "search_spaces/quickstart.yaml"),
               "--new", "--tracking-uri", uri, *[a for s in sets for a in ("--set", s)]]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_TMPDIR": tempfile.mkdtemp(prefix="gc_ray_"), "NLI_DATA_DIR": str(work / "data"),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [Row("sweep", "FAIL", f"orchestrate sweep ran past {timeout_s:.0f} s")]
    wall = time.perf_counter() - started
    (work / "sweep.log").write_text(done.stdout + done.stderr)
    rows = [Row("sweep.exit", "PASS" if done.returncode == 0 else "FAIL",
                f"orchestrate sweep exit {done.returncode} in {wall:.0f} s (log {work / 'sweep.log'})")]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    spans = [(r.info.start_time, r.info.end_time or r.info.start_time) for r in trials]
    at_once = max((sum(1 for s, e in spans if s <= t < e) for t, _ in spans), default=0)
    rows.append(Row("sweep.two_at_once", "PASS" if at_once >= 2 else "FAIL",
                    f"{len(trials)} trials, at most {at_once} at once (resources.gpu {fraction} each)"))
    return rows


def environment(device: str) -> Row:
    import torch

    data: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
                            "device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        data.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    cudnn=torch.backends.cudnn.version(), bf16=torch.cuda.is_bf16_supported())
    data["missing_packages"] = missing_packages("ray", "mlflow", "optuna", "pandas")
    return Row("environment", "INFO", ", ".join(f"{k} {v}" for k, v in data.items()), data)


def markdown(rows: list[Row]) -> str:
    lines = ["| check | status | detail |", "|---|---|---|"]
    lines += [f"| {r.check} | {r.status} | {r.detail} |" for r in rows]
    return "\n".join(lines) + "\n"


def run_checks(device: str, out: Path, budget_s: float, only: set[str] | None = None) -> list[Row]:
    """Every check in order, each caught (a FAIL row with the error) and none started once
    ``budget_s`` is spent."""
    import torch

    from benchmarks.common import Context
    from benchmarks.throughput import make_pool, select_batches
    from nli_models.data import prepare_data

    sizes = DRY_SIZES if device == "cpu" else GPU_SIZES
    started = time.perf_counter()
    rows = [environment(device)]
    data = prepare_data({"corpus": "toy", "toy": {"size": sizes.toy_pairs, "seed": 0}}, cache_dir=out / "prepared")
    pool, _ = make_pool(Context())
    pools = {b: select_batches(pool, sizes.timed_batches, b) for b in {32, *sizes.batch_sizes}}
    jobs = [(f"train.{m}.{p}", lambda m=m, p=p: [check_training(m, p, device, sizes, data)])
            for m in CHECKED for p in PRECISIONS]
    jobs += [(f"checkpoint.{m}", lambda m=m: [check_checkpoint(m, device, sizes, data, out / f"checkpoint_{m}")])
             for m in CHECKED]
    jobs += [(f"determinism.{m}.{p}", lambda m=m, p=p: [check_determinism(m, p, device, sizes, data)])
             for m in CHECKED for p in PRECISIONS]
    jobs += [(f"step.{m}.b{b}.{p}.{mode}",
              lambda m=m, b=b, p=p, mode=mode: [check_step(m, b, p, mode, device, sizes, pools[b])])
             for m in CHECKED for b in sizes.batch_sizes for p in PRECISIONS for mode in MODES]
    jobs += [(f"graphs_match.{m}", lambda m=m: [check_graphs_match_eager(m, device, sizes, pools[32][:4])])
             for m in CHECKED]
    jobs.append(("packing", lambda: check_packing(device)))
    jobs.append(("stacking", lambda: check_stacking(device, sizes, pools[32])))
    # The sweep gets what is left of the budget (at least 30 s): the whole run ends by budget + 30 s.
    jobs.append(("sweep", lambda: check_sweep(device, sizes, out, max(30.0, budget_s - (time.perf_counter() - started)))))
    for name, job in jobs:
        if only is not None and name.split(".")[0] not in only:
            continue
        if time.perf_counter() - started > budget_s:
            rows.append(Row(name, "SKIP", f"the check's budget of {budget_s:.0f} s was spent"))
            continue
        try:
            new = job()
        except Exception as exc:  # noqa: BLE001 - a check that raises is a FAIL row, the rest still run
            new = [Row(name, "FAIL", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}")]
        finally:
            torch.use_deterministic_algorithms(False)
        for row in new:
            print(f"{row.status:4s} {row.check}: {row.detail}", flush=True)
        rows += new
    rows += check_goals(rows)
    rows.append(Row("total", "INFO", f"{time.perf_counter() - started:.0f} s"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a dry run of the same code with tiny sizes")
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="where summary.json/.md go")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="no check starts after this; the sweep stops at it (at least 30 s); "
                        "default 420 on cuda, 3600 on cpu")
    parser.add_argument("--only", default=None,
                        help="comma-separated check kinds: train,checkpoint,determinism,step,graphs_match,"
                        "packing,stacking,sweep")
    args = parser.parse_args(argv)
    # Read when cuBLAS starts: set before any CUDA work so that the determinism check can pass.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: --device cuda but torch {torch.__version__} sees no CUDA device "
              "(use --device cpu for a dry run)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    budget_s = args.budget_s if args.budget_s is not None else {"cuda": 420.0, "cpu": 3600.0}[args.device]
    rows = run_checks(args.device, args.out.resolve(), budget_s, only)
    (args.out / "summary.json").write_text(json.dumps([asdict(r) for r in rows], indent=1, default=str))
    text = markdown(rows)
    (args.out / "summary.md").write_text(text)
    print("\n" + text + f"\nwritten: {args.out / 'summary.json'}, {args.out / 'summary.md'}")
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
