"""`orchestrate replay`: how long replaying a recorded 36-configuration sweep takes, against how
long the sweep took.

The record: a real `orchestrate sweep` (its own process, a fresh local Ray and SQLite store) of a
36-point grid (lr 3 x dropout 3 x l2 4) of decomposable attention on the generated toy corpus,
4 epochs (--quick: 2 epochs, fewer pairs), 2 trials at once. Then `orchestrate replay` of it
with every sampler x scheduler (15 strategies since nsga2; the recorded run had 12) x 20 repeats, timed end to end (interpreter start,
imports, reading the store, writing the tables and the figure) and, in this process, the
replays alone (`orchestrator.sweep.replay.replay` over the record read once). The figure it writes is
copied to benchmarks/out/replay.png.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import Context, log, md_table, target

NAME = "replay"
TITLE = "Replay of a recorded 36-configuration sweep: every strategy x 20 repeats"
REPEATS = 20
ORCHESTRATE = [sys.executable, "-m", "orchestrator.cli.orchestrate"]


def sweep_spec(folder: Path, quick: bool) -> dict[str, Any]:
    dim = 16
    return {
        "name": "replay36",
        "model": {"name": "decomposable", "variant": "vanilla",
                  "args": {"embedding_dim": dim, "projection_dim": dim, "hidden_size": dim, "dropout": 0.0}},
        "data": {"corpus": "toy", "toy": {"size": 600 if quick else 1500, "seed": 0}},
        "training": {"optimizer": "adam", "lr": 0.003, "batch_size": 32, "epochs": 2 if quick else 4},
        "search": {
            "sampler": "grid",
            "space": {"lr": {"grid": [0.001, 0.003, 0.01]}, "dropout": {"grid": [0.0, 0.1, 0.2]},
                      "l2": {"grid": [0.0, 1.0e-5, 1.0e-4, 1.0e-3]}},
            "seeds": [1],
            "max_concurrent_trials": 2,
            "resources": {"cpu": 1},
            "tracking_uri": f"sqlite:///{folder / 'mlruns.db'}",
            "storage_path": str(folder / "ray_results"),
        },
    }


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _orchestrate(args: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (the process and whatever it waited for) and stdout."""
    started, cpu = time.perf_counter(), _cpu_children()
    done = subprocess.run([*ORCHESTRATE, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "NLI_DATA_DIR": str(cwd / "data-cache")})
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"orchestrate {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return seconds, _cpu_children() - cpu, done.stdout


def _engine_seconds(folder: Path) -> tuple[float, float, int, float]:
    """The replays alone, in this process: the record read once, then every strategy x repeat."""
    import itertools

    from nli_models.config import validate_config
    from nli_models.strict import load_yaml
    from orchestrator.cli.replay_commands import SAMPLERS, SCHEDULERS
    from orchestrator.sweep.replay import Budget, Strategy, recorded_trials, replay
    from orchestrator.sweep.spec import SweepSpec
    from results.replay_record import read_recording
    from results.run_reader import open_client

    record = read_recording(open_client(f"sqlite:///{folder / 'mlruns.db'}"), "replay36")
    spec = validate_config(SweepSpec, load_yaml(record.spec_text), "spec.yaml")
    keyed = recorded_trials(spec, list(record.trials))
    strategies = [Strategy(a, b) for a, b in itertools.product(SAMPLERS, SCHEDULERS)]
    started, cpu = time.perf_counter(), time.process_time()
    for strategy in strategies:
        for seed in range(REPEATS):
            replay(spec, keyed, strategy, seed, Budget(trials=spec.num_trials()), 2)
    training = sum(sum(t.epoch_time_s) for t in record.trials)  # what the replays stand in for
    return time.perf_counter() - started, time.process_time() - cpu, len(strategies) * REPEATS, training


def run(ctx: Context) -> dict[str, Any]:
    folder = ctx.work_dir(NAME)
    spec_path = folder / "replay36.yaml"
    spec_path.write_text(yaml.safe_dump(sweep_spec(folder, ctx.quick), sort_keys=False))
    log("replay: recording the 36-configuration sweep with `orchestrate sweep`")
    sweep_s, sweep_cpu, _ = _orchestrate(["sweep", str(spec_path)], folder)
    out = folder / "replay" / "replay36.parquet"
    from orchestrator.cli.replay_commands import SAMPLERS, SCHEDULERS

    strategies = len(SAMPLERS) * len(SCHEDULERS)
    log(f"replay: sweep took {sweep_s:.0f} s; replaying {strategies} strategies x {REPEATS} repeats")
    command = ["replay", "replay36", "--repeats", str(REPEATS), "--out", str(out), "--format", "md",
               "--tracking-uri", f"sqlite:///{folder / 'mlruns.db'}"]
    replay_s, replay_cpu, stdout = _orchestrate(command, folder)
    engine_s, engine_cpu, replays, training_s = _engine_seconds(folder)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out.with_suffix(".png"), ctx.out_dir / "replay.png")
    shutil.copyfile(out.with_suffix(".md"), ctx.out_dir / "replay.md")
    rows = [("`orchestrate sweep` (36 trials recorded; CPU: the driver only, trials ran in Ray's "
             f"workers: their epochs took {training_s:.0f} s)", round(sweep_s, 1), round(sweep_cpu, 1)),
            (f"`orchestrate replay` ({replays} replays, end to end)", round(replay_s, 1), round(replay_cpu, 1)),
            (f"the {replays} replays alone (in process)", round(engine_s, 1), round(engine_cpu, 1))]
    return {
        "sweep_s": sweep_s, "replay_cli_s": replay_s, "replay_engine_s": engine_s, "replays": replays,
        "sweep_cpu_s": sweep_cpu, "recorded_training_s": training_s, "replay_cli_cpu_s": replay_cpu, "replay_engine_cpu_s": engine_cpu,
        "command": "orchestrate " + " ".join(command[:-2]),
        "stdout": stdout,
        "targets": [target(f"replay of a 36-configuration sweep, {strategies} strategies x {REPEATS} repeats",
                           "seconds, not the sweep's time", f"{replay_s:.1f} s end to end "
                           f"({replay_cpu:.1f} s CPU), {engine_s:.1f} s of replays ({engine_cpu:.1f} s "
                           f"CPU); the sweep {sweep_s:.0f} s", replay_cpu < 60 and engine_cpu < 60)],
        "summary_md": md_table(["what", "wall s", "CPU s"], rows) + "\n\nStrategy table:\n\n"
                      + (out.with_suffix(".md")).read_text() + "\nFigure: benchmarks/out/replay.png\n",
    }
