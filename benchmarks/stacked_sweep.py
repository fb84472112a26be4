"""Stacked trials as a researcher runs them: `stacking`'s ABCNN-3 grid (8 configurations, lr x ℓ2,
one seed) through the real `orchestrate sweep`, with `search.stack` off, 8, 4 and auto, on this
machine's cores. Where `stacking` times training alone in one process, this counts all a sweep pays per
trial beside it: the trial's Ray worker, its MLflow run and metrics, its checkpoints, the
selection and the one test evaluation. A stack is one Tune trial with one trial's resources
(`search.resources.cpu: 1`, one torch thread), so with 2 cores the 8 separate trials run 2 at a
time, a stack of 8 runs alone on one core, and 2 stacks of 4 run side by side (what auto makes
of 8 configurations on 2 trial slots; the start line it prints is recorded).

Each sweep runs in a fresh process on a fresh SQLite store, its process tree's CPU sampled from
/proc (``benchmarks.sweeps.CpuSampler``); the four ways alternate, `--quick` runs each once (one
epoch), a full run twice (3 epochs, no early stopping: every configuration trains the same
batches). Configurations/hour = 8 x 3600 / wall seconds (and per CPU-hour of the tree). Each
configuration's best dev accuracy is read back from its MLflow run, stacked or not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import Context, loadavg, log, md_table, median
from benchmarks.stacking import ABCNN_GRID, MODELS, data_block
from benchmarks.sweeps import CpuSampler, read_trial_runs, write_spec

NAME = "stacked_sweep"
TITLE = "Stacked trials through `orchestrate sweep`: 8 ABCNN-3 configurations, stacked and not (CPU)"
REPO = Path(__file__).resolve().parents[1]
WAYS = ("off", "8", "4", "auto")  # search.stack


def sweep_spec(data: dict[str, Any], epochs: int) -> dict[str, Any]:
    """`stacking`'s ABCNN-3 lr x ℓ2 grid as a sweep: one seed, one CPU and one thread per trial."""
    model, _ = MODELS["abcnn3"]
    return {
        "name": "stacked_sweep",
        "model": model,
        "data": data,
        "training": {"optimizer": "adagrad", "batch_size": 32, "epochs": epochs, "num_threads": 1,
                     "device": "cpu"},
        "search": {"sampler": "grid", "seeds": [1], "resources": {"cpu": 1},
                   "space": {"lr": {"grid": sorted({p["lr"] for p in ABCNN_GRID})},
                             "l2": {"grid": sorted({p["l2"] for p in ABCNN_GRID})}}},
    }


def one_sweep(spec: dict[str, Any], stack: str, folder: Path) -> dict[str, Any]:
    """Wall and CPU seconds of one `orchestrate sweep` with search.stack `stack`, and each
    configuration's best dev accuracy from its MLflow run."""
    path = write_spec(spec, folder)  # its own SQLite store and Ray results in `folder`
    command = [sys.executable, "-m", "orchestrator.cli.orchestrate", "sweep", str(path), "--new",
               "--set", f"search.stack={stack}"]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = CpuSampler(0.2, root=process.pid, root_kind="driver")
    _, stderr = process.communicate()
    sampled = sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"search.stack {stack}: the sweep exited {process.returncode}:\n{stderr[-3000:]}")
    runs = read_trial_runs(f"sqlite:///{folder / 'mlruns.db'}", spec["name"])
    if len(runs) != len(ABCNN_GRID) or any(run["status"] != "FINISHED" for run in runs):
        raise RuntimeError(f"search.stack {stack}: expected {len(ABCNN_GRID)} finished trial runs, got "
                           f"{[run['status'] for run in runs]}")
    dev = {(float(run["params"]["lr"]), float(run["params"]["l2"])): run["best_dev_accuracy"] for run in runs}
    said = next((line for line in stderr.splitlines() if line.startswith("search.stack")), "")
    return {"wall_s": round(sampled["wall_s"], 2), "cpu_s": round(sum(sampled["cpu_s"].values()), 2), "said": said,
            "cpu_by_process": sampled["cpu_s"], "dev": {f"{lr} {l2}": a for (lr, l2), a in sorted(dev.items())}}


def run(ctx: Context) -> dict[str, Any]:
    block, described = data_block(ctx)
    epochs, repeats = (1, 1) if ctx.quick else (3, 2)
    spec = sweep_spec(block, epochs)
    configurations = len(ABCNN_GRID)
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    load = {"start": loadavg()}
    for repeat in range(repeats):
        for way in WAYS:
            log(f"  search.stack {way}, run {repeat + 1} of {repeats}")
            runs[way].append(one_sweep(spec, way, ctx.work_dir(f"{NAME}-{way}-{repeat}")))
    load["end"] = loadavg()
    wall = {way: median(r["wall_s"] for r in runs[way]) for way in WAYS}
    cpu = {way: median(r["cpu_s"] for r in runs[way]) for way in WAYS}
    rows = [[way, ", ".join(f"{r['wall_s']:.1f}" for r in runs[way]), round(configurations * 3600 / wall[way]),
             f"{wall['off'] / wall[way]:.2f}x", ", ".join(f"{r['cpu_s']:.1f}" for r in runs[way]),
             round(configurations * 3600 / cpu[way]), f"{cpu['off'] / cpu[way]:.2f}x"] for way in WAYS]
    dev_rows = [[key, *(", ".join(f"{100 * r['dev'][key]:.1f}" for r in runs[way]) for way in WAYS)]
                for key in runs["off"][0]["dev"]]
    summary = (
        f"{described}; {epochs} epoch(s) per configuration, {repeats} run(s) of each way, alternating; "
        f"{os.cpu_count()} CPUs; load average {load['start']} -> {load['end']}.\n\n"
        + md_table(["search.stack", "wall s (each run)", "configs/h (median)", "wall speedup",
                    "CPU-s of the tree (each run)", "configs/CPU-h", "CPU speedup"], rows)
        + "\n\nBest dev accuracy (%) per configuration (lr, ℓ2), each run:\n\n"
        + md_table(["lr ℓ2", *(f"stack {way}" for way in WAYS)], dev_rows)
        + "\n\nThe start line of search.stack auto: " + runs["auto"][0]["said"]
    )
    return {"data": described, "epochs": epochs, "repeats": repeats, "cpus": os.cpu_count(), "runs": runs,
            "median_wall_s": wall, "median_cpu_s": cpu, "loadavg": load, "summary_md": summary}
