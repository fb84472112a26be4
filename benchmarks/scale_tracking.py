"""The shared tracking server under load: 8 sweeps at once against one `orchestrate server` over
PostgreSQL, and the server restarted in the middle.

Each sweep is a process of its own (its own experiment) whose trials are threads: a trial creates
its run, then per epoch waits the epoch time and sends one ``MlflowClient.log_batch`` of the 12
metrics of ``ray_trial.epoch_metrics`` (what the sweep's uploader sends per epoch), then ends
the run. MLflow's own HTTP retries are off (MLFLOW_HTTP_REQUEST_MAX_RETRIES=0) so every timed call
is one request; a failed call is retried by the trial (0.5 s apart, as an uploader would) until
it succeeds, and the time until then is the batch's latency.

Two phases, one server:
- saturation: epoch time 0 (every trial sends back to back): the most batches per second one
  server takes on this machine, and their latency;
- restart: paced trials (EPOCH_S per epoch); the server is stopped and started again in the
  middle; latencies before/after and across the restart, the downtime.
Then every run's metric history is counted in PostgreSQL: exactly one row per (metric, epoch).
The load generator runs on the same 2 cores as the server, so the throughput is a lower bound.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import numpy as np

from benchmarks.common import Context, log, md_table, target
from benchmarks.scale_support import Database, Server
from results import run_schema as rs

NAME = "scale_tracking"
TITLE = "Shared tracking server: 8 sweeps at once over PostgreSQL, restarted mid-way"

SWEEPS = 8
METRICS = (rs.METRIC_EPOCHS_TRAINED, rs.METRIC_TRAIN_LOSS, rs.METRIC_TRAIN_ACCURACY, rs.METRIC_DEV_LOSS,
           rs.METRIC_DEV_ACCURACY, rs.METRIC_EPOCH_TIME, rs.METRIC_BEST_DEV_ACCURACY, rs.METRIC_BEST_TRAIN_ACCURACY,
           rs.METRIC_BEST_EPOCH, rs.METRIC_THETA_M, rs.METRIC_THETA_WM, rs.RESULT_TRIAL_FINISHED)
EPOCH_S = 1.0
RETRY_S = 0.5
P99_TARGET_S = 1.0


def _with_retry(call, deadline: float) -> tuple[float, int]:
    """Calls until it succeeds; (seconds from first try to success, failed tries)."""
    begun, failures = time.perf_counter(), 0
    while True:
        try:
            call()
            return time.perf_counter() - begun, failures
        except Exception:
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_S)


def sweep_load(url: str, sweep: int, trials: int, epochs: int, epoch_s: float, budget_s: float,
               ready, go) -> dict[str, Any]:
    """One sweep in its own process: `trials` concurrent trial threads, started when every sweep
    has its experiment (`ready`, then `go`: process start-up is not load); per-batch latencies."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "30"
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=url)
    deadline = time.monotonic() + budget_s
    experiment = f"bench-load-{sweep}-{os.getpid()}-{time.time_ns()}"
    experiment_id = _call(lambda: client.create_experiment(experiment), deadline)
    ready.put(sweep)
    go.wait()
    batches: list[tuple[float, float, int]] = []  # (end time, seconds, failed tries)
    errors: list[str] = []
    lock = threading.Lock()

    def trial(index: int) -> None:
        try:
            run = _call(lambda: client.create_run(experiment_id, tags={"nli.trial_id": f"t{index:04d}"}), deadline)
            run_id = run.info.run_id
            for epoch in range(1, epochs + 1):
                time.sleep(epoch_s)
                now = int(time.time() * 1000)
                metrics = [Metric(key, float(epoch + i / 100), now, epoch) for i, key in enumerate(METRICS)]
                seconds, failures = _with_retry(lambda batch=metrics: client.log_batch(run_id, metrics=batch), deadline)
                with lock:
                    batches.append((time.time(), seconds, failures))
            _call(lambda: client.set_terminated(run_id), deadline)
        except Exception as exc:  # counted: a trial that could not report is a lost trial
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=trial, args=(i,)) for i in range(trials)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"experiment": experiment, "batches": batches, "errors": errors}


