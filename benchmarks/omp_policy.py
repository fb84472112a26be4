"""OpenMP wait policy, side by side: training steps of one paper model (Rocktäschel attention,
k=100, at paper size as in `throughput`) with 2 torch threads under OMP_WAIT_POLICY=ACTIVE and
PASSIVE, (a) one process alone on the machine and (b) two such processes at once (2 x 2 threads,
oversubscribed on a 2-core machine). The policy is read when torch loads, so every process is a
fresh one (`python -m benchmarks.omp_policy --worker SECONDS`); the two policies alternate, and
each case is repeated. What `orchestrate` chooses from this: orchestrator/sweep/environment.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Context, loadavg, log, md_table, median

NAME = "omp_policy"
TITLE = "OpenMP wait policy: cores of its own against shared cores"
MODEL_ROW = "Table 1: Attention (k=100)"
THREADS = 2
POLICIES = ("ACTIVE", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]


def _worker(seconds: float) -> dict[str, Any]:
    """Pairs/s of training passes over the throughput benchmark's batches for `seconds`."""
    import torch

    from benchmarks.throughput import _trainer, make_pool, select_batches, train_pass
    from nli_models.registry import paper_configs

    config = next(pc for pc in paper_configs() if pc.table_row == MODEL_ROW)
    trainer = _trainer(config)
    batches = select_batches(make_pool(Context())[0], 8)
    torch.set_num_threads(THREADS)
    train_pass(trainer, batches[:2], 3)  # warm-up
    pairs, elapsed, cpu = 0, 0.0, 0.0
    while elapsed < seconds:
        phases = train_pass(trainer, batches, 3)
        pairs += sum(len(b) for b in batches)
        elapsed += phases["total"]
        cpu += phases["cpu_share"] * phases["total"]
    return {"pairs_per_s": pairs / elapsed, "cpu_share": cpu / elapsed,
            "policy": os.environ.get("OMP_WAIT_POLICY"), "threads": torch.get_num_threads()}


def _start(policy: str, seconds: float) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.omp_policy", "--worker", str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )


def _result(process: subprocess.Popen) -> dict[str, Any]:
    out, err = process.communicate(timeout=900)
    if process.returncode != 0:
        raise RuntimeError(f"omp_policy worker failed: {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def measure(processes: int, policy: str, seconds: float) -> dict[str, Any]:
    """`processes` workers at once under `policy`: pairs/s of each, their sum, the load before."""
    load = loadavg()[0]
    workers = [_start(policy, seconds) for _ in range(processes)]
    results = [_result(w) for w in workers]
    assert all(r["policy"] == policy and r["threads"] == THREADS for r in results), results
    return {"per_process": [r["pairs_per_s"] for r in results],
            "total": sum(r["pairs_per_s"] for r in results),
            "cpu_share": [r["cpu_share"] for r in results], "load_before": load}


def run(ctx: Context) -> dict[str, Any]:
    seconds, repeats = (3.0, 1) if ctx.quick else (10.0, 3)
    cases = {"alone (1 process x 2 threads)": 1, "oversubscribed (2 processes x 2 threads)": 2}
    samples: dict[str, dict[str, list[dict]]] = {case: {p: [] for p in POLICIES} for case in cases}
    for case, processes in cases.items():
        for repeat in range(repeats):
            for policy in POLICIES if repeat % 2 == 0 else POLICIES[::-1]:
                sample = measure(processes, policy, seconds)
                samples[case][policy].append(sample)
                log(f"{case} {policy}: {sample['total']:.0f} pairs/s (load {sample['load_before']:.1f})")
    rows = []
    for case in cases:
        medians = {p: median(s["total"] for s in samples[case][p]) for p in POLICIES}
        loads = [s["load_before"] for p in POLICIES for s in samples[case][p]]
        rows.append([case, f"{medians['ACTIVE']:,.0f}", f"{medians['PASSIVE']:,.0f}",
                     f"{medians['ACTIVE'] / medians['PASSIVE']:.2f}x",
                     f"{min(loads):.1f}-{max(loads):.1f}"])
    table = md_table(["case", "ACTIVE pairs/s", "PASSIVE pairs/s", "ACTIVE / PASSIVE",
                      "load average before"], rows)
    summary = (f"{MODEL_ROW}, batch 32, {THREADS} torch threads per process; medians of {repeats} "
               f"runs of {seconds:.0f} s per cell (pairs/s summed over the processes), "
               f"{os.cpu_count()} CPUs.\n\n{table}\n")
    return {"samples": samples, "summary_md": summary, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(float(sys.argv[2]))))
    else:
        sys.exit("usage: python -m benchmarks.run omp_policy  (workers: --worker SECONDS)")
