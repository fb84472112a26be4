"""Running a real sweep (``orchestrator.sweep.driver.run_sweep``, what `orchestrate sweep` runs) in this
process with timers around its parts, and the workloads the sweep benchmarks share.

Instrumented (by wrapping, nothing in the project is changed): the phases of ``run_sweep``
(spec loading, MLflow store opening, parent run, data preparation, Ray start, Tune, the wait for
the MLflow sender to drain, the paper protocol, closing runs, Ray shutdown), every ``Tracker``
call made by the driver's main thread, every record the journal uploader thread applies to MLflow,
and the trial events Tune hands to the ``SweepRecorder`` (with Tune's per-iteration timing:
``time_this_iter_s``, ``time_total_s``). Trial times are read back from the MLflow child runs
(``trial_time_s``, per-epoch ``epoch_time_s``) and checked against the events.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import Instrument, median, snli_data_block
from results import run_schema as rs

SWEEP_PHASES = (
    "load_spec", "mlflow_open", "open_parent", "data_prep", "ray_start", "tune", "mlflow_flush",
    "paper_protocol", "record_selection", "ray_shutdown",
)
TRACKER_METHODS = (
    "__init__", "check_reachable", "find_experiment", "sweeps", "trial_runs", "analysis_inputs",
)
RESULT_KEYS = (rs.METRIC_EPOCHS_TRAINED, rs.METRIC_EPOCH_TIME, "time_this_iter_s", "time_total_s", "training_iteration",
               rs.METRIC_DEV_ACCURACY, rs.METRIC_BEST_DEV_ACCURACY, rs.RESULT_TRIAL_FINISHED)


# --- CPU use of the process tree --------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_STARTING = "ray workers (starting or idle)"


def _categorize(cmd: str) -> str:
    """What a descendant process is, from its command line (workers rename themselves ray::...).
    The raylet's own command line names default_worker.py (the command it starts workers with):
    it is told apart first. Ray's agents are ray::... too once they run."""
    executable = os.path.basename(cmd.split(" ", 1)[0]) if cmd else ""
    if executable in ("gcs_server", "raylet"):
        return f"ray {executable}"
    if "ray::IDLE" in cmd or "default_worker.py" in cmd:
        return _STARTING
    for renamed, name in (("ray::DashboardAgent", "ray dashboard agent"), ("ray::RuntimeEnvAgent", "ray runtime_env agent")):
        if cmd.startswith(renamed):  # Ray's agents rename themselves too
            return name
    if cmd.startswith("ray::"):
        return "trial workers"
    for key, name in (("dashboard/agent", "ray dashboard agent"), ("dashboard.py", "ray dashboard"),
                      ("log_monitor", "ray log_monitor"), ("runtime_env", "ray runtime_env agent")):
        if key in cmd:
            return name
    return "other children"


def _proc_table() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds user+system, command line) from /proc (Linux)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode(errors="replace")
            fields = stat[stat.rindex(")") + 2 :].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        # fields[1] = ppid; fields[11], fields[12] = utime, stime (clock ticks)
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, cmd)
    return table


