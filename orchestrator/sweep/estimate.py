"""`orchestrate validate --estimate`: how long the whole sweep will take on this machine.

Two measurements, taken now, so that they meet the machine as busy as the sweep run right after
will: a probe trains the first configuration for a few batches in this process (with the thread
count a trial gets) and times a few dev batches; a pilot sweep runs `orchestrate sweep` itself on
a throw-away store, one wave of trials plus one (the first configuration with other seeds, one
epoch cut to PILOT_STEPS batches). The pilot times what the probe cannot: the process start, Ray's
start, a trial's start in a fresh worker and in a warm one, how much slower the trials train side
by side than the probe alone, the selection, the analysis and the shutdown. The sweep's wall time
is then the pilot's fixed part plus waves of trials at the probe's speed times that slowdown.
Stated with its assumptions, because early stopping, schedulers and a changing load all move it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from nli_models.config import Overrides, read_config_mapping
from nli_models.data import PreparedData
from orchestrator.sweep.environment import cache_dir
from orchestrator.sweep.estimate_probe import (
    Probe,
    first_configuration,
    run_probe,
    tune_trials,
)
from orchestrator.sweep.spec import SweepSpec, apply_hyperparameters, grid_points, logged_params
from results import run_schema as rs

PILOT_STEPS = 50  # training batches of a pilot trial (its dev evaluation is whole)


def concurrent_trials(spec: SweepSpec, cpus: int, gpus: int) -> int:
    """Trials Ray Tune runs at once here (a stack is one): resources per trial against this
    machine's, capped by max_concurrent_trials (SweepSpec.trial_slots) and by the number of Tune
    trials."""
    slots = spec.trial_slots(cpus, gpus)
    return max(0, min(slots, tune_trials(spec, slots)))


@dataclass
class Pilot:
    """What the pilot sweep measured (seconds)."""

    trials: int
    wall_s: float  # the `orchestrate sweep` process, start to exit
    first_trial_s: float  # from the process start to the first trial's start
    fixed_s: float  # the wall time outside the trials: before the first starts, after the last ends
    epoch_s: float  # a pilot trial's epoch (PILOT_STEPS batches, the whole dev set), median
    first_start_s: float  # a trial's time outside its epoch, in the first wave (fresh workers)
    later_start_s: float  # the same in a later wave (warm workers)
    evaluations: int  # test evaluations of its selection (each seed of the selected configuration)


@dataclass
class Estimate:
    probe: Probe
    pilot: Pilot
    batch_size: int
    train_examples: int
    dev_examples: int
    test_examples: int
    epochs: int
    trials: int
    slots: int
    tune_trials: int  # what runs in waves: the stacks of a stacked sweep, else its trials
    evaluations: int  # test evaluations of the sweep's selection: model configurations x seeds
    refit: bool
    cpus: int
    gpus: int

    @property
    def slowdown(self) -> float:
        """How much slower a pilot trial's epoch ran than the probe predicts for it: trials side
        by side, the driver beside them, the machine's other load."""
        pilot_train = min(PILOT_STEPS * self.batch_size, self.train_examples)
        alone = (self.probe.train_s_per_example * pilot_train
                 + self.probe.dev_s_per_example * self.dev_examples)
        return self.pilot.epoch_s / alone

    @property
    def epoch_s(self) -> float:
        """A Tune trial's epoch: averaged over the probed configurations, or stacks."""
        probe = self.probe
        train, dev = ((probe.stack_train_s_per_example, probe.stack_dev_s_per_example) if probe.stacks
                      else (probe.mean_train_s_per_example, probe.mean_dev_s_per_example))
        return self.slowdown * (train * self.train_examples + dev * self.dev_examples)

    @property
    def waves(self) -> int:
        return math.ceil(self.tune_trials / self.slots)

    @property
    def startup_s(self) -> float:
        """From `orchestrate sweep` to the first trial's first batch: the process, Ray, a fresh worker."""
        return self.pilot.first_trial_s + self.pilot.first_start_s

    @property
    def selection_s(self) -> float:
        """The selection's test evaluations beyond the pilot's, and the refit (train + dev, every
        epoch) of each selected configuration."""
        one = self.slowdown * self.probe.mean_dev_s_per_example * (self.test_examples + self.dev_examples)
        extra = (self.evaluations - self.pilot.evaluations) * one
        if self.refit:
            extra += self.evaluations * self.epochs * self.slowdown * (
                self.probe.mean_train_s_per_example * (self.train_examples + self.dev_examples))
        return extra

    @property
    def trial_s(self) -> float:
        return self.epochs * self.epoch_s

    def gpu_hours(self, gpu_per_trial: float) -> float | None:
        """GPU time the sweep holds: every trial's epochs and the selection's evaluations and
        refits, each holding its ``resources.gpu`` share; None when the probe ran off CUDA (its
        speed says nothing of a GPU's)."""
        if not self.probe.device.startswith("cuda") or gpu_per_trial <= 0:
            return None
        return (self.tune_trials * self.trial_s + self.selection_s) * gpu_per_trial / 3600

    @property
    def total_s(self) -> float:
        return (self.pilot.fixed_s + self.pilot.first_start_s + self.selection_s
                + self.waves * self.trial_s + (self.waves - 1) * self.pilot.later_start_s)

    def describe(self, spec: SweepSpec) -> str:
        search, probe, pilot = spec.search, self.probe, self.pilot
        lines = [
            f"estimate: {_duration(self.total_s)} ({self.total_s:.0f} s) for the whole sweep on "
            f"this machine = {pilot.fixed_s:.1f} s start and end + {self.waves} waves x ({self.epochs} epochs "
            f"x {self.epoch_s:.1f} s) + {pilot.first_start_s:.1f} s first-wave trial start + "
            f"{self.waves - 1} x {pilot.later_start_s:.1f} s later trial start + "
            f"{self.selection_s:.1f} s more selection",
            f"  waves: {self.trials} trials"
            + (f" as {self.tune_trials} stacked trials (search.stack {search.stack})" if probe.stacks else "")
            + f", {self.slots} at once ({self.cpus} CPUs / "
            f"{search.resources.cpu} per trial"
            + (f", {self.gpus} GPUs / {search.resources.gpu} per trial" if search.resources.gpu else "")
            + (f", max_concurrent_trials {search.max_concurrent_trials}" if search.max_concurrent_trials else "")
            + ")",
            f"  probe: first configuration {probe.params}, {probe.threads} torch thread(s) on "
            f"{probe.device}, alone: {1e3 * probe.train_s_per_example:.3f} ms per train example "
            f"({self.train_examples} per epoch), {1e3 * probe.dev_s_per_example:.3f} ms per dev "
            f"example ({self.dev_examples}); mean over the {probe.configurations} configuration(s) "
            f"probed: {1e3 * probe.mean_train_s_per_example:.3f} ms per train example, "
            f"{1e3 * probe.mean_dev_s_per_example:.3f} ms per dev example"
            + (f"; mean over the {probe.stacks} stack(s) probed (up to {probe.stack_members} members), each "
               f"alone: {1e3 * probe.stack_train_s_per_example:.3f} ms per train example, "
               f"{1e3 * probe.stack_dev_s_per_example:.3f} ms per dev example" if probe.stacks else ""),
            f"  pilot sweep (run now: {pilot.trials} trials of the first configuration, 1 epoch of "
            f"{PILOT_STEPS} batches, a throw-away store): {pilot.wall_s:.1f} s, of which "
            f"{pilot.fixed_s:.1f} s outside the trials (process and Ray start, selection, "
            f"analysis, shutdown), {pilot.first_trial_s:.1f} s to the first trial; its trials' "
            f"epochs ran {self.slowdown:.2f}x the probe's time (trials side by side and the "
            f"machine's load); {self.startup_s:.1f} s from the command to the first batch",
            "  assumes: every trial runs all its epochs (patience and "
            f"{search.scheduler.type} scheduling can only shorten it), "
            + ("a stacked trial trains at the probed stacks' mean speed, slowed by what slowed the "
               "pilot's trials (which train one configuration each)" if probe.stacks else
               "a trial trains at the probed configurations' mean speed"
               if search.sampler == "grid" else
               "every configuration trains as fast as the first (a sampler's draws are not known "
               "in advance; hidden sizes and batch sizes in the space change that)")
            + ", trials run in full waves, and the machine stays as busy as during the pilot",
        ]
        if search.resources.gpu > 0:
            hours = self.gpu_hours(search.resources.gpu)
            lines.append(
                f"  GPU-hours: {hours:.2f} ({self.tune_trials} {'stacked ' * bool(probe.stacks)}trials x "
                f"{_duration(self.trial_s)} holding "
                f"{search.resources.gpu:g} GPU each, with the selection)" if hours is not None else
                f"  GPU-hours: not estimated: the probe trained on {self.probe.device}, not a GPU "
                "(run validate --estimate where the trials will run)")
        if search.time_budget_s:
            lines.append(f"  capped by search.time_budget_s at {_duration(search.time_budget_s)}")
        return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def pilot_spec(spec_path: str | Path, overrides: Overrides | None, spec: SweepSpec, trials: int,
               folder: Path) -> Path:
    """The spec as the sweep runs it, cut to `trials` trials of the first configuration (other
    seeds) of one epoch of PILOT_STEPS batches, recorded in `folder`: written there as YAML."""
    mapping = read_config_mapping(spec_path, overrides)
    search = mapping.setdefault("search", {})
    first = first_configuration(spec)
    search["sampler"] = "grid"
    search["space"] = {name: {"grid": [first[name]]} for name in spec.search.space}
    if spec.search.configurations:
        search["configurations"] = [spec.search.configurations[0]]
    seed = spec.search.seeds[0]
    search["seeds"] = [seed + i for i in range(trials)]
    search["scheduler"] = {"type": "fifo"}
    # One configuration per trial: the pilot times the start, the end and how much slower trials
    # train side by side; a stacked trial's epoch is the probe's stacks' (Probe).
    search["stack"] = "off"
    search["protocol"] = {"refit_on_train_dev": False}  # Estimate.selection_s adds the refit
    search["tracking_uri"] = f"sqlite:///{folder / 'pilot.db'}"
    search["storage_path"] = str(folder / "ray_results")
    for key in ("time_budget_s", "num_samples"):
        search.pop(key, None)
    training = mapping.setdefault("training", {})
    training.update({"epochs": 1, "max_steps": PILOT_STEPS, "patience": None})
    path = folder / "pilot.yaml"
    path.write_text(yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True))
    return path


