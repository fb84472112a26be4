"""The trainable of a stacked trial (search.stack): grid configurations that differ only in
nli_models.stacked.MEMBER_FIELDS trained as one ``StackedTrainer``, with one Tune report per epoch
that carries every member's result (``MEMBERS_KEY``) and one checkpoint that holds the stack's
state and each member as its solo run's checkpoint. The driver's side, which turns a stack's
events into its members' and runs the schedulers per member, is stacks.py.

A member the driver's scheduler stops is named in ``MemberStops``, an actor of the driver, with the
epoch it stops after. The trial reads it after each report (Tune's function trainable waits in
``tune.report`` until the driver has processed the result, so a stop decided on an epoch is read
before the next one trains), before each report and when it starts: a stack restored from a
checkpoint older than a member's end trains that member up to the epoch it ended at, and stops it
there, as the uninterrupted sweep did.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune
from ray.tune.result import TRAINING_ITERATION

from nli_models.data import PreparedData
from nli_models.stacked import StackedTrainer
from nli_models.training import TRIAL_CONFIG_FILE, EpochResult, TrainingDiverged
from nli_models.training.gpu_memory import cap_memory
from orchestrator.ray_adapter.ray_trial import (
    StackMember,
    config_yaml,
    device_tags,
    diverged_result,
    epoch_metrics,
    trial_config,
    trial_gpus,
    trial_params,
    trial_result,
)
from results import run_schema as rs

STACK_KEY = "stack"  # a stacked trial's Tune config: its members' Tune configs
MEMBERS_KEY = "members"  # a stacked trial's report: each member's result (JSON, a list)
MEMBER_ENDED = "member_ended"  # in a member's result: it trains no more (stopped, diverged, done)
STACK_STATE_FILE = "stack.pt"  # StackedTrainer.state_dict in a stacked trial's checkpoint
MEMBERS_FOLDER = "members"  # member i's solo checkpoint: CHECKPOINT/members/i
STOPPED_BY_SCHEDULER = "stopped"


def stack_members(tune_config: dict[str, Any], search: dict[str, Any]) -> list[dict[str, Any]]:
    """Each member's flat hyperparameters (ray_trial.trial_params) from a stacked trial's config."""
    return [trial_params(config, search) for config in tune_config[STACK_KEY]]


def member_id(trial_id: str, member: int) -> str:
    """A member's trial id: its runs, journal records and outcomes go by it."""
    return f"{trial_id}-m{member}"


def parse_member_id(trial_id: str) -> tuple[str, int] | None:
    """(stacked trial id, member index) of a member's trial id; None for any other trial's."""
    matched = re.fullmatch(r"(.+)-m(\d+)", trial_id)
    return (matched[1], int(matched[2])) if matched else None


def member_checkpoint(path: str, member: int) -> str:
    """Member `member`'s solo checkpoint folder in a stacked trial's checkpoint at `path`."""
    return f"{path.rstrip('/')}/{MEMBERS_FOLDER}/{member}"


@ray.remote(num_cpus=0)
class MemberStops:
    """The members of each stacked trial that the driver's schedulers stopped (or that ended before
    a resume), each with the epoch it stops after: trial id -> {member index: epoch}."""

    def __init__(self, stopped: dict[str, dict[int, int]]):
        self._stopped = {trial_id: dict(members) for trial_id, members in stopped.items()}

    def stop(self, trial_id: str, member: int, epoch: int) -> None:
        self._stopped.setdefault(trial_id, {})[member] = epoch

    def stopped(self, trial_id: str) -> dict[int, int]:
        return dict(self._stopped.get(trial_id, {}))