class CpuSampler:
    """Samples the CPU seconds (user + system) of this process (or `root`, then called
    `root_kind`) and all its descendants (Ray's GCS, raylet, dashboard, workers) from /proc
    every ``interval`` s in a background thread; ``stop()`` returns CPU seconds per category over
    the sampled period. A process counts its last sample minus its first (0 if born after the
    start), so a short-lived one loses at most one interval. Without /proc (not Linux) it records
    nothing."""

    def __init__(self, interval: float = 0.5, root: int | None = None,
                 root_kind: str = "driver (Tune loop, MLflow sender, this benchmark)"):
        import threading

        self.interval = interval
        self.me = os.getpid() if root is None else root
        self.root_kind = root_kind
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self.available = os.path.isdir("/proc")
        self._stop = threading.Event()
        self._sample()
        self.first = dict(self.last)
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        if not self.available:
            return
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack, tree = [self.me], []
        while stack:
            pid = stack.pop()
            tree.append(pid)
            stack.extend(children.get(pid, ()))
        for pid in tree:
            if pid not in table:
                continue
            _, cpu, cmd = table[pid]
            self.last[pid] = cpu
            if pid == self.me:
                self.kind[pid] = self.root_kind
            elif self.kind.get(pid) in (None, "other children", _STARTING):
                self.kind[pid] = _categorize(cmd)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self._sample()
        seconds = time.perf_counter() - self.started
        by_kind: dict[str, float] = {}
        for pid, last in self.last.items():
            kind = self.kind.get(pid, "other children")
            by_kind[kind] = by_kind.get(kind, 0.0) + last - self.first.get(pid, 0.0)
        ordered = sorted(by_kind.items(), key=lambda kv: -kv[1])
        return {"wall_s": seconds, "cpu_s": {k: round(v, 2) for k, v in ordered},
                "cores_used": {k: round(v / seconds, 3) for k, v in ordered}}


# --- workloads --------------------------------------------------------------------------------


def twelve_trial_spec(shared_data: Path | None, quick: bool) -> dict[str, Any]:
    """The 12-trial grid of sweep_efficiency and plain_optuna: decomposable attention (vanilla,
    GloVe 50d fixed, projection = hidden = 100), lr {5e-4, 1e-3, 2e-3} x dropout {0.1, 0.2, 0.3,
    0.4}, one seed, 2 x 1 CPU. Every trial does the same work: dropout 0 would make a trial
    shorter (no dropout masks), and uneven trials leave a slot idle at the end (the tail).
    Full: SNLI dev-minus-holdout, 21 epochs: ~60-65 s per trial on this machine when it is quiet,
    up to ~2x that under load. Without the shared data (or --quick) the toy corpus stands in."""
    if quick:
        data = {"corpus": "toy", "toy": {"size": 600, "seed": 0}}
        args = {"embedding_dim": 16, "projection_dim": 16, "hidden_size": 16}
        epochs = 2
    elif shared_data is not None:
        data = snli_data_block(shared_data)
        args = {"projection_dim": 100, "hidden_size": 100}
        epochs = 21
    else:  # toy stand-in of about the same trial length
        data = {"corpus": "toy", "toy": {"size": 12000, "seed": 0}}
        args = {"embedding_dim": 50, "projection_dim": 100, "hidden_size": 100}
        epochs = 21
    return {
        "name": "bench-12-trials",
        "model": {"name": "decomposable", "variant": "vanilla", "args": {**args, "dropout": 0.1}},
        "data": data,
        "training": {"optimizer": "adam", "lr": 0.001, "batch_size": 32, "epochs": epochs},
        "search": {
            "sampler": "grid",
            "space": {"lr": {"grid": [0.0005, 0.001, 0.002]}, "dropout": {"grid": [0.1, 0.2, 0.3, 0.4]}},
            "seeds": [1],
            "scheduler": {"type": "fifo"},
            "max_concurrent_trials": 2,
            "resources": {"cpu": 1},
        },
    }


def grid_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    import itertools

    space = spec["search"]["space"]
    keys = list(space)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(space[k]["grid"] for k in keys))]


# --- the instrumented sweep -------------------------------------------------------------------