def _call(function, deadline: float):
    box: list = []
    _with_retry(lambda: box.append(function()), deadline)
    return box[0]


def load_phase(server: Server, trials: int, epochs: int, epoch_s: float, restart_after_s: float | None,
               budget_s: float) -> dict[str, Any]:
    restart: dict[str, float] = {}
    context = get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(SWEEPS, mp_context=context) as pool:
        ready, go = manager.Queue(), manager.Event()
        futures = [pool.submit(sweep_load, server.url, s, trials, epochs, epoch_s, budget_s, ready, go)
                   for s in range(SWEEPS)]
        for _ in range(SWEEPS):
            ready.get(timeout=budget_s)
        begun = time.time()
        go.set()
        if restart_after_s is not None:
            time.sleep(restart_after_s)
            restart["stopped_at"] = time.time()
            server.stop()
            time.sleep(2.0)  # a restart as a deploy does it: down, then up again
            restart["startup_s"] = server.start()
            restart["up_at"] = time.time()
        results = [f.result() for f in futures]
    batches = [b for r in results for b in r["batches"]]
    wall = max((b[0] for b in batches), default=begun) - begun  # the load, not process start-up
    seconds = np.array([b[1] for b in batches]) if batches else np.array([0.0])
    steady = np.array([b[1] for b in batches if b[2] == 0]) if batches else np.array([0.0])
    out = {
        "sweeps": SWEEPS, "trials_per_sweep": trials, "epochs": epochs, "epoch_s": epoch_s, "wall_s": wall,
        "batches": len(batches), "batches_per_s": len(batches) / wall,
        "metric_values_per_s": len(batches) * len(METRICS) / wall,
        "latency_s": {"p50": float(np.percentile(seconds, 50)), "p99": float(np.percentile(seconds, 99)),
                      "max": float(seconds.max())},
        "latency_first_try_s": {"p50": float(np.percentile(steady, 50)), "p99": float(np.percentile(steady, 99))},
        "batches_retried": sum(b[2] > 0 for b in batches), "failed_tries": sum(b[2] for b in batches),
        "errors": [e for r in results for e in r["errors"]], "experiments": [r["experiment"] for r in results],
    }
    if restart:
        out["restart"] = {"down_s": restart["up_at"] - restart["stopped_at"], "startup_s": restart["startup_s"]}
        around = [b[1] for b in batches if restart["stopped_at"] - 5 <= b[0] - b[1] <= restart["up_at"] + 5]
        out["restart"]["batches_across"] = len(around)
        out["restart"]["max_latency_across_s"] = max(around, default=0.0)
    return out


def count_history(db: Database, experiments: list[str], epochs: int) -> dict[str, int]:
    """Rows per (run, metric) against one per epoch."""
    rows = db.query(
        """SELECT r.run_uuid, m.key, COUNT(*), COUNT(DISTINCT m.step)
           FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id
           LEFT JOIN metrics m ON m.run_uuid = r.run_uuid
           WHERE e.name = ANY(%s) GROUP BY r.run_uuid, m.key""", (experiments,))
    runs = {r[0] for r in rows}
    expected = len(runs) * len(METRICS) * epochs
    present = sum(int(r[3]) for r in rows if r[1] is not None)
    return {"runs": len(runs), "rows": sum(int(r[2]) for r in rows if r[1] is not None), "expected_rows": expected,
            "lost": expected - present, "doubled": sum(int(r[2]) - int(r[3]) for r in rows if r[1] is not None)}


