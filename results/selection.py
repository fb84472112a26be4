"""The rule that picks one hyperparameter configuration per model configuration on dev data.

The sweep (to tag ``nli.selected``) and ``orchestrate results`` (to build the table) both call
``select_configuration``, so the tag and the table cannot follow different rules.

Within one model configuration (tag ``nli.model_config``):

1. Only FINISHED trial runs with a ``best_dev_accuracy`` count. A run an early-stopping scheduler
   stopped is FINISHED too and counts with the accuracy it reached; FAILED, KILLED and still
   RUNNING runs are ignored.
2. One run per (configuration, seed): a sampler such as TPE can propose the same point twice,
   and a repeat is not another seed. The run that trained the most epochs counts (ties: the
   smallest run id).
3. A configuration (tag ``nli.config_key``: the hyperparameters without the seed) scores the mean
   of ``best_dev_accuracy`` over its seed-runs; the highest mean wins.
4. Ties, in order: the higher minimum over seeds (the configuration less at the mercy of its
   seed), fewer model parameters ``theta_m`` (unknown counts last), the lexicographically smallest
   config_key, so the result never depends on the order runs were logged or listed in.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

FINISHED = "FINISHED"
# The rule above in one line: what the sweep prints and records (tag nli.selection_rule) when it
# tests the chosen configuration. A multi-objective sweep (search.objectives) keeps it: its front
# shows the trade-offs, and test data is still read for one configuration chosen on dev alone.
SELECTION_RULE = (
    "best mean best_dev_accuracy over seeds within each model configuration (ties: higher "
    "minimum over seeds, fewer parameters theta_m, smallest config_key)"
)


@dataclass(frozen=True)
class TrialRecord:
    """What the selection rule needs from one trial run."""

    run_id: str
    config_key: str
    model_config: str
    params: Mapping[str, object]  # typed (tag nli.params); strings for older runs
    best_dev_accuracy: float | None
    seed: int | None
    status: str  # MLflow run status: FINISHED, FAILED, KILLED, RUNNING, ...
    theta_m: int | None = None
    epochs_trained: float | None = None


def eligible(trial: TrialRecord) -> bool:
    """Whether a trial takes part in selection (rule 1)."""
    return trial.status == FINISHED and trial.best_dev_accuracy is not None


def seed_runs(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The trials that take part in selection, one per (configuration, seed) (rules 1-2)."""
    kept: dict[tuple[str, int | None], TrialRecord] = {}
    for trial in filter(eligible, trials):
        key = (trial.config_key, trial.seed)
        if key not in kept or _longer(trial, kept[key]):
            kept[key] = trial
    return sorted(kept.values(), key=lambda t: t.run_id)


def _longer(trial: TrialRecord, other: TrialRecord) -> bool:
    return (-(trial.epochs_trained or 0), trial.run_id) < (-(other.epochs_trained or 0), other.run_id)


def select_configuration(trials: list[TrialRecord]) -> str:
    """The config_key of the configuration selected on dev among ``trials``.

    ``trials`` are the runs of one model configuration (any status). Raises ValueError when they
    span several model configurations or none of them is eligible.
    """
    model_configs = {t.model_config for t in trials}
    if len(model_configs) > 1:
        raise ValueError(f"trials span several model configurations: {sorted(model_configs)}")
    by_config: dict[str, list[TrialRecord]] = defaultdict(list)
    for trial in seed_runs(trials):
        by_config[trial.config_key].append(trial)
    if not by_config:
        raise ValueError(
            f"no FINISHED trial with a best_dev_accuracy among {len(trials)} trial(s) of "
            f"{', '.join(sorted(model_configs)) or 'an empty list'}"
        )
    return min(by_config, key=lambda key: _rank(key, by_config[key]))


def _rank(config_key: str, seeds: list[TrialRecord]) -> tuple:
    # fsum is exactly rounded, so the same accuracies logged in another order give the same mean
    # and a real tie stays a tie instead of being decided by rounding noise.
    accuracies = [t.best_dev_accuracy for t in seeds]
    mean = math.fsum(accuracies) / len(accuracies)
    theta_m = seeds[0].theta_m
    return (-mean, -min(accuracies), theta_m is None, theta_m or 0, config_key)


def best_configuration(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The seed runs of the best configuration over every model configuration, as a sweep picks
    the one it reports: each model configuration's selection (select_configuration), the highest
    mean best_dev_accuracy over its seeds winning (ties: the first model configuration by name).
    Empty when no trial is eligible."""
    groups: dict[str, list[TrialRecord]] = defaultdict(list)
    for trial in seed_runs(trials):
        groups[trial.model_config].append(trial)
    best: list[TrialRecord] = []
    best_mean = -math.inf
    for _, members in sorted(groups.items()):
        chosen = select_configuration(members)
        seeds = [t for t in members if t.config_key == chosen]
        mean = math.fsum(t.best_dev_accuracy for t in seeds) / len(seeds)
        if mean > best_mean:
            best, best_mean = seeds, mean
    return best