def write_spec(spec: dict[str, Any], folder: Path) -> Path:
    spec = {**spec, "search": {**spec["search"]}}
    spec["search"].setdefault("tracking_uri", f"sqlite:///{folder / 'mlruns.db'}")
    spec["search"].setdefault("storage_path", str(folder / "ray_results"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_instrumented_sweep(spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Run the sweep of ``spec`` in ``folder`` (fresh MLflow store, Ray results and data cache)
    and return wall time, phase times, tracking times, trial events and the MLflow trial runs."""
    import orchestrator.sweep.driver as sweep_module
    from orchestrator.journal.recorder import SweepRecorder
    from orchestrator.tracking.tracker import Tracker
    from orchestrator.tracking.uploader import JournalUploader

    spec_path = write_spec(spec, folder)
    previous_cache = os.environ.get("NLI_DATA_DIR")
    os.environ["NLI_DATA_DIR"] = str(folder / "data-cache")  # a cold data cache, like a first sweep
    events: list[dict[str, Any]] = []

    def on_started(recorder, trial_id, params):
        events.append({"event": "start", "trial_id": trial_id, "time": time.time(), "params": dict(params)})

    def on_result(recorder, trial_id, metrics):
        row = {k: metrics.get(k) for k in RESULT_KEYS}
        events.append({"event": "result", "trial_id": trial_id, "time": time.time(), **row})

    def on_completed(recorder, trial_id, last, checkpoint_dir):
        events.append({"event": "complete", "trial_id": trial_id, "time": time.time()})

    def on_errored(recorder, trial_id, params, error):
        events.append({"event": "error", "trial_id": trial_id, "time": time.time(), "error": error[-500:]})

    inst = Instrument()
    try:
        for name, phase in (("load_spec", "load_spec"), ("open_parent", "open_parent"),
                            ("prepare_data", "data_prep"), ("init_ray", "ray_start"), ("run_tuner", "tune"),
                            ("apply_paper_protocol", "paper_protocol"), ("record_selection", "record_selection"),
                            ("shutdown_ray", "ray_shutdown")):
            inst.wrap(sweep_module, name, f"phase.{phase}")
        for method in TRACKER_METHODS:
            inst.wrap(Tracker, method, f"tracker.{method}")
        inst.wrap(JournalUploader, "_apply_group", "sender.send_op")  # one trial's pending records to MLflow
        inst.wrap(SweepRecorder, "trial_started", "recorder.trial_started", before=on_started)
        inst.wrap(SweepRecorder, "trial_result", "recorder.trial_result", before=on_result)
        inst.wrap(SweepRecorder, "trial_completed", "recorder.trial_completed", before=on_completed)
        inst.wrap(SweepRecorder, "trial_errored", "recorder.trial_errored", before=on_errored)
        inst.wrap(JournalUploader, "drain", "phase.mlflow_flush")
        started_wall = time.time()
        started = time.perf_counter()
        sampler = CpuSampler()
        try:
            summary = sweep_module.run_sweep(sweep_module.SweepRequest(spec_path, new=True))
        finally:
            cpu = sampler.stop()
        wall = time.perf_counter() - started
    finally:
        inst.restore()
        if previous_cache is None:
            os.environ.pop("NLI_DATA_DIR", None)
        else:
            os.environ["NLI_DATA_DIR"] = previous_cache

    trials = read_trial_runs(spec["search"].get("tracking_uri", f"sqlite:///{folder / 'mlruns.db'}"), spec["name"])
    result = analyse(spec, wall, started_wall, inst, events, trials, summary.__dict__)
    result["cpu"] = cpu
    return result


def read_trial_runs(tracking_uri: str, experiment: str) -> list[dict[str, Any]]:
    """trial_time_s, epoch_time_s (every epoch), best dev accuracy and status of each child run."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], filter_string="tags.`nli.role` = 'trial'", max_results=10000)
    out = []
    for run in runs:
        history = client.get_metric_history(run.info.run_id, "epoch_time_s")
        out.append({
            "run_id": run.info.run_id,
            "trial_id": run.data.tags.get("nli.trial_id"),
            "status": run.info.status,
            "trial_time_s": run.data.metrics.get("trial_time_s"),
            "epoch_time_s": [m.value for m in sorted(history, key=lambda m: m.step)],
            "best_dev_accuracy": run.data.metrics.get("best_dev_accuracy"),
            "test_accuracy": run.data.metrics.get("test_accuracy"),
            "early_stopped": run.data.tags.get("nli.early_stopped"),
            "params": dict(run.data.params),
        })
    return out


def analyse(spec: dict[str, Any], wall: float, started_wall: float, inst: Instrument, events: list[dict],
            trials: list[dict], summary: dict) -> dict[str, Any]:
    slots = int(spec["search"].get("max_concurrent_trials") or 2)
    phases: dict[str, float] = {}
    for p in SWEEP_PHASES:
        if p == "mlflow_open":  # MlflowClient + first request (creates a new SQLite store's tables)
            phases[p] = inst.total("tracker.__init__", thread="MainThread") + inst.total(
                "tracker.check_reachable", thread="MainThread")
        else:
            phases[p] = inst.total(f"phase.{p}")
    phases["other"] = wall - sum(phases.values())

    results = [e for e in events if e["event"] == "result"]
    by_trial: dict[str, list[dict]] = {}
    for r in results:
        by_trial.setdefault(r["trial_id"], []).append(r)
    per_trial = []
    for trial_id, rows in by_trial.items():
        rows.sort(key=lambda r: r["training_iteration"] or 0)
        iters = [float(r["time_this_iter_s"] or 0.0) for r in rows]
        epochs = [float(r["epoch_time_s"] or 0.0) for r in rows]
        extra = [i - e for i, e in zip(iters, epochs, strict=True)]
        later = median(extra[1:]) if len(extra) > 1 else 0.0
        start = next((e["time"] for e in events if e["event"] == "start" and e["trial_id"] == trial_id), None)
        end = next((e["time"] for e in events if e["event"] in ("complete", "error") and e["trial_id"] == trial_id), None)
        per_trial.append({
            "trial_id": trial_id,
            "epochs": len(rows),
            "training_s": sum(epochs),
            "tune_time_total_s": float(rows[-1]["time_total_s"] or sum(iters)),
            "setup_s": max(extra[0] - later, 0.0),  # first iteration's extra beyond a typical report
            "report_checkpoint_s_per_epoch": later,
            "driver_span_s": (end - start) if start and end else None,
            "start": start,
            "end": end,
            "best_dev_accuracy": rows[-1]["best_dev_accuracy"],
        })
    n = max(len(per_trial), 1)
    training = sum(t["training_s"] for t in per_trial)
    tune_total = sum(t["tune_time_total_s"] for t in per_trial)
    spans = sum(t["driver_span_s"] or 0.0 for t in per_trial)
    # The first trial on each slot starts a trial actor (a worker process: imports, object-store
    # fetch); later trials reuse it (reuse_actors=True). That start-up is a per-sweep cost.
    by_start = sorted((t for t in per_trial if t["start"]), key=lambda t: t["start"])
    first_on_slot = {t["trial_id"] for t in by_start[:slots]}
    actor_startup = sum(t["setup_s"] for t in per_trial if t["trial_id"] in first_on_slot)
    setup = sum(t["setup_s"] for t in per_trial if t["trial_id"] not in first_on_slot)

    # The Tune phase on a time line: start-up until the first trial starts, the steady state
    # until the last trial completes, teardown after it.
    tune_call = next(c for c in inst.calls if c.name == "phase.tune")
    tune_start, tune_end = tune_call.start, tune_call.start + tune_call.seconds
    starts = sorted(t["start"] for t in per_trial if t["start"])
    ends = sorted(t["end"] for t in per_trial if t["end"])
    first_start = starts[0] if starts else tune_start
    last_end = ends[-1] if ends else tune_end
    startup, teardown = first_start - tune_start, tune_end - last_end
    steady = last_end - first_start
    # Slot accounting of the steady state (FIFO, every trial takes one slot): trial k >= slots
    # starts when trial k - slots's slot frees up; the first `slots` trials start staggered; at
    # the end, slots whose last trial finished sit idle until the last trial completes (tail).
    gaps = sum(max(starts[k] - ends[k - slots], 0.0) for k in range(slots, len(starts)))
    stagger = sum(s - first_start for s in starts[:slots])
    tail = sum(last_end - e for e in ends[-slots:-1]) if len(ends) >= slots else 0.0
    between = slots * steady - spans
    slot_seconds = {  # sums to slots x Tune phase
        "training": training,
        "trial_setup": setup,  # reused actor: config, model build, checkpoint lookup
        "report_and_checkpoint": tune_total - training - setup - actor_startup,
        "waiting_inside_trial": spans - tune_total,  # trial running but not in train(): result handling
        "gaps_between_trials": gaps,
        "tail_imbalance": tail,
        "other_between_trials": between - gaps - tail - stagger,
        "actor_startup": actor_startup + stagger,  # first trial per slot: worker start, imports
        "tune_startup": slots * startup,
        "tune_teardown": slots * teardown,
    }
    per_trial_keys = ("trial_setup", "report_and_checkpoint", "waiting_inside_trial", "gaps_between_trials",
                      "other_between_trials")
    per_trial_overhead = sum(slot_seconds[k] for k in per_trial_keys) / n

    mlflow_training = sum(sum(t["epoch_time_s"]) for t in trials)
    mlflow_trial_time = sum(t["trial_time_s"] or 0.0 for t in trials)
    sender = inst.total("sender.send_op")
    tracker_main = inst.total(prefix="tracker.", thread="MainThread")
    recorder_main = inst.total(prefix="recorder.")
    per_trial_logging = sender + recorder_main  # what each trial causes: queue puts + the sends
    tune_slot_s = slots * phases["tune"]
    return {
        "wall_s": wall,
        "started": started_wall,
        "slots": slots,
        "trials": len(per_trial),
        "summary": summary,
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "tune_timeline_s": {"startup": startup, "steady": steady, "teardown": teardown},
        "training_s": training,
        "mlflow_training_s": mlflow_training,
        "tune_trial_time_s": tune_total,
        "mlflow_trial_time_s": mlflow_trial_time,
        "efficiency": training / (slots * wall),
        "efficiency_tune_phase": training / tune_slot_s if tune_slot_s else float("nan"),
        "efficiency_steady_state": training / (slots * steady) if steady > 0 else float("nan"),
        "efficiency_trial_time": tune_total / (slots * wall),
        "slot_seconds": slot_seconds,
        "overhead_per_trial_s": {
            "all": (slots * wall - training) / n,  # every slot-second not training, fixed costs included
            # What each further trial adds: setup, report+checkpoint, result handling, scheduling
            # gaps. Not: Ray/Tune/actor start-up, data, MLflow setup, protocol, tail imbalance.
            "per_trial": per_trial_overhead,
            "steady_state": (slots * steady - training) / n,  # per_trial + tail + actor start-up
            **{k: v / n for k, v in slot_seconds.items() if k != "training"},
        },
        # Slot-seconds that do not grow with the number of trials (tail imbalance excluded).
        "fixed_slot_s": slots * (wall - steady) + slot_seconds["actor_startup"],
        "tail_slot_s": tail,
        "mean_trial_time_s": tune_total / n,
        "mean_training_s": training / n,
        "tracking": {
            "sender_thread_s": sender,
            "sender_ops": inst.count("sender.send_op"),
            "main_thread_tracker_s": tracker_main,
            "recorder_callbacks_s": recorder_main,
            "flush_wait_s": phases["mlflow_flush"],
            "store_open_s": phases["mlflow_open"],
            "per_trial_logging_s": per_trial_logging / n,
            "share_of_trial_time": per_trial_logging / tune_total if tune_total else float("nan"),
            "one_time_s": tracker_main,  # store open/creation, parent run, sweep tags, protocol logging
            "calls": inst.by_name(),
        },
        "per_trial": per_trial,
        "mlflow_trials": trials,
        "events": events,
    }