def run(ctx: Context) -> dict[str, Any]:
    saturate = (2, 5) if ctx.quick else (4, 20)  # trials per sweep, epochs
    paced = (2, 6) if ctx.quick else (8, 30)
    folder = ctx.work_dir("scale-tracking")
    db = Database()
    server = Server(db.uri, folder / "server")
    try:
        startup = server.start()
        log(f"scale_tracking: server {server.url} over {db.name} up in {startup:.1f} s")
        load = {"loadavg_before": list(os.getloadavg())}
        sat = load_phase(server, *saturate, epoch_s=0.0, restart_after_s=None, budget_s=600)
        sat["history"] = count_history(db, sat["experiments"], saturate[1])
        log(f"scale_tracking: saturation {sat['batches_per_s']:.0f} batches/s, p99 {sat['latency_s']['p99'] * 1000:.0f} ms")
        restart_at = paced[1] * EPOCH_S * 0.4
        res = load_phase(server, *paced, epoch_s=EPOCH_S, restart_after_s=restart_at, budget_s=600)
        res["history"] = count_history(db, res["experiments"], paced[1])
        log(f"scale_tracking: restart phase {res['batches_per_s']:.0f} batches/s, p99 "
            f"{res['latency_s']['p99'] * 1000:.0f} ms, {res['history']}")
        load["loadavg_after"] = list(os.getloadavg())
    finally:
        server.stop()
        db.drop()
    for phase in (sat, res):
        phase.pop("experiments")
    # A trial sends one batch per epoch (plus a start and an end): at the saturation rate one
    # server keeps up with this many concurrent trials of a given epoch length.
    sustained = {f"{epoch_s:g} s epochs": int(sat["batches_per_s"] * epoch_s) for epoch_s in (1, 10, 60)}
    intact = all(p["history"]["lost"] == 0 and p["history"]["doubled"] == 0 and not p["errors"] for p in (sat, res))
    rows = [(name, p["sweeps"] * p["trials_per_sweep"], p["epochs"], p["epoch_s"], p["batches"],
             round(p["batches_per_s"], 1), round(p["latency_s"]["p50"] * 1000, 1), round(p["latency_s"]["p99"] * 1000, 1),
             round(p["latency_s"]["max"] * 1000, 0), p["batches_retried"],
             f"{p['history']['rows']}/{p['history']['expected_rows']}", p["history"]["doubled"], len(p["errors"]))
            for name, p in (("saturation", sat), ("restart mid-way", res))]
    targets = [
        target("nothing lost or doubled across a restart", "one metric row per (run, metric, epoch)",
               f"{res['history']['rows']}/{res['history']['expected_rows']} rows, {res['history']['doubled']} doubled; "
               f"saturation {sat['history']['rows']}/{sat['history']['expected_rows']}", intact),
        target("p99 latency of a metric batch (steady)", f"<= {P99_TARGET_S:g} s",
               f"{sat['latency_first_try_s']['p99'] * 1000:.0f} ms at saturation "
               f"({sat['batches_per_s']:.0f} batches/s)", sat["latency_first_try_s"]["p99"] <= P99_TARGET_S),
    ]
    summary = (
        f"One `orchestrate server` (1 worker) over PostgreSQL; {SWEEPS} sweeps at once (processes, experiments of "
        f"their own), trials as threads, one log_batch of {len(METRICS)} metrics per epoch; the load generator shares "
        "the 2 cores.\n\n"
        + md_table(["phase", "trials at once", "epochs", "epoch s", "batches", "batches/s", "p50 ms", "p99 ms",
                    "max ms", "batches retried", "rows/expected", "doubled", "trial errors"], rows)
        + f"\n\nRestart: down {res['restart']['down_s']:.1f} s (start-up {res['restart']['startup_s']:.1f} s); "
        f"the slowest batch across it took {res['restart']['max_latency_across_s']:.1f} s. One server sustains about "
        + ", ".join(f"{v:,} trials at once with {k}" for k, v in sustained.items()) + "."
    )
    return {"load": load, "saturation": sat, "restart": res, "sustained_trials": sustained,
            "targets": targets, "summary_md": summary}