class PilotFailed(RuntimeError):
    """The pilot sweep did not complete (its output says why)."""


def _stopped_by_sigterm(signum, frame) -> None:
    raise PilotFailed("stopped by SIGTERM: the pilot sweep was stopped, nothing estimated")


def run_pilot(spec: SweepSpec, path: Path, slots: int) -> Pilot:
    """`orchestrate sweep` on the pilot spec at `path`, here (RAY_ADDRESS unset: this machine's
    local Ray, as the estimate is for), then its trials' times read back from its store."""
    from results.mlflow_client import mlflow_client

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    started = time.time()
    with subprocess.Popen([sys.executable, "-m", "orchestrator.cli.orchestrate", "sweep", str(path), "--new"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as child:
        previous = signal.signal(signal.SIGTERM, _stopped_by_sigterm)
        try:
            output, errors = child.communicate()
        except BaseException:  # Ctrl-C or SIGTERM: the pilot stops too (cleanly, as a sweep does)
            child.terminate()
            child.wait()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    wall_s = time.time() - started
    if child.returncode != 0:
        tail = "\n".join((errors or output).strip().splitlines()[-5:])
        raise PilotFailed(f"the estimate's pilot sweep failed (exit {child.returncode}):\n{tail}")
    uri = yaml.safe_load(path.read_text())["search"]["tracking_uri"]
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([experiment.experiment_id], f"tags.`{rs.TAG_ROLE}` = '{rs.ROLE_TRIAL}'")
    runs.sort(key=lambda run: run.info.start_time)
    epochs = [run.data.metrics[rs.METRIC_EPOCH_TIME] for run in runs]
    outside = [(run.info.end_time - run.info.start_time) / 1e3 - epoch
               for run, epoch in zip(runs, epochs, strict=True)]
    first_start = min(run.info.start_time for run in runs) / 1e3
    last_end = max(run.info.end_time for run in runs) / 1e3
    return Pilot(
        trials=len(runs), wall_s=wall_s, first_trial_s=first_start - started,
        fixed_s=wall_s - (last_end - first_start), epoch_s=statistics.median(epochs),
        first_start_s=max(0.0, statistics.mean(outside[:slots])),
        later_start_s=max(0.0, statistics.mean(outside[slots:])) if len(runs) > slots else 0.0,
        evaluations=len(runs),  # one configuration: each of its seeds is tested (with a test split)
    )


def selected_evaluations(spec: SweepSpec) -> int:
    """Test evaluations of the selection: one per model configuration (as the sweep groups
    them) and seed of the one selected in it."""
    base = logged_params(spec.base_config())
    if spec.search.sampler == "grid":
        groups = {rs.model_config_label({**base, **point}) for point in grid_points(spec)}
    else:
        groups = {rs.model_config_label({**base, **c}) for c in spec.search.configurations or [{}]}
    return len(groups) * len(spec.search.seeds)


def estimate_sweep(spec: SweepSpec, spec_path: str | Path, overrides: Overrides | None,
                   data: PreparedData, cpus: int, gpus: int) -> Estimate:
    slots = concurrent_trials(spec, cpus, gpus)
    if slots < 1:
        raise ValueError(
            f"no trial fits on this machine: each needs {spec.search.resources.cpu} CPUs and "
            f"{spec.search.resources.gpu} GPUs, it has {cpus} CPUs and {gpus} GPUs"
        )
    trial_slots = spec.trial_slots(cpus, gpus)  # which size auto's stacks
    probe = run_probe(spec, data, trial_slots)
    with tempfile.TemporaryDirectory(prefix="nli-estimate-") as folder:
        path = pilot_spec(spec_path, overrides, spec, slots + 1, Path(folder))
        pilot = run_pilot(spec, path, slots)
    if "test" not in data.splits:
        pilot = replace(pilot, evaluations=0)  # nothing to test: the selection evaluates nothing
    config = apply_hyperparameters(spec.base_config(), probe.params)
    return Estimate(
        probe=probe, pilot=pilot, batch_size=config.training.batch_size,
        train_examples=len(data.splits["train"]), dev_examples=len(data.splits["dev"]),
        test_examples=len(data.splits["test"]) if "test" in data.splits else 0,
        epochs=config.training.epochs, trials=spec.num_trials(), slots=slots,
        tune_trials=tune_trials(spec, trial_slots),
        evaluations=selected_evaluations(spec) if "test" in data.splits else 0,
        refit=spec.search.protocol.refit_on_train_dev, cpus=cpus, gpus=gpus,
    )


# -- the record `submit --slurm` reads ----------------------------------------------------------
def training_key(spec: SweepSpec) -> str:
    """What an epoch's and the start-up's time depend on: the spec without its search block and
    data folder (a cluster job reads the same data from elsewhere)."""
    fields = spec.model_dump(mode="json", exclude={"search": True, "data": {"data_dir"}})
    return json.dumps(fields, sort_keys=True)


@dataclass
class Measured:
    """One `validate --estimate`, as `submit --slurm --time` reads it back."""

    key: str
    epoch_s: float  # one epoch of the first configuration, trials side by side
    startup_s: float  # from `orchestrate sweep` to the first trial's first batch
    host: str
    when: str


def record_estimate(spec: SweepSpec, estimate: Estimate) -> None:
    path = cache_dir() / "estimates.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = Measured(key=training_key(spec), epoch_s=round(estimate.epoch_s, 2),
                     startup_s=round(estimate.startup_s, 2), host=os.uname().nodename,
                     when=time.strftime("%Y-%m-%dT%H:%M:%S"))
    with path.open("a") as handle:
        handle.write(json.dumps(asdict(entry)) + "\n")


def recorded_estimate(spec: SweepSpec) -> Measured | None:
    """The latest `validate --estimate` of this spec's training (None: never estimated here)."""
    path = cache_dir() / "estimates.jsonl"
    key, found = training_key(spec), None
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                entry = Measured(**json.loads(line))
            except (ValueError, TypeError):
                continue  # a torn line
            if entry.key == key:
                found = entry
    return found
