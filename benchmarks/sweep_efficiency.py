"""Sweep efficiency: Σ(trial training time) / (wall time × concurrent slots) of a 12-trial grid
sweep on 2 CPUs (2 concurrent trials of 1 CPU), and where the rest of the time goes.

The workload (benchmarks/sweeps.py ``twelve_trial_spec``): decomposable attention (vanilla,
GloVe 50d, projection = hidden = 100) on SNLI dev minus a 10% premise holdout (8,861 train / 981
dev pairs; SNLI test for the selected configuration), lr {5e-4, 1e-3, 2e-3} x dropout {0.1, 0.2,
0.3, 0.4}, 21 epochs: about 60-65 s per trial on this machine when quiet (up to ~2x under load).
--quick: the toy corpus, 2 tiny epochs.

The sweep is ``orchestrator.sweep.driver.run_sweep`` (what `orchestrate sweep SPEC --new` runs, minus
the interpreter start and imports), in this process, with a fresh MLflow SQLite store, a fresh
Ray instance and a cold data cache. "Training" is Σ epoch_time_s (the trainer's own clock: train
epoch + dev evaluation), read from the events and checked against the MLflow child runs.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

from benchmarks.common import Context, log, md_table, median, target
from benchmarks.sweeps import run_instrumented_sweep, twelve_trial_spec

NAME = "sweep_efficiency"
TITLE = "Sweep efficiency of a 12-trial grid on 2 CPUs"


def direct_setup_cost(spec: dict[str, Any], data, repeats: int = 5) -> dict[str, float]:
    """What a trial does before its first batch, measured here: deserialising the prepared data
    (a pickle round trip stands in for the object-store fetch) and make_trainer."""
    from nli_models.training import make_trainer
    from orchestrator.sweep.spec import SweepSpec, apply_hyperparameters

    base = SweepSpec.model_validate(spec).base_config()
    config = apply_hyperparameters(base, {"lr": 0.001, "dropout": 0.1, "seed": 1})
    payload = pickle.dumps(data, protocol=5)
    unpickle, build = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy = pickle.loads(payload)
        t1 = time.perf_counter()
        make_trainer(config, copy)
        build.append(time.perf_counter() - t1)
        unpickle.append(t1 - t0)
    return {"data_bytes": len(payload), "unpickle_s": median(unpickle), "make_trainer_s": median(build)}


def efficiency_at(trial_s: float, trials: int, slots: int, fixed_slot_s: float, per_trial_s: float,
                  tail_slot_s: float = 0.0) -> float:
    """Model: efficiency = n·T / (n·T + fixed + n·overhead + tail), all in slot-seconds."""
    work = trials * trial_s
    return work / (work + fixed_slot_s + trials * per_trial_s + tail_slot_s)


def run(ctx: Context) -> dict[str, Any]:
    shared = ctx.shared_data if ctx.has_snli() else None
    if shared is None and not ctx.quick:
        log("sweep_efficiency: no shared SNLI data; using the toy corpus stand-in (numbers not comparable)")
    spec = twelve_trial_spec(shared, ctx.quick)
    folder = ctx.work_dir(NAME)
    log(f"sweep_efficiency: 12-trial grid, {spec['data']['corpus']}, {spec['training']['epochs']} epochs per trial")
    m = run_instrumented_sweep(spec, folder)

    # Direct measurement of the per-trial data setup (the sweep's cache is warm now).
    import os

    from nli_models.data import prepare_data

    os.environ["NLI_DATA_DIR"] = str(folder / "data-cache")
    try:
        data = prepare_data(spec["data"])
    finally:
        os.environ.pop("NLI_DATA_DIR", None)
    direct = direct_setup_cost(spec, data)

    n, slots = m["trials"], m["slots"]
    trial_s = m["mean_trial_time_s"]
    ph = m["phases_s"]
    fixed = m["fixed_slot_s"]  # slot-seconds that do not grow with trials: start-ups, data, MLflow, protocol
    per_trial = m["overhead_per_trial_s"]["per_trial"]
    tail = m["tail_slot_s"]
    # Trial length at which this sweep's fixed and per-trial costs would give 0.95 (12 trials,
    # equal trial lengths: no tail).
    needed = next((t for t in range(5, 7201, 5) if efficiency_at(t, n, slots, fixed, per_trial) >= 0.95), None)
    no_tail = efficiency_at(m["mean_training_s"], n, slots, fixed, per_trial)
    setup_share = m["overhead_per_trial_s"]["trial_setup"] / trial_s if trial_s else float("nan")
    direct_share = (direct["unpickle_s"] + direct["make_trainer_s"]) / trial_s if trial_s else float("nan")
    tracking = m["tracking"]
    long_enough = trial_s >= 60
    targets = [
        target("sweep efficiency", ">= 0.95 for trials >= 60 s", f"{m['efficiency']:.3f} (trials {trial_s:.0f} s)",
               (m["efficiency"] >= 0.95) if long_enough else None,
               f"steady state {m['efficiency_steady_state']:.3f}; without the tail imbalance {no_tail:.3f}; "
               f"at this sweep's fixed costs 0.95 needs ~{needed} s trials"),
        target("orchestration overhead", "<= 1 s per trial",
               f"{per_trial:.2f} slot-s per trial; {m['overhead_per_trial_s']['all']:.2f} with fixed costs and tail "
               "amortised", per_trial <= 1.0,
               f"fixed {fixed:.0f} slot-s per sweep, tail {tail:.0f} slot-s"),
        target("MLflow logging", "<= 1% of trial time", f"{tracking['share_of_trial_time']:.2%} per trial",
               tracking["share_of_trial_time"] <= 0.01,
               f"{tracking['per_trial_logging_s']:.3f} s per trial (sender thread); one-time driver calls "
               f"{tracking['one_time_s']:.1f} s (store creation {tracking['store_open_s']:.1f} s)"),
        target("per-trial data setup", "<= 2% of trial time",
               f"{setup_share:.2%} (first-report extra); direct {direct_share:.2%}",
               max(setup_share, direct_share) <= 0.02),
    ]

    phase_rows = [(k, round(v, 2), f"{v / m['wall_s']:.1%}", round(slots * v / n, 2)) for k, v in ph.items()]
    slot_rows = [(k.replace("_", " "), round(v, 1), f"{v / (slots * ph['tune']):.1%}", round(v / n, 2))
                 for k, v in m["slot_seconds"].items()]
    tl = m["tune_timeline_s"]
    summary = (
        f"Workload: {n} trials of decomposable/vanilla on {spec['data']['corpus']}, {spec['training']['epochs']} "
        f"epochs, 2 concurrent trials x 1 CPU. Mean trial time (Tune) {trial_s:.1f} s, of which training "
        f"(Σ epoch_time_s) {m['mean_training_s']:.1f} s. Wall {m['wall_s']:.1f} s.\n\n"
        f"**Efficiency Σ training / (wall x {slots}) = {m['efficiency']:.3f}**; Tune phase only "
        f"{m['efficiency_tune_phase']:.3f}; steady state (first trial start to last trial end) "
        f"{m['efficiency_steady_state']:.3f}; with Tune's trial time instead of training {m['efficiency_trial_time']:.3f}. "
        f"MLflow cross-check: Σ epoch_time_s {m['mlflow_training_s']:.1f} s, Σ trial_time_s {m['mlflow_trial_time_s']:.1f} s "
        f"(events: {m['training_s']:.1f} / {m['tune_trial_time_s']:.1f}).\n\n"
        "Wall time by phase of run_sweep:\n\n" + md_table(["phase", "s", "share of wall", "slot-s per trial"], phase_rows)
        + f"\n\nSlot-seconds inside the Tune phase ({slots} x {ph['tune']:.1f} s = start-up {tl['startup']:.1f} s + "
        f"steady state {tl['steady']:.1f} s + teardown {tl['teardown']:.1f} s):\n\n"
        + md_table(["where", "slot-s", "share", "per trial s"], slot_rows)
        + f"\n\n'trial setup' = a trial's first iteration beyond a typical iteration's report+checkpoint, on a reused "
        f"actor (config, model build, data from the object store); measured directly: unpickling the "
        f"{direct['data_bytes'] / 1e6:.1f} MB prepared data {direct['unpickle_s'] * 1000:.1f} ms + make_trainer "
        f"{direct['make_trainer_s'] * 1000:.1f} ms. 'actor startup' = the same for the first trial of each slot "
        f"(a new worker process: imports, first object-store fetch) plus the stagger of the slots' first starts. "
        f"'waiting inside trial' = trial started but not inside its train() calls (the driver handling each result "
        f"and checkpoint while the trial waits). 'gaps between trials' = a slot empty between one trial's end and "
        f"the next one's start. 'tail imbalance' = slots idle at the end while the last trial finishes (uneven "
        f"trial lengths).\n\n"
        f"MLflow: {tracking['sender_ops']} groups of a trial's records sent by the uploader thread in {tracking['sender_thread_s']:.2f} s "
        f"({tracking['per_trial_logging_s']:.3f} s per trial, {tracking['share_of_trial_time']:.2%} of trial time); "
        f"one-time driver-thread Tracker calls {tracking['one_time_s']:.2f} s (of which opening/creating the SQLite "
        f"store {tracking['store_open_s']:.2f} s); waiting for the sender to drain {tracking['flush_wait_s']:.2f} s.\n\n"
        "CPU used during the sweep by this process tree (cores = CPU seconds / wall seconds; the machine has 2; "
        "other users' processes are not counted):\n\n"
        + md_table(["process", "CPU s", "cores"], [(k, v, m["cpu"]["cores_used"][k]) for k, v in m["cpu"]["cpu_s"].items()])
        + "\n\n"
        f"Model of this sweep: fixed {fixed:.0f} slot-s + {per_trial:.2f} slot-s per trial + tail {tail:.0f} slot-s; "
        f"without the tail it would be {no_tail:.3f}; with these fixed costs 0.95 needs trials of ~{needed} s at "
        f"12 trials."
    )
    return {
        "spec": spec,
        "measurement": m,
        "direct_setup": direct,
        "model": {"fixed_slot_s": fixed, "per_trial_slot_s": per_trial, "tail_slot_s": tail,
                  "efficiency_without_tail": no_tail, "trial_s_for_0_95": needed},
        "targets": targets,
        "summary_md": summary,
    }
