"""The probe of `orchestrate validate --estimate` (estimate.py): the sweep's configurations, and a
stacked sweep's stacks, each trained for PROBE_BATCHES batches in this process (with the thread
count a trial gets) and timed on as many dev examples: how fast a trial trains alone here.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from nli_models.data import PreparedData
from nli_models.data.encode import EncodedSplit
from orchestrator.sweep.environment import trial_threads
from orchestrator.sweep.spec import SweepSpec, apply_hyperparameters, grid_points
from orchestrator.sweep.stack_groups import group_into_stacks

# Batches each probed configuration trains: the probe's speeds set how much faster or slower each
# configuration is than the first, and on a shared machine a step's time varies several-fold from
# second to second (issue 44: epochs of one trial 0.4-2.4 s), so 20 batches (a tenth of a second
# for the quickstart) let one busy moment make a configuration look 1.6x slower than it trains.
PROBE_BATCHES = 60
WARMUP_BATCHES = 2
MAX_PROBED = 8  # grid points the probe times (a larger grid: evenly spread ones)
MAX_PROBED_STACKS = 4  # a stacked sweep's stacks the probe times (more: evenly spread ones)


def first_configuration(spec: SweepSpec) -> dict:
    """The grid's first point; for a sampler, each domain's first value (its low end)."""
    if spec.search.sampler == "grid":
        params = dict(grid_points(spec)[0])
    else:
        params = {**(spec.search.configurations or [{}])[0]}
        params.update({k: d.values[0] for k, d in spec.search.space.items()})
    return {**params, "seed": spec.search.seeds[0]}


def probed_configurations(spec: SweepSpec) -> list[dict]:
    """The configurations the probe times: a grid's points (at most MAX_PROBED, evenly spread over
    it), else the first configuration alone (a sampler's draws are not known in advance)."""
    seed = {"seed": spec.search.seeds[0]}
    if spec.search.sampler != "grid":
        return [first_configuration(spec)]
    points = grid_points(spec)
    step = max(1, math.ceil(len(points) / MAX_PROBED))
    return [{**point, **seed} for point in points[::step]]


def stacked_trials(spec: SweepSpec, slots: int | None = None) -> list[list[dict]] | None:
    """The sweep's Tune trials as their members' flat hyperparameters (seed included) where it
    stacks them (search.stack): a grid's stacks as the sweep groups them; a sampler's draws as it
    would stack them, each draw the first configuration (its draws are not known in advance; how
    many stacks they make is). None where each trial trains one configuration.

    Args:
        spec: the sweep.
        slots: the trials that run at once where it runs (SweepSpec.trial_slots), which size
            search.stack auto's stacks; None: auto's largest.
    """
    size, _ = spec.stacking(slots)
    if size == 1:
        return None
    seeds = spec.search.seeds
    if spec.search.sampler == "grid":
        members = [{**point, "seed": seed} for point in grid_points(spec) for seed in seeds]
    else:  # a configuration's seeds are drawn one after another (Tune's Repeater)
        members = [{**first_configuration(spec), "seed": seed} for _ in range(spec.search.num_samples) for seed in seeds]
    return group_into_stacks(members, lambda params: params, size, spec.stacked_fields())


def tune_trials(spec: SweepSpec, slots: int | None = None) -> int:
    """The Tune trials the sweep runs on `slots` trial slots: its stacks where it stacks (see
    stacked_trials), else its trials."""
    stacks = stacked_trials(spec, slots)
    return spec.num_trials() if stacks is None else len(stacks)


def _head(split: EncodedSplit, n: int) -> EncodedSplit:
    n = min(n, len(split))
    p, h = int(split.premise_offsets[n]), int(split.hypothesis_offsets[n])
    return replace(
        split,
        premise_ids=split.premise_ids[:p],
        premise_offsets=split.premise_offsets[: n + 1],
        hypothesis_ids=split.hypothesis_ids[:h],
        hypothesis_offsets=split.hypothesis_offsets[: n + 1],
        labels=split.labels[:n],
    )


@dataclass
class Probe:
    """The first configuration trained alone in this process, and the mean over the probed ones
    (every configuration of a small grid: their sizes differ, so do their speeds)."""

    params: dict
    threads: int
    device: str
    train_s_per_example: float  # the first configuration (the one the pilot trains)
    dev_s_per_example: float
    configurations: int  # configurations probed
    mean_train_s_per_example: float  # over the probed configurations
    mean_dev_s_per_example: float
    # A stacked sweep's probed stacks, each trained alone (its members together, per example of the
    # data), their mean: what a stacked trial's epoch takes. 0 stacks: the sweep does not stack.
    stacks: int = 0
    stack_members: int = 0  # the largest probed stack's
    stack_train_s_per_example: float = 0.0
    stack_dev_s_per_example: float = 0.0


def _time_training(make_trainer: Callable[[PreparedData], Any], data: PreparedData,
                   batch: int) -> tuple[float, float, str]:
    """(train s per example, dev s per example, device) of a trainer `make_trainer(data)` makes
    (a Trainer, or a stack's StackedTrainer): PROBE_BATCHES batches trained after WARMUP_BATCHES,
    and as many dev examples evaluated."""
    train, dev = data.splits["train"], data.splits["dev"]
    warmup = replace(data, splits={"train": _head(train, WARMUP_BATCHES * batch)})
    make_trainer(warmup).train_epoch(1)
    probe = replace(data, splits={"train": _head(train, PROBE_BATCHES * batch),
                                  "dev": _head(dev, PROBE_BATCHES * batch)})
    trainer = make_trainer(probe)
    started = time.perf_counter()
    trainer.train_epoch(1)
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    trainer.evaluate("dev")
    dev_s = time.perf_counter() - started
    return (train_s / len(probe.splits["train"]), dev_s / max(1, len(probe.splits["dev"])),
            str(trainer.device))


def _time_configuration(spec: SweepSpec, data: PreparedData, params: dict) -> tuple[float, float, str]:
    """_time_training of one configuration's trial."""
    from nli_models.training import make_trainer

    config = apply_hyperparameters(spec.base_config(), params)
    return _time_training(lambda split: make_trainer(config, split), data, config.training.batch_size)


def _time_stack(spec: SweepSpec, data: PreparedData, members: list[dict]) -> tuple[float, float, str]:
    """_time_training of a stacked trial of `members` (their flat hyperparameters)."""
    from nli_models.stacked import StackedTrainer

    configs = [apply_hyperparameters(spec.base_config(), params) for params in members]
    return _time_training(lambda split: StackedTrainer(configs, split), data, configs[0].training.batch_size)


def run_probe(spec: SweepSpec, data: PreparedData, slots: int | None = None) -> Probe:
    """Time each probed configuration with the thread count a trial gets, and up to
    MAX_PROBED_STACKS of the stacks the sweep runs on `slots` trial slots (stacked_trials)."""
    import torch

    configurations = probed_configurations(spec)
    threads = trial_threads(spec.search.resources.cpu)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    stacks = stacked_trials(spec, slots) or []
    stacks = stacks[::max(1, math.ceil(len(stacks) / MAX_PROBED_STACKS))]
    try:
        timed = [_time_configuration(spec, data, params) for params in configurations]
        timed_stacks = [_time_stack(spec, data, members) for members in stacks]
    finally:
        torch.set_num_threads(previous_threads)
    (train_s, dev_s, device), *_ = timed
    return Probe(params=configurations[0], threads=threads, device=device,
                 train_s_per_example=train_s, dev_s_per_example=dev_s,
                 configurations=len(timed),
                 mean_train_s_per_example=statistics.mean(t for t, _, _ in timed),
                 mean_dev_s_per_example=statistics.mean(d for _, d, _ in timed),
                 stacks=len(stacks), stack_members=max((len(members) for members in stacks), default=0),
                 stack_train_s_per_example=statistics.mean(t for t, _, _ in timed_stacks) if stacks else 0.0,
                 stack_dev_s_per_example=statistics.mean(d for _, d, _ in timed_stacks) if stacks else 0.0)
