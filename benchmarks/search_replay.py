"""ASHA + a sampler replayed over a grid's recorded learning curves, in seconds instead of minutes.

Training is deterministic for a configuration and seed, so the grid (every configuration trained
to the last epoch) already holds the dev accuracy any search would see after any epoch. This is
the engine of `orchestrate replay` (orchestrator/sweep/replay.py: the sweep's own searcher and
scheduler, driven in Tune's order with ``max_concurrent_trials`` slots and the recorded epoch
times), fed the grid's events as the benchmark recorded them instead of an MLflow store, so many
sampler seeds can be compared where a real run affords five. It leaves out what the real runs
measure: per-trial start-up and timing noise, which can reorder results that arrive close
together.
"""

from __future__ import annotations

from typing import Any

from orchestrator.sweep.replay import Budget, Strategy, recorded_trials
from orchestrator.sweep.replay import replay as replay_strategy
from orchestrator.sweep.spec import SweepSpec
from results import run_schema as rs
from results.replay_record import RecordedTrial


def recorded_curves(events: list[dict[str, Any]]) -> list[RecordedTrial]:
    """Each trial of a sweep's events, with its per-epoch dev accuracy and epoch seconds."""
    params = {e["trial_id"]: e["params"] for e in events if e["event"] == "start"}
    epochs: dict[str, list[dict]] = {}
    for e in sorted((e for e in events if e["event"] == "result"), key=lambda e: e["time"]):
        epochs.setdefault(e["trial_id"], []).append(e)
    return [
        RecordedTrial(
            run_id=trial_id, params=params[trial_id], config_key=trial_id, model_config="",
            theta_m=None, cut_by_scheduler=False,
            curves={rs.METRIC_DEV_ACCURACY: tuple(float(e["dev_accuracy"]) for e in results),
                    rs.METRIC_EPOCH_TIME: tuple(float(e["epoch_time_s"]) for e in results)},
        )
        for trial_id, results in epochs.items()
    ]


def replay(spec_dict: dict[str, Any], curves: list[RecordedTrial], skip_repeats: bool = True) -> list[float]:
    """The dev accuracy of every trial-epoch, in the order a real sweep would receive them.
    skip_repeats=False unwraps the sampler from DistinctProposals (every proposal is trained)."""
    spec = SweepSpec.model_validate(spec_dict)
    search = spec.search
    if not search.max_concurrent_trials:
        raise ValueError("the replay needs search.max_concurrent_trials (its number of slots)")
    run = replay_strategy(spec, recorded_trials(spec, curves), Strategy(search.sampler, search.scheduler.type),
                          search.sampler_seed, Budget(trials=spec.num_trials()),
                          search.max_concurrent_trials, distinct=skip_repeats)
    if run.missing:
        raise ValueError(f"the grid's events lack {len(run.missing)} proposed configurations")
    return [accuracy for _, accuracy in run.epochs]


def epochs_to_reach(accuracies: list[float], threshold: float) -> int | None:
    """Trial-epochs until the best dev accuracy so far first reaches the threshold."""
    best = float("-inf")
    for n, accuracy in enumerate(accuracies, start=1):
        best = max(best, accuracy)
        if best >= threshold:
            return n
    return None
