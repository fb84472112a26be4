"""The same 12 trials as sweep_efficiency in a plain Optuna loop: no Ray, no MLflow, the trainer
called directly, same data, same configurations, same 2 x 1 CPU.

Two worker processes (multiprocessing spawn, 1 torch thread each) share one Optuna study in a
JournalStorage file; the parent prepares the data once (cold cache), creates the study and
enqueues the 12 grid points, so each is evaluated exactly once, whichever worker pops it. A
trial is ``make_trainer`` + ``Trainer.fit`` (every epoch: train + dev evaluation, as in a sweep
trial) and returns the best dev accuracy. No checkpoints, no test evaluation, no tracking.
Wall time: from data preparation to both workers joined. Ratio = sweep wall / plain wall, with
the sweep's wall time from this run's sweep_efficiency (same spec; run here if missing).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Context, log, md_table, median, target
from benchmarks.sweeps import CpuSampler, grid_of, run_instrumented_sweep, twelve_trial_spec

NAME = "plain_optuna"
TITLE = "Plain Optuna loop (no Ray, no MLflow) vs our sweep, same 12 trials"
STUDY = "plain-12-trials"
WORKERS = 2


def _storage(path: str):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(path))


def worker(storage_path: str, spec: dict[str, Any], cache_dir: str, n_trials: int, spawned_at: float) -> None:
    """One plain process: prepare (cached) data, then pop and run trials until n_trials ran."""
    import json

    os.environ["NLI_DATA_DIR"] = cache_dir
    import optuna
    import torch

    from nli_models.config import RunConfig
    from nli_models.data import prepare_data
    from nli_models.training import make_trainer
    from orchestrator.sweep.spec import apply_hyperparameters  # pydantic only: no Ray, no MLflow

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = prepare_data(spec["data"])
    base = RunConfig.model_validate({k: v for k, v in spec.items() if k != "search"})
    space = {k: v["grid"] for k, v in spec["search"]["space"].items()}
    seed = spec["search"]["seeds"][0]

    def objective(trial):
        started = time.perf_counter()
        params = {k: trial.suggest_categorical(k, values) for k, values in space.items()}
        trainer = make_trainer(apply_hyperparameters(base, {**params, "seed": seed}), data)
        setup = time.perf_counter() - started
        state = trainer.fit()
        trial.set_user_attr("training_s", sum(h.epoch_time_s for h in state.history))
        trial.set_user_attr("setup_s", setup)
        trial.set_user_attr("trial_s", time.perf_counter() - started)
        trial.set_user_attr("pid", os.getpid())
        return state.best_dev_accuracy

    study = optuna.load_study(study_name=STUDY, storage=_storage(storage_path))
    ready = time.time() - spawned_at  # process start, imports, cached data load, study load
    study.optimize(objective, n_trials=n_trials)
    finished = time.time() - spawned_at
    Path(storage_path).with_name(f"worker-{os.getpid()}.json").write_text(
        json.dumps({"ready_s": ready, "finished_s": finished}))


def run_plain(spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    import optuna

    from nli_models.data import prepare_data

    cache_dir = str(folder / "data-cache")
    storage_path = str(folder / "optuna-journal.log")
    grid = grid_of(spec)
    sampler = CpuSampler()
    started = time.perf_counter()
    previous = os.environ.get("NLI_DATA_DIR")
    os.environ["NLI_DATA_DIR"] = cache_dir
    try:
        t0 = time.perf_counter()
        prepare_data(spec["data"])
        data_s = time.perf_counter() - t0
    finally:
        if previous is None:
            os.environ.pop("NLI_DATA_DIR", None)
        else:
            os.environ["NLI_DATA_DIR"] = previous
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY, storage=_storage(storage_path), direction="maximize")
    for params in grid:
        study.enqueue_trial(params)
    per_worker = [len(grid) // WORKERS + (i < len(grid) % WORKERS) for i in range(WORKERS)]
    context = multiprocessing.get_context("spawn")
    t_spawn, spawned_at = time.perf_counter(), time.time()
    processes = [context.Process(target=worker, args=(storage_path, spec, cache_dir, k, spawned_at))
                 for k in per_worker]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    workers_s = time.perf_counter() - t_spawn
    wall = time.perf_counter() - started
    cpu = sampler.stop()
    if any(p.exitcode != 0 for p in processes):
        raise RuntimeError(f"plain Optuna worker failed (exit codes {[p.exitcode for p in processes]})")
    trials = optuna.load_study(study_name=STUDY, storage=_storage(storage_path)).trials
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) != len(grid):
        raise RuntimeError(f"plain Optuna ran {len(done)} trials, expected {len(grid)}")
    rows = [{"params": t.params, "value": t.value, **t.user_attrs,
             "wall_s": (t.datetime_complete - t.datetime_start).total_seconds()} for t in done]
    training = sum(r["training_s"] for r in rows)
    import json

    startup = [json.loads(p.read_text()) for p in sorted(folder.glob("worker-*.json"))]
    return {
        "cpu": cpu,
        "worker_ready_s": [w["ready_s"] for w in startup],
        "worker_finished_s": [w["finished_s"] for w in startup],
        "wall_s": wall,
        "data_prep_s": data_s,
        "workers_s": workers_s,
        "training_s": training,
        "efficiency": training / (WORKERS * wall),
        "mean_trial_s": median(r["trial_s"] for r in rows),
        "mean_training_s": training / len(rows),
        "best_dev_accuracy": max(r["value"] for r in rows),
        "trials": rows,
    }


def _plain_label(kind: str) -> str:
    if kind.startswith("driver"):
        return "parent (data preparation, study, waiting)"
    return kind.replace("other children", "worker processes")


def run(ctx: Context) -> dict[str, Any]:
    shared = ctx.shared_data if ctx.has_snli() else None
    spec = twelve_trial_spec(shared, ctx.quick)
    ours = ctx.previous("sweep_efficiency")
    if ours is None or ours.get("spec") != spec:
        log("plain_optuna: no sweep_efficiency result for this workload in this run; running the sweep first")
        sweep = run_instrumented_sweep(spec, ctx.work_dir("plain-vs-sweep"))
    else:
        sweep = ours["measurement"]
    log(f"plain_optuna: 12 trials, {WORKERS} processes x 1 thread")
    plain = run_plain(spec, ctx.work_dir(NAME))

    ratio = sweep["wall_s"] / plain["wall_s"]
    ours_per_epoch = sweep["training_s"] / sum(t["epochs"] for t in sweep["per_trial"])
    plain_epochs = len(plain["trials"]) * spec["training"]["epochs"]
    plain_per_epoch = plain["training_s"] / plain_epochs
    protocol = sweep["phases_s"]["paper_protocol"]
    rows = [
        ("wall time s", round(sweep["wall_s"], 1), round(plain["wall_s"], 1), round(ratio, 3)),
        ("wall without paper protocol (test eval) s", round(sweep["wall_s"] - protocol, 1), round(plain["wall_s"], 1),
         round((sweep["wall_s"] - protocol) / plain["wall_s"], 3)),
        ("Σ training s", round(sweep["training_s"], 1), round(plain["training_s"], 1),
         round(sweep["training_s"] / plain["training_s"], 3)),
        ("training s per epoch", round(ours_per_epoch, 2), round(plain_per_epoch, 2), round(ours_per_epoch / plain_per_epoch, 3)),
        ("efficiency Σ training / (2 x wall)", round(sweep["efficiency"], 3), round(plain["efficiency"], 3), ""),
        ("best dev accuracy", round(max(t["best_dev_accuracy"] or 0 for t in sweep["per_trial"]), 4),
         round(plain["best_dev_accuracy"], 4), ""),
    ]
    summary = (
        f"Same 12 trials ({spec['data']['corpus']}, {spec['training']['epochs']} epochs, decomposable/vanilla), "
        f"2 x 1 CPU. Plain: {WORKERS} spawned processes pulling enqueued trials from one Optuna JournalStorage "
        f"study, trainer called directly, no checkpoints, no tracking, no test evaluation. Plain data "
        f"preparation {plain['data_prep_s']:.2f} s (cold cache); worker processes ready (spawn, imports, cached "
        f"data, study) after {', '.join(f'{x:.1f}' for x in plain['worker_ready_s'])} s.\n\n"
        f"**Wall-time ratio ours / plain = {ratio:.3f}**\n\n"
        + md_table(["", "ours (Ray Tune + MLflow)", "plain Optuna", "ours / plain"], rows)
        + "\n\nA per-epoch ratio above 1 means our trials trained slower (contention with the driver, Ray's "
        "processes and the MLflow sender on 2 cores, or other load on the machine). CPU used over each run "
        "(cores = CPU seconds / wall seconds, this process tree only):\n\n"
        + md_table(["run", "process", "CPU s", "cores"],
                   [("ours", k, v, sweep.get("cpu", {}).get("cores_used", {}).get(k))
                    for k, v in sweep.get("cpu", {}).get("cpu_s", {}).items()]
                   + [("plain", _plain_label(k), v, plain["cpu"]["cores_used"][k])
                      for k, v in plain["cpu"]["cpu_s"].items()])
    )
    return {
        "spec": spec,
        "sweep_wall_s": sweep["wall_s"],
        "plain": plain,
        "ratio": ratio,
        "ratio_without_protocol": (sweep["wall_s"] - protocol) / plain["wall_s"],
        "per_epoch_ratio": ours_per_epoch / plain_per_epoch,
        "targets": [target("wall-time ratio ours / plain", "report (no target given)", f"{ratio:.3f}", None)],
        "summary_md": summary,
    }
