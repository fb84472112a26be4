"""ASHA + a sampler replayed over a grid's recorded learning curves, in seconds instead of minutes.

Training is deterministic for a configuration and seed, so the grid (every configuration trained
to the last epoch) already holds the dev accuracy any search would see after any epoch. The replay
drives the sweep's own searcher and scheduler (``make_searcher`` / ``make_scheduler``, built from
the same spec) through Tune's calls (suggest, on_trial_result, on_trial_complete) with
``max_concurrent_trials`` slots and the recorded epoch times, so many sampler seeds can be
compared where a real run affords five. It leaves out what the real runs measure: per-trial
start-up and timing noise, which can reorder results that arrive close together.
"""

from __future__ import annotations

import heapq
import itertools
from types import SimpleNamespace
from typing import Any

import optuna
from ray.tune.schedulers import TrialScheduler

from orchestrator.ray_adapter import (
    DistinctProposals,
    make_scheduler,
    make_searcher,
    param_space,
    trial_params,
)
from orchestrator.spec import SweepSpec

Curves = dict[str, list[tuple[float, float]]]  # configuration key -> per epoch (dev accuracy, seconds)


def _params_key(params: dict[str, Any]) -> str:
    return repr(sorted(params.items()))


def recorded_curves(events: list[dict[str, Any]]) -> Curves:
    """Per configuration, the (dev accuracy, epoch seconds) of each epoch, from sweep events."""
    params = {e["trial_id"]: e["params"] for e in events if e["event"] == "start"}
    curves: Curves = {}
    for e in sorted((e for e in events if e["event"] == "result"), key=lambda e: e["time"]):
        curves.setdefault(_params_key(params[e["trial_id"]]), []).append(
            (float(e["dev_accuracy"]), float(e["epoch_time_s"]))
        )
    return curves


def replay(spec_dict: dict[str, Any], curves: Curves, skip_repeats: bool = True) -> list[float]:
    """The dev accuracy of every trial-epoch, in the order a real sweep would receive them.
    skip_repeats=False unwraps the sampler from DistinctProposals (every proposal is trained)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per replayed study
    spec = SweepSpec.model_validate(spec_dict)
    search = spec.search
    searcher = make_searcher(spec)
    if not skip_repeats:
        if not isinstance(searcher, DistinctProposals):  # e.g. Repeater(DistinctProposals) for seeds
            raise ValueError("skip_repeats=False replays one-seed sweeps of an Optuna sampler only")
        searcher = searcher.searcher
    scheduler = make_scheduler(spec)
    searcher.set_search_properties(search.metric, search.mode, param_space(spec))
    scheduler.set_search_properties(search.metric, search.mode)
    search_dump = search.model_dump()
    ids, order = itertools.count(), itertools.count()
    running: list[tuple[float, int, SimpleNamespace]] = []
    received: list[float] = []

    def start(now: float) -> None:
        trial_id = f"replay_{next(ids)}"
        config = searcher.suggest(trial_id)
        trial = SimpleNamespace(trial_id=trial_id, epoch=0,
                                curve=curves[_params_key(trial_params(config, search_dump))])
        scheduler.on_trial_add(None, trial)
        heapq.heappush(running, (now + trial.curve[0][1], next(order), trial))

    if not search.max_concurrent_trials:
        raise ValueError("the replay needs search.max_concurrent_trials (its number of slots)")
    for _ in range(min(search.max_concurrent_trials, search.num_samples)):
        start(0.0)
    started = len(running)
    while running:
        now, _, trial = heapq.heappop(running)
        trial.epoch += 1
        accuracy = trial.curve[trial.epoch - 1][0]
        received.append(accuracy)
        result = {"training_iteration": trial.epoch, search.metric: accuracy}
        searcher.on_trial_result(trial.trial_id, result)
        decision = scheduler.on_trial_result(None, trial, result)
        if decision == TrialScheduler.STOP or trial.epoch == len(trial.curve):
            scheduler.on_trial_complete(None, trial, result)
            searcher.on_trial_complete(trial.trial_id, result)
            if started < search.num_samples:
                start(now)
                started += 1
        else:
            heapq.heappush(running, (now + trial.curve[trial.epoch][1], next(order), trial))
    return received


def epochs_to_reach(accuracies: list[float], threshold: float) -> int | None:
    """Trial-epochs until the best dev accuracy so far first reaches the threshold."""
    best = float("-inf")
    for n, accuracy in enumerate(accuracies, start=1):
        best = max(best, accuracy)
        if best >= threshold:
            return n
    return None