def member_results(trainer: StackedTrainer, results: list[EpochResult | None],
                   device: dict[str, str]) -> list[dict[str, Any]]:
    """Each member's result after an epoch, as a solo trial reports it (ray_trial.epoch_metrics,
    or diverged_result), with its epoch as TRAINING_ITERATION (what the driver's per-member
    schedulers count in) and MEMBER_ENDED. A member that did not train this epoch repeats its
    last epoch's (the driver records an epoch once)."""
    reports = []
    for index, state in enumerate(trainer.states):
        member = StackMember(state, trainer.theta_m, trainer.theta_wm)
        divergence = trainer.divergence(index)
        ended = not bool(trainer.active[index]) or trainer.budget_spent()
        if divergence is not None:
            metrics = diverged_result(member, TrainingDiverged(*divergence))
        elif results[index] is not None or state.history:
            last = results[index] or state.history[-1]
            finished = ended and trainer.stop_reasons[index] != STOPPED_BY_SCHEDULER
            metrics = epoch_metrics(member, last, finished)
        else:  # stopped before its first epoch (a stack restored after the driver stopped it)
            metrics = trial_result(member, 0).metrics()
        reports.append({**metrics, **device, TRAINING_ITERATION: state.epoch, MEMBER_ENDED: ended})
    return reports


def stack_summary(trainer: StackedTrainer, members: list[dict[str, Any]], metric: str,
                  mode: str) -> dict[str, Any]:
    """What Tune itself reads of a stacked trial's report: search.metric (the best member's, so
    Tune's strict metric check passes; the driver's schedulers read the members') and whether
    the stack ended."""
    values = [m[metric] for m in members if metric in m and math.isfinite(m[metric])]
    best = (max if mode == "max" else min)(values) if values else (0.0 if mode == "max" else math.inf)
    return {metric: best, rs.RESULT_TRIAL_FINISHED: int(trainer.finished())}


def run_stack_trial(tune_config: dict[str, Any], *, base: dict, search: dict, data: PreparedData,
                    stops: str) -> None:
    """A Tune function trainable for a stack: one StackedTrainer, a report and checkpoint per epoch.

    Args:
        tune_config: the trial's Tune config (STACK_KEY: its members' configs).
        base: the sweep's base run config.
        search: the sweep's search block.
        data: the prepared data.
        stops: the name of the driver's MemberStops actor.
    """
    configs = [trial_config(base, params) for params in stack_members(tune_config, search)]
    gpus = trial_gpus()
    trainer = StackedTrainer(configs, data)
    cap_memory(trainer.device, gpus)
    saved_configs = [config_yaml(config) for config in configs]
    device = device_tags(trainer.device)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            trainer.load_state_dict(torch.load(Path(directory) / STACK_STATE_FILE, weights_only=True))
    trial_id = tune.get_context().get_trial_id()
    member_stops = ray.get_actor(stops)

    def apply_stops() -> None:
        """The driver's stops of members that reached their stop's epoch, applied."""
        for member, epoch in ray.get(member_stops.stopped.remote(trial_id)).items():
            if bool(trainer.active[member]) and trainer.states[member].epoch >= epoch:
                trainer.stop(member, STOPPED_BY_SCHEDULER)

    def report(trainer: StackedTrainer, results: list[EpochResult | None]) -> None:
        apply_stops()  # a resumed sweep's earlier stops: the member ends at its stop's epoch
        members = member_results(trainer, results, device)
        with tempfile.TemporaryDirectory() as directory:
            torch.save(trainer.state_dict(), Path(directory) / STACK_STATE_FILE)
            for member, saved in enumerate(saved_configs):
                folder = Path(member_checkpoint(directory, member))
                trainer.save_member_checkpoint(member, folder)
                (folder / TRIAL_CONFIG_FILE).write_text(saved)
            tune.report({**stack_summary(trainer, members, search["metric"], search["mode"]),
                         MEMBERS_KEY: json.dumps(members)},
                        checkpoint=tune.Checkpoint.from_directory(directory))
        apply_stops()

    apply_stops()
    if checkpoint is not None and not bool(trainer.active.all()):
        # A restored stack with members that train no more: a report tells the driver of their
        # ends (it may not hold one as ended: it was interrupted as that member stopped), which no
        # later epoch may (the stack may have nothing left to train). Ends it holds, it skips.
        report(trainer, [None] * trainer.size)
    trainer.fit(report)
