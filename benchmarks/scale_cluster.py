"""A simulated cluster: our whole sweep path against plain Ray Tune at N trials.

The cluster is ``ray.cluster_utils.Cluster`` on this machine: a head node that runs no trial
(0 CPUs) and NODES nodes of GPUS_PER_NODE logical "GPU" slots each (as many logical CPUs). A
trial asks for GPUS_PER_TRIAL GPUs and 1 CPU: with 4 it takes a whole node, so 16 trials run at
once. Every node is a raylet plus a dashboard and a runtime-env agent (~250 MB together), and
every concurrent trial is a Ray worker process (~250 MB, seconds of CPU to start: it imports
torch, which unpickling the sweep's PreparedData needs). On 2 shared cores, 64 one-GPU trials
at once did not get one result in 6 minutes (64 workers starting at load average 70-86, with
other users' jobs), so trials take a node each; `NLI_SCALE_GPUS_PER_TRIAL=1` gives 64 slots.

The trials stand in for training (``standin_trial``): each epoch sleeps for the trial's drawn
epoch time (EPOCH_S x U[0.5, 1.5], drawn from the trial's configuration, so both paths draw the
same), then reports the metrics of ``orchestrator.ray_adapter.ray_trial.epoch_metrics`` (the same function,
fed stand-in values) with a checkpoint (a 64 KiB weights file and the trial's config.yaml, as a
real trial writes) and resumes from its checkpoint as a real trial does.

Per N, on one cluster, in alternating order, each path in a fresh Python process (so its peak
RSS is its own: ``ru_maxrss`` of that process; the cluster runs in the benchmark's process):
- ours: ``orchestrator.sweep.driver.run_sweep`` (driver, Optuna random searcher, FIFO scheduler,
  SweepRecorder writing the journal, the JournalUploader thread, `orchestrate server` over a fresh PostgreSQL database), with
  ``orchestrator.ray_adapter.tuner.run_trial`` replaced by ``standin_trial`` in the driver (run_tuner looks the name
  up when it builds the trainable) and the test evaluation of the selected configuration replaced
  by a stand-in (there are no weights to evaluate);
- plain Tune: a Tuner with the same trainable, searcher, scheduler, concurrency, resources and
  checkpoint settings, no callbacks but one that sums the reported epoch times (for the ideal).

Measured: wall time of the whole call (ours: spec loading to the closed parent run; plain: Tuner
construction to fit() returning), the ideal (Σ trial sleep / slots, or the longest trial), driver
CPU seconds (/proc) and peak RSS (getrusage) of the path's process, tracking events (trial
starts, results, ends) per second of Tune time, the uploader's lag (JournalUploader.behind():
journal records not yet in MLflow, sampled every 0.5 s), its thread's CPU seconds (/proc,
sampled) and its drain after Tune, the analysis logged at the end, the tracking server's CPU
(its process group, /proc) while each path ran, and every trial's dev_accuracy rows in
PostgreSQL against the epochs it reported.

With NLI_SCALE_PROFILE=DIR each path's process also writes a cProfile of all its Python threads
to DIR/scale_cluster-<N>-<path>.prof (profiled runs are slower: not for the timings).
`python -m benchmarks.scale_cluster PATH SPEC ADDRESS OUT` is that process (internal).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import Context, log, md_table, setup_environment, target, write_json
from benchmarks.scale_support import (
    PROFILE_ENV,
    Database,
    Sampler,
    Server,
    cpu_seconds,
    group_cpu_seconds,
    linear_fit,
    power_fit,
    profiled,
    rss_bytes,
    thread_cpu_seconds,
)

NAME = "scale_cluster"
TITLE = "Simulated cluster: our sweep path vs plain Ray Tune at 100-10,000 stand-in trials"

NODES, GPUS_PER_NODE = 16, 4
GPUS_PER_TRIAL = int(os.environ.get("NLI_SCALE_GPUS_PER_TRIAL", "4"))
EPOCHS = 3
EPOCH_S = 1.0  # mean stand-in epoch; Ray's own 10,000-trial release test uses 1 s trials
CHECKPOINT_BYTES = 64 * 1024
RATIO_TARGET = 1.10
CPU_GAP_TARGET_MS = 20.0  # issue 26: our driver's CPU per trial at most this above plain Tune's


# -- the stand-in trial (runs in Ray workers: keep its imports light) ---------------------------
def drawn_epoch_s(params: dict[str, Any], mean_s: float) -> float:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).digest()
    return mean_s * (0.5 + int.from_bytes(digest[:8], "big") / 2**64)


def standin_trial(tune_config: dict[str, Any], *, base: dict, search: dict, data) -> None:
    """Same signature and reports as ray_trial.run_trial; sleeps instead of training."""
    from types import SimpleNamespace

    from ray import tune

    from nli_models.training import TRIAL_CONFIG_FILE
    from orchestrator.ray_adapter.ray_trial import epoch_metrics, trial_params

    params = trial_params(tune_config, search)
    epochs = int(base["training"]["epochs"])
    epoch_s = drawn_epoch_s(params, float(os.environ.get("NLI_STANDIN_EPOCH_S", EPOCH_S)))
    state = SimpleNamespace(best_dev_accuracy=0.0, best_train_accuracy=0.0, best_epoch=0)
    start = 1
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = json.loads((Path(directory) / "state.json").read_text())
        state = SimpleNamespace(**saved["state"])
        start = saved["epoch"] + 1
    for epoch in range(start, epochs + 1):
        time.sleep(epoch_s)
        accuracy = 0.33 + 0.5 * epoch / epochs * (0.5 + (epoch_s % 0.1) * 5)
        if accuracy > state.best_dev_accuracy:
            state.best_dev_accuracy, state.best_epoch = accuracy, epoch
        state.best_train_accuracy = max(state.best_train_accuracy, accuracy + 0.05)
        result = SimpleNamespace(epoch=epoch, train_loss=1.0 / epoch, train_accuracy=accuracy + 0.05,
                                 dev_loss=1.1 / epoch, dev_accuracy=accuracy, epoch_time_s=epoch_s)
        trainer = SimpleNamespace(state=state, theta_m=1000, theta_wm=100)
        with tempfile.TemporaryDirectory() as directory:
            (Path(directory) / "weights.bin").write_bytes(b"\0" * CHECKPOINT_BYTES)
            (Path(directory) / TRIAL_CONFIG_FILE).write_text(yaml.safe_dump(base, sort_keys=False))
            (Path(directory) / "state.json").write_text(json.dumps({"epoch": epoch, "state": vars(state)}))
            tune.report(epoch_metrics(trainer, result, epoch == epochs),
                        checkpoint=tune.Checkpoint.from_directory(directory))


# -- the driver --------------------------------------------------------------------------------
def sweep_spec(n: int, slots: int, tracking_uri: str, storage: Path) -> dict[str, Any]:
    return {
        "name": f"bench-scale-{n}",
        "model": {"name": "decomposable", "variant": "vanilla",
                  "args": {"embedding_dim": 8, "projection_dim": 8, "hidden_size": 8, "dropout": 0.1}},
        "data": {"corpus": "toy", "toy": {"size": 300, "seed": 0}},
        "training": {"optimizer": "adam", "lr": 0.001, "batch_size": 32, "epochs": EPOCHS},
        "search": {"sampler": "random", "num_samples": n, "sampler_seed": 0,
                   "space": {"lr": {"loguniform": [1e-5, 1e-1]}, "dropout": {"uniform": [0.0, 0.5]}},
                   "seeds": [1], "scheduler": {"type": "fifo"}, "max_concurrent_trials": slots,
                   "resources": {"cpu": 1, "gpu": GPUS_PER_TRIAL}, "tracking_uri": tracking_uri,
                   "storage_path": str(storage)},
    }


def start_cluster():
    # No idle workers started ahead of trials (16 raylets x 4 CPUs would start 64 at once).
    os.environ["RAY_enable_worker_prestart"] = "0"
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(NODES):
        cluster.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
    cluster.wait_for_nodes()
    return cluster


def run_ours(spec_path: Path, address: str) -> dict[str, Any]:
    import orchestrator.ray_adapter.tuner as tuner_module
    import orchestrator.sweep.driver as sweep_module
    import orchestrator.sweep.protocol as protocol_module
    from orchestrator.journal.recorder import SweepRecorder
    from orchestrator.tracking.uploader import JournalUploader
    from results import run_schema as rs

    counts = {"start": 0, "result": 0, "complete": 0, "error": 0}
    reported: dict[str, int] = {}
    trial_seconds: dict[str, float] = {}
    uploaders: list = []
    times: dict[str, float] = {}
    originals = {
        "run_trial": tuner_module.run_trial,
        "evaluate": protocol_module._evaluate_selected,
        "init": JournalUploader.__init__,
        "started": SweepRecorder.trial_started,
        "result": SweepRecorder.trial_result,
        "completed": SweepRecorder.trial_completed,
        "errored": SweepRecorder.trial_errored,
        "drain": JournalUploader.drain,
        "run_tuner": sweep_module.run_tuner,
        "analysis": sweep_module._log_analysis,
    }

    def init(self, *args, **kwargs):
        originals["init"](self, *args, **kwargs)
        uploaders.append(self)

    def started(self, trial_id, params):
        counts["start"] += 1
        return originals["started"](self, trial_id, params)

    def result(self, trial_id, metrics):
        counts["result"] += 1
        reported[trial_id] = reported.get(trial_id, 0) + 1
        trial_seconds[trial_id] = trial_seconds.get(trial_id, 0.0) + float(metrics.get("epoch_time_s") or 0)
        return originals["result"](self, trial_id, metrics)

    def completed(self, trial_id, last, checkpoint_dir):
        counts["complete"] += 1
        return originals["completed"](self, trial_id, last, checkpoint_dir)

    def errored(self, trial_id, params, error):
        counts["error"] += 1
        return originals["errored"](self, trial_id, params, error)

    def drain(self):  # the first drain: the wait for the uploader after Tune
        begun = time.perf_counter()
        try:
            return originals["drain"](self)
        finally:
            times.setdefault("flush_s", time.perf_counter() - begun)

    def run_tuner(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return originals["run_tuner"](*args, **kwargs)
        finally:
            times["tune_s"] = time.perf_counter() - begun

    def analysis(*args, **kwargs):  # the figures and tables logged to the parent at the end
        begun = time.perf_counter()
        try:
            return originals["analysis"](*args, **kwargs)
        finally:
            times["analysis_s"] = time.perf_counter() - begun

    def evaluate(spec, data, outcome):  # stand-in weights cannot be evaluated
        return {rs.METRIC_TEST_ACCURACY: outcome.result.best_dev_accuracy}, b"stand-in\n"

    tuner_module.run_trial = standin_trial
    protocol_module._evaluate_selected = evaluate
    sweep_module.run_tuner, sweep_module._log_analysis = run_tuner, analysis
    JournalUploader.__init__, JournalUploader.drain = init, drain
    SweepRecorder.trial_started, SweepRecorder.trial_result = started, result
    SweepRecorder.trial_completed, SweepRecorder.trial_errored = completed, errored
    rss0, cpu0 = rss_bytes(), cpu_seconds()
    # The uploader's lag: journal records not yet in MLflow (JournalUploader.behind()).
    uploader_cpu: list[float] = []  # the uploader thread's CPU seconds, last sample kept

    def probe():
        if not uploaders:
            return None
        thread = uploaders[-1]._thread
        cpu = thread_cpu_seconds(thread) if thread is not None else None
        if cpu is not None:
            uploader_cpu[:] = [cpu]
        return uploaders[-1].behind()

    sampler = Sampler(probe)
    begun = time.perf_counter()
    try:
        summary = sweep_module.run_sweep(sweep_module.SweepRequest(spec_path, new=True, address=address))
    finally:
        wall = time.perf_counter() - begun
        sampler.stop()
        tuner_module.run_trial = originals["run_trial"]
        protocol_module._evaluate_selected = originals["evaluate"]
        sweep_module.run_tuner, sweep_module._log_analysis = originals["run_tuner"], originals["analysis"]
        JournalUploader.__init__, JournalUploader.drain = originals["init"], originals["drain"]
        SweepRecorder.trial_started, SweepRecorder.trial_result = originals["started"], originals["result"]
        SweepRecorder.trial_completed, SweepRecorder.trial_errored = originals["completed"], originals["errored"]
    backlog = [v for _, v in sampler.samples]
    events = counts["start"] + counts["result"] + counts["complete"] + counts["error"]
    return {
        "wall_s": wall, "tune_s": times.get("tune_s"), "flush_after_tune_s": times.get("flush_s"),
        "analysis_s": times.get("analysis_s"),
        "driver_cpu_s": cpu_seconds() - cpu0, "driver_rss_start_mb": rss0 / 2**20, "events": counts,
        "events_per_s": events / times["tune_s"] if times.get("tune_s") else None,
        "uploader_backlog_max": max(backlog, default=0),
        "uploader_backlog_mean": sum(backlog) / len(backlog) if backlog else 0,
        "uploader_cpu_s": uploader_cpu[0] if uploader_cpu else None,
        "trial_seconds": sum(trial_seconds.values()), "longest_trial_s": max(trial_seconds.values(), default=0),
        "reported": reported, "state": summary.state, "done": summary.done, "failed": summary.failed,
    }


def run_plain(spec_path: Path, address: str) -> dict[str, Any]:
    """Plain Ray Tune: the same trainable, searcher, scheduler and settings; no tracking."""
    import ray
    from ray import tune

    from nli_models.data import prepare_data
    from orchestrator.ray_adapter.ray_search import make_scheduler, make_searcher, param_space
    from orchestrator.sweep.spec import load_spec

    class EpochSeconds(tune.Callback):
        def __init__(self):
            self.seconds: dict[str, float] = {}
            self.results = 0

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.results += 1
            self.seconds[trial.trial_id] = self.seconds.get(trial.trial_id, 0.0) + float(result.get("epoch_time_s") or 0)

    spec = load_spec(spec_path)
    data = prepare_data(spec.data)
    rss0, cpu0 = rss_bytes(), cpu_seconds()
    begun = time.perf_counter()
    ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    try:
        search = spec.search
        trainable = tune.with_parameters(standin_trial, base=spec.base_config().model_dump(exclude_unset=True),
                                         search=search.model_dump(), data=data)
        trainable = tune.with_resources(trainable, {"cpu": search.resources.cpu, "gpu": search.resources.gpu})
        callback = EpochSeconds()
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(spec),
            tune_config=tune.TuneConfig(metric=search.metric, mode=search.mode, search_alg=make_searcher(spec),
                                        scheduler=make_scheduler(spec), num_samples=search.num_samples,
                                        max_concurrent_trials=search.max_concurrent_trials, reuse_actors=True),
            run_config=tune.RunConfig(name=f"{spec.name}-plain", storage_path=spec.storage_path, callbacks=[callback],
                                      verbose=0, checkpoint_config=tune.CheckpointConfig(num_to_keep=1)),
        )
        grid = tuner.fit()
        errors = sum(r.error is not None for r in grid)
    finally:
        ray.shutdown()
        wall = time.perf_counter() - begun
    return {
        "wall_s": wall, "driver_cpu_s": cpu_seconds() - cpu0, "driver_rss_start_mb": rss0 / 2**20,
        "results": callback.results, "errors": errors,
        "trial_seconds": sum(callback.seconds.values()), "longest_trial_s": max(callback.seconds.values(), default=0),
    }


PATHS = {"ours": run_ours, "plain": run_plain}


def run_path(which: str, spec_path: Path, address: str) -> dict[str, Any]:
    """One path in a fresh Python process (``main`` below); what it measured."""
    out = spec_path.with_name(f"{spec_path.stem}-{which}.json")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-m", "benchmarks.scale_cluster", which, str(spec_path), address, str(out)],
                   env=env, check=True, stdin=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_cluster",
                                     description="one path of the scale_cluster benchmark in this process")
    parser.add_argument("path", choices=sorted(PATHS))
    parser.add_argument("spec", type=Path)
    parser.add_argument("address", help="the simulated cluster's Ray address")
    parser.add_argument("out", type=Path, help="JSON file for what was measured")
    args = parser.parse_args(argv)
    setup_environment()
    # Imported before the measurement: neither path counts the imports of torch, Ray, MLflow.
    import ray.tune  # noqa: F401

    import nli_models.data  # noqa: F401
    import orchestrator.sweep.driver  # noqa: F401

    profile_dir = os.environ.get(PROFILE_ENV)
    profile = (profiled(Path(profile_dir) / f"{NAME}-{args.spec.stem.rsplit('-', 1)[-1]}-{args.path}.prof")
               if profile_dir else contextlib.nullcontext())
    with profile:
        result = PATHS[args.path](args.spec, args.address)
    result["driver_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    write_json(args.out, result)


def ideal_s(run: dict[str, Any], slots: int) -> float:
    return max(run["trial_seconds"] / slots, run["longest_trial_s"])


def lost_or_doubled(db: Database, experiment: str, reported: dict[str, int]) -> dict[str, int]:
    rows = db.metric_rows(experiment, "dev_accuracy")
    lost = doubled = missing_runs = 0
    for trial_id, epochs in reported.items():
        n, distinct = rows.get(trial_id, (0, 0))
        missing_runs += trial_id not in rows
        lost += max(epochs - distinct, 0)
        doubled += n - distinct
    return {"events_reported": sum(reported.values()), "rows_in_mlflow": sum(n for n, _ in rows.values()),
            "lost": lost, "doubled": doubled, "trials_without_run": missing_runs}


def measure(ctx: Context, sizes: tuple[int, ...]) -> dict[str, Any]:
    slots = NODES * (GPUS_PER_NODE // GPUS_PER_TRIAL)
    folder = ctx.work_dir("scale-cluster")
    db = Database()
    server = Server(db.uri, folder / "server")
    cluster = None
    runs: dict[str, Any] = {}
    try:
        server.start()
        begun = time.perf_counter()
        cluster = start_cluster()
        cluster_start_s = time.perf_counter() - begun
        log(f"scale_cluster: {NODES} nodes x {GPUS_PER_NODE} slots up in {cluster_start_s:.0f} s; "
            f"MLflow {server.url} over {db.name}")
        for index, n in enumerate(sizes):
            spec = sweep_spec(n, slots, server.url, folder / f"ray_results-{n}")
            spec_path = folder / f"{spec['name']}.yaml"
            spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
            order = ("plain", "ours") if index % 2 == 0 else ("ours", "plain")
            row: dict[str, Any] = {"loadavg_before": list(os.getloadavg())}
            for which in order:
                server_cpu = group_cpu_seconds(server.proc.pid)
                row[which] = run_path(which, spec_path, cluster.address)
                row[which]["server_cpu_s"] = group_cpu_seconds(server.proc.pid) - server_cpu
                log(f"scale_cluster: N={n} {which}: wall {row[which]['wall_s']:.1f} s "
                    f"(ideal {ideal_s(row[which], slots):.1f} s), load {os.getloadavg()[0]:.2f}")
            ours = row["ours"]
            row["tracking_check"] = lost_or_doubled(db, spec["name"], ours.pop("reported"))
            row["ideal_s"] = ideal_s(ours, slots)
            row["ratio_ours_to_plain"] = ours["wall_s"] / row["plain"]["wall_s"]
            row["loadavg_after"] = list(os.getloadavg())
            runs[str(n)] = row
            ctx.out_dir.mkdir(parents=True, exist_ok=True)
            with open(ctx.out_dir / f"{NAME}.partial.jsonl", "a") as partial:  # kept if a larger N is cut short
                partial.write(json.dumps({"n": n, **row}, default=str) + "\n")
            log(f"scale_cluster: N={n}: ours/plain {row['ratio_ours_to_plain']:.3f}; {row['tracking_check']}")
    finally:
        if cluster is not None:
            cluster.shutdown()
        server.stop()
        db.drop()
    return {"runs": runs, "cluster_start_s": cluster_start_s, "slots": slots}


def fits(runs: dict[str, Any]) -> dict[str, Any]:
    ns = [int(n) for n in runs]
    ours = [runs[str(n)]["ours"] for n in ns]
    plain = [runs[str(n)]["plain"] for n in ns]
    out = {
        "ours_wall_s": linear_fit(ns, [r["wall_s"] for r in ours]),
        "plain_wall_s": linear_fit(ns, [r["wall_s"] for r in plain]),
        "ideal_s": linear_fit(ns, [runs[str(n)]["ideal_s"] for n in ns]),
        "ours_driver_cpu_s": linear_fit(ns, [r["driver_cpu_s"] for r in ours]),
        "plain_driver_cpu_s": linear_fit(ns, [r["driver_cpu_s"] for r in plain]),
        "ours_peak_rss_mb": linear_fit(ns, [r["driver_peak_rss_mb"] for r in ours]),
        "plain_peak_rss_mb": linear_fit(ns, [r["driver_peak_rss_mb"] for r in plain]),
        "ours_events_per_s": linear_fit(ns, [r["events_per_s"] for r in ours]),
        "ours_flush_after_tune_s": linear_fit(ns, [r["flush_after_tune_s"] or 0 for r in ours]),
        "ours_wall_power": power_fit(ns, [r["wall_s"] for r in ours]),
        "ours_cpu_power": power_fit(ns, [r["driver_cpu_s"] for r in ours]),
    }
    at = 10_000
    ours_10k = out["ours_wall_s"]["intercept"] + out["ours_wall_s"]["slope"] * at
    plain_10k = out["plain_wall_s"]["intercept"] + out["plain_wall_s"]["slope"] * at
    out["extrapolated_10000"] = {"ours_wall_s": ours_10k, "plain_wall_s": plain_10k,
                                 "ratio": ours_10k / plain_10k if plain_10k > 0 else float("nan"),
                                 "ideal_s": out["ideal_s"]["intercept"] + out["ideal_s"]["slope"] * at}
    return out


def run(ctx: Context) -> dict[str, Any]:
    sizes = tuple(int(s) for s in os.environ.get("NLI_SCALE_SIZES", "").split(",") if s) or (
        (20, 60) if ctx.quick else (100, 300, 1000))
    measured = measure(ctx, sizes)
    runs = measured["runs"]
    fit = fits(runs)
    return {"sizes": list(sizes), "nodes": NODES, "gpus_per_node": GPUS_PER_NODE, "epochs": EPOCHS,
            "epoch_s": EPOCH_S, "cluster_start_s": measured["cluster_start_s"], "runs": runs, "fits": fit,
            "targets": targets(sizes, runs, fit), "summary_md": summary_md(sizes, runs, fit, measured["slots"])}


def _fitted(sizes: tuple[int, ...]) -> bool:
    """Whether `fits` drew lines: it needs two sizes or more (linear_fit gives nan otherwise)."""
    return len(set(sizes)) >= 2


def targets(sizes: tuple[int, ...], runs: dict[str, Any], fit: dict[str, Any]) -> list[dict[str, Any]]:
    """The benchmark's goals. The 10,000-trial ratio and the memory slope need a fit, hence two
    sizes or more; issue 26's goal at the largest size (ratio and driver CPU gap) is one run's
    figure, of which the issue takes the median of 3 runs."""
    largest_n = max(sizes)
    largest = runs[str(largest_n)]
    fitted = _fitted(sizes)
    measured_10k = 10_000 in sizes
    x10k = fit["extrapolated_10000"]
    if measured_10k:
        ratio_10k, how = largest["ratio_ours_to_plain"], "measured"
    elif fitted:
        ratio_10k = x10k["ratio"]
        how = (f"extrapolated from linear fits over N={', '.join(map(str, sizes))}; "
               f"measured {largest['ratio_ours_to_plain']:.3f}x at N={largest_n}")
    else:
        ratio_10k, how = None, f"not extrapolated: one size measured (N={largest_n}); a fit needs two or more"
    gap_ms = (largest["ours"]["driver_cpu_s"] - largest["plain"]["driver_cpu_s"]) / largest_n * 1000
    memory = fit["ours_peak_rss_mb"]
    return [
        target("our wall / plain Tune's wall", f"<= {RATIO_TARGET:.2f}x at 10,000 trials",
               (f"{ratio_10k:.3f}x " if ratio_10k is not None else "") + how,
               None if ratio_10k is None else ratio_10k <= RATIO_TARGET),
        target(f"this run at N={largest_n}: our wall / plain Tune's, driver CPU gap",
               f"<= {RATIO_TARGET:.2f}x and <= {CPU_GAP_TARGET_MS:g} ms/trial (issue 26: median of 3 runs at N=1000)",
               f"{largest['ratio_ours_to_plain']:.3f}x, {gap_ms:+.1f} ms/trial",
               largest["ratio_ours_to_plain"] <= RATIO_TARGET and gap_ms <= CPU_GAP_TARGET_MS),
        target("driver memory", "linear in N, per-trial cost stated",
               f"peak RSS {memory['intercept']:.0f} MB + {memory['slope'] * 1024:.1f} KB x N (R² {memory['r2']:.3f}); "
               f"plain Tune {fit['plain_peak_rss_mb']['slope'] * 1024:.1f} KB x N" if fitted
               else "no per-trial cost: one size measured", None),
        target("no trial event lost", "dev_accuracy rows in MLflow == results reported, none doubled",
               "; ".join(f"N={n}: {runs[str(n)]['tracking_check']['rows_in_mlflow']}/"
                         f"{runs[str(n)]['tracking_check']['events_reported']}" for n in sizes),
               all(runs[str(n)]["tracking_check"]["lost"] == 0 and runs[str(n)]["tracking_check"]["doubled"] == 0
                   for n in sizes)),
    ]


def summary_md(sizes: tuple[int, ...], runs: dict[str, Any], fit: dict[str, Any], slots: int) -> str:
    rows = []
    for n in sizes:
        r = runs[str(n)]
        o, p = r["ours"], r["plain"]
        rows.append((n, round(r["ideal_s"], 1), round(p["wall_s"], 1), round(o["wall_s"], 1),
                     round(r["ratio_ours_to_plain"], 3), round(o["wall_s"] / r["ideal_s"], 2),
                     round(o["driver_cpu_s"] / n * 1000, 1), round((o.get("uploader_cpu_s") or 0) / n * 1000, 1),
                     round(p["driver_cpu_s"] / n * 1000, 1),
                     round(o["driver_peak_rss_mb"], 0), round(p["driver_peak_rss_mb"], 0),
                     round(o["events_per_s"], 1), o["uploader_backlog_max"], round(o["flush_after_tune_s"] or 0, 2),
                     f"{r['tracking_check']['rows_in_mlflow']}/{r['tracking_check']['events_reported']}",
                     f"{r['loadavg_before'][0]:.1f}"))
    x10k = fit["extrapolated_10000"]
    fits_text = (
        f"Fits over N (least squares): ours wall = {fit['ours_wall_s']['intercept']:.1f} + "
        f"{fit['ours_wall_s']['slope'] * 1000:.1f} ms x N; plain = {fit['plain_wall_s']['intercept']:.1f} + "
        f"{fit['plain_wall_s']['slope'] * 1000:.1f} ms x N; ideal = {fit['ideal_s']['slope'] * 1000:.1f} ms x N. "
        f"Our driver CPU {fit['ours_driver_cpu_s']['slope'] * 1000:.1f} ms/trial (plain "
        f"{fit['plain_driver_cpu_s']['slope'] * 1000:.1f}); peak RSS {fit['ours_peak_rss_mb']['slope'] * 1024:.1f} KB/trial "
        f"(plain {fit['plain_peak_rss_mb']['slope'] * 1024:.1f}). Extrapolated to 10,000 trials: ours "
        f"{x10k['ours_wall_s']:.0f} s, plain {x10k['plain_wall_s']:.0f} s (ratio {x10k['ratio']:.3f}), ideal "
        f"{x10k['ideal_s']:.0f} s."
    ) if _fitted(sizes) else "No fits over N: one size measured (a fit needs two or more)."
    return (
        f"{NODES} simulated nodes x {GPUS_PER_NODE} logical GPUs, {GPUS_PER_TRIAL} per trial ({slots} trials at once); "
        f"stand-in trials of {EPOCHS} epochs x {EPOCH_S:g} s x U[0.5, 1.5], checkpoint every epoch; Optuna random "
        "searcher, FIFO; ours = run_sweep with `orchestrate server` over PostgreSQL; plain = Tuner, no tracking. "
        "Same cluster, each path in its own process (peak RSS = its ru_maxrss), order alternating per N.\n\n"
        + md_table(["N", "ideal s", "plain s", "ours s", "ours/plain", "ours/ideal", "our driver CPU ms/trial",
                    "of it uploader thread", "plain driver CPU ms/trial", "our peak RSS MB", "plain peak RSS MB", "tracking events/s",
                    "uploader backlog max", "drain after Tune s", "MLflow rows/reported", "load"], rows)
        + "\n\n" + fits_text
    )

if __name__ == "__main__":
    main()
