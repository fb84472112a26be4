"""CPU of one small sweep, every process of it: a one-trial `orchestrate sweep` of an 8-wide model
on 150 toy pairs (one epoch), run on a new SQLite store, repeated. /proc is
sampled every 0.1 s for the driver and its descendants (benchmarks.sweeps.CpuSampler), and each
process counts with the last CPU time seen (user + system), by kind: the driver, the trial's
worker, workers Ray started that stayed idle, Ray's own processes. What the
test suite pays per sweep it starts, and what a researcher's machine pays beside each sweep's
training.

`SWEEP_CPU_TREE=DIR` runs the `orchestrate` of another checkout of this repository (an earlier
commit, say) with this project's environment, for a before/after on one machine. A pure-Python
loop (10^7 additions, CPU-s) is timed too: figures from machines of different speeds compare
through it (a function's loop, not a module-level one, which runs 2-3x slower). Last, a local
instance started as a sweep starts it (by this checkout, whatever SWEEP_CPU_TREE says) is left
idle for a minute: its processes' CPU per minute.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Context, md_table, median
from benchmarks.sweeps import CpuSampler, write_spec

NAME = "sweep_cpu"
TITLE = "CPU of one small sweep, by process"
REPO = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.1


SPEC: dict[str, Any] = {
    "name": "cpu",
    "model": {"name": "decomposable", "variant": "vanilla",
              "args": {"embedding_dim": 8, "projection_dim": 8, "hidden_size": 8, "dropout": 0.0}},
    "data": {"corpus": "toy", "toy": {"size": 150, "seed": 0}},
    "training": {"optimizer": "adam", "lr": 0.01, "batch_size": 16, "epochs": 1, "num_threads": 1},
    "search": {"sampler": "grid", "space": {"lr": {"grid": [0.01]}}, "seeds": [1],
               "max_concurrent_trials": 1, "resources": {"cpu": 1}},
}


def _one_sweep(folder: Path, tree: Path) -> dict[str, Any]:
    spec = write_spec(SPEC, folder)  # its store and Ray results in `folder`
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.orchestrate", "sweep", str(spec), "--new"],
                               cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = CpuSampler(SAMPLE_S, root=process.pid, root_kind="driver")
    _, stderr = process.communicate()
    sampled = sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"the sweep exited {process.returncode}:\n{stderr[-3000:]}")
    return {"wall_s": round(sampled["wall_s"], 2), "total_cpu_s": round(sum(sampled["cpu_s"].values()), 2),
            "cpu_s": sampled["cpu_s"]}


def _idle_instance_cpu_s(seconds: float) -> dict[str, float]:
    """CPU-seconds per minute of a local Ray instance started as a sweep starts it, left idle
    (after 10 s to settle): what an instance held open between sweeps costs."""
    from orchestrator.ray_adapter.ray_runtime import init_ray, shutdown_ray

    init_ray()
    try:
        time.sleep(10)
        sampler = CpuSampler(0.5, root_kind="this process")
        time.sleep(seconds)
        sampled = sampler.stop()
    finally:
        shutdown_ray()
    per_minute = {k: round(v * 60 / sampled["wall_s"], 2) for k, v in sampled["cpu_s"].items()
                  if k != "this process"}
    return {"all": round(sum(per_minute.values()), 2), **per_minute}


def _python_loop_cpu_s() -> float:
    started = time.process_time()
    total = 0
    for i in range(10**7):
        total += i
    return round(time.process_time() - started, 3)


def run(ctx: Context) -> dict[str, Any]:
    tree = Path(os.environ.get("SWEEP_CPU_TREE", REPO)).resolve()
    repeats = 1 if ctx.quick else 3
    runs = [_one_sweep(ctx.work_dir(f"{NAME}-{i}"), tree) for i in range(repeats)]
    groups = sorted({g for r in runs for g in r["cpu_s"]})
    medians = {g: median(r["cpu_s"].get(g, 0.0) for r in runs) for g in groups}
    total = median(r["total_cpu_s"] for r in runs)
    wall = median(r["wall_s"] for r in runs)
    loop = _python_loop_cpu_s()
    idle = _idle_instance_cpu_s(10 if ctx.quick else 60)
    rows = [[g, f"{medians[g]:.2f}", ", ".join(f"{r['cpu_s'].get(g, 0.0):.2f}" for r in runs)] for g in groups]
    rows.append(["all", f"{total:.2f}", ", ".join(f"{r['total_cpu_s']:.2f}" for r in runs)])
    summary = (f"orchestrate of {tree}; {repeats} run(s); median wall {wall:.1f} s; "
               f"pure-Python loop (10^7 additions) {loop:.2f} CPU-s\n\n"
               + md_table(["processes", "CPU-s (median)", "each run"], rows)
               + f"\n\nAn idle local instance (no sweep): {idle['all']:.2f} CPU-s per minute of its processes.")
    return {"tree": str(tree), "runs": runs, "median_cpu_s": medians, "median_total_cpu_s": total,
            "median_wall_s": wall, "python_loop_cpu_s": loop, "idle_instance_cpu_s_per_minute": idle,
            "summary_md": summary}
