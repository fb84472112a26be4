"""`orchestrate validate --estimate`: how long the whole sweep will take on this machine.

A probe trains the first configuration for a few batches on the real data (with the thread count
a trial gets) and times a few dev batches; the sweep's wall time is then
trials x epochs x (time per epoch) / concurrent trials. Stated with its assumptions, because early
stopping, schedulers and a busy machine all move it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from nli_models.data import PreparedData
from nli_models.data.encode import EncodedSplit
from orchestrator.environment import trial_threads
from orchestrator.spec import SweepSpec, apply_hyperparameters, grid_points

PROBE_BATCHES = 20
WARMUP_BATCHES = 2


def first_configuration(spec: SweepSpec) -> dict:
    """The grid's first point; for a sampler, each domain's first value (its low end)."""
    if spec.search.sampler == "grid":
        params = dict(grid_points(spec)[0])
    else:
        params = {**(spec.search.configurations or [{}])[0]}
        params.update({k: d.values[0] for k, d in spec.search.space.items()})
    return {**params, "seed": spec.search.seeds[0]}


def concurrent_trials(spec: SweepSpec, cpus: int, gpus: int) -> int:
    """Trials Ray Tune runs at once here: resources per trial against this machine's, capped by
    max_concurrent_trials and by the number of trials."""
    resources = spec.search.resources
    slots = math.floor(cpus / resources.cpu)
    if resources.gpu > 0:
        slots = min(slots, math.floor(gpus / resources.gpu))
    if spec.search.max_concurrent_trials:
        slots = min(slots, spec.search.max_concurrent_trials)
    return max(0, min(slots, spec.num_trials()))


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
class Estimate:
    params: dict
    threads: int
    device: str
    train_s_per_example: float
    dev_s_per_example: float
    train_examples: int
    dev_examples: int
    epochs: int
    trials: int
    slots: int
    cpus: int
    gpus: int

    @property
    def epoch_s(self) -> float:
        return (self.train_s_per_example * self.train_examples
                + self.dev_s_per_example * self.dev_examples)

    @property
    def total_s(self) -> float:
        return self.trials * self.epochs * self.epoch_s / self.slots

    def describe(self, spec: SweepSpec) -> str:
        search = spec.search
        lines = [
            f"estimate: {_duration(self.total_s)} for the whole sweep on this machine "
            f"= {self.trials} trials x {self.epochs} epochs x {self.epoch_s:.1f} s per epoch "
            f"/ {self.slots} concurrent trials",
            f"  probe: first configuration {self.params}, {self.threads} torch thread(s) "
            f"on {self.device}: {1e3 * self.train_s_per_example:.3f} ms per train example "
            f"({self.train_examples} per epoch), {1e3 * self.dev_s_per_example:.3f} ms per dev "
            f"example ({self.dev_examples})",
            f"  concurrent trials: {self.slots} ({self.cpus} CPUs / {search.resources.cpu} per "
            f"trial" + (f", {self.gpus} GPUs / {search.resources.gpu} per trial" if search.resources.gpu else "")
            + (f", max_concurrent_trials {search.max_concurrent_trials}" if search.max_concurrent_trials else "")
            + ")",
            "  assumes: every trial runs all its epochs (patience and "
            f"{search.scheduler.type} scheduling can only shorten it), every configuration "
            "trains as fast as the first (hidden sizes and batch sizes in the space change that), "
            "and the machine stays as busy as during the probe; data preparation and test "
            "evaluation are not included",
        ]
        if search.time_budget_s:
            lines.append(f"  capped by search.time_budget_s at {_duration(search.time_budget_s)}")
        return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate_sweep(spec: SweepSpec, data: PreparedData, cpus: int, gpus: int) -> Estimate:
    """Train the first configuration for PROBE_BATCHES batches (after WARMUP_BATCHES) and time
    them and as many dev examples, with the thread count a trial gets."""
    import torch

    from nli_models.training import make_trainer

    slots = concurrent_trials(spec, cpus, gpus)
    if slots < 1:
        raise ValueError(
            f"no trial fits on this machine: each needs {spec.search.resources.cpu} CPUs and "
            f"{spec.search.resources.gpu} GPUs, it has {cpus} CPUs and {gpus} GPUs"
        )
    params = first_configuration(spec)
    config = apply_hyperparameters(spec.base_config(), params)
    batch = config.training.batch_size
    train, dev = data.splits["train"], data.splits["dev"]
    threads = trial_threads(spec.search.resources.cpu)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        warmup = replace(data, splits={"train": _head(train, WARMUP_BATCHES * batch)})
        make_trainer(config, warmup).train_epoch(1)
        probe = replace(data, splits={"train": _head(train, PROBE_BATCHES * batch),
                                      "dev": _head(dev, PROBE_BATCHES * batch)})
        trainer = make_trainer(config, probe)
        started = time.perf_counter()
        trainer.train_epoch(1)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        trainer.evaluate("dev")
        dev_s = time.perf_counter() - started
    finally:
        torch.set_num_threads(previous_threads)
    return Estimate(
        params=params,
        threads=threads,
        device=str(trainer.device),
        train_s_per_example=train_s / len(probe.splits["train"]),
        dev_s_per_example=dev_s / max(1, len(probe.splits["dev"])),
        train_examples=len(train),
        dev_examples=len(dev),
        epochs=config.training.epochs,
        trials=spec.num_trials(),
        slots=slots,
        cpus=cpus,
        gpus=gpus,
    )
