"""The Optuna samplers of a sweep as Tune searchers: Tune's OptunaSearch over a study that Optuna's
public API also reaches (StudySearch), and the Tune result keys the study optimises."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray.tune.search.optuna import OptunaSearch

from results import run_schema as rs

STUDY_NAME = "sweep"


class StudySearch(OptunaSearch):
    """Tune's OptunaSearch over a study in an in-memory storage that this object holds as well
    (OptunaSearch's `storage` and `study_name`), so that the study is reached through Optuna's
    public API: `study()`. It adds the configurations the sampler did not propose, with a value of
    every objective (tell_evaluated: OptunaSearch.add_evaluated_point takes one value, which a
    multi-objective study refuses), and fixes the next ask() (enqueue). OptunaSearch saves its
    whole state in one pickle, so the storage stays the study's after a restore."""

    def __init__(self, sampler, metric: list[str] | None = None, mode: list[str] | None = None):
        import optuna

        self.study_storage = optuna.storages.InMemoryStorage()
        self.distributions: dict[str, Any] = {}
        super().__init__(metric=metric, mode=mode, sampler=sampler, study_name=STUDY_NAME,
                         storage=self.study_storage)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if not super().set_search_properties(metric, mode, config, **spec):
            return False
        self.distributions = self.convert_search_space(config)
        return True

    def study(self):
        """The study the sampler draws from (set_search_properties has created it)."""
        import optuna

        return optuna.load_study(study_name=STUDY_NAME, storage=self.study_storage)

    def tell_evaluated(self, config: dict[str, Any], result: dict[str, float]) -> None:
        """Tell the study `config` as a trial it did not propose, completed with `result`'s value
        of each metric it optimises (one, or one per objective).

        Args:
            config: the configuration (names of the space).
            result: each optimised metric's value (Tune result keys).
        """
        import optuna

        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        trial = optuna.trial.create_trial(values=[result[metric] for metric in metrics], params=config,
                                          distributions=self.distributions)
        self.study().add_trial(trial)

    def enqueue(self, point: dict[str, Any]) -> None:
        """Fix the parameters of the sampler's next proposal to `point` (Optuna's enqueue_trial).

        Args:
            point: a configuration of the space.
        """
        self.study().enqueue_trial(point)


def optuna_search(sampler: str, seed: int, objectives: Sequence[tuple[str, str]] = ()) -> StudySearch:
    """Tune's OptunaSearch (a StudySearch) over the named, seeded Optuna sampler (random | tpe |
    cmaes | nsga2); with `objectives` ((name, max|min) pairs) a multi-objective study, which Tune
    wants given here, not in TuneConfig. Earlier configurations are told to it by
    DistinctProposals (StudySearch.tell_evaluated), not as points_to_evaluate /
    evaluated_rewards: OptunaSearch tells those with add_evaluated_point, one value per trial,
    which a multi-objective study refuses.

    Args:
        sampler: random | tpe | cmaes | nsga2.
        seed: the sampler's seed (search.sampler_seed).
        objectives: (name, max|min) of each objective of search.objectives; none: the search's
            metric and mode, set by Tune.
    """
    import optuna

    samplers = {
        "random": optuna.samplers.RandomSampler,
        "tpe": optuna.samplers.TPESampler,
        "cmaes": optuna.samplers.CmaEsSampler,
        "nsga2": optuna.samplers.NSGAIISampler,
    }
    # Optuna logs "A new study created in memory ..." at INFO for every study: not the user's concern
    # (the sweep says which sampler it runs).
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not objectives:
        return StudySearch(samplers[sampler](seed=seed))
    return StudySearch(samplers[sampler](seed=seed), metric=[objective_result_key(name) for name, _ in objectives],
                       mode=[direction for _, direction in objectives])


def objective_result_key(objective: str) -> str:
    """The key of a trial's Tune result that holds an objective: every epoch reports it, and the
    last one is what the searcher is told (the value the recorder stores under
    rs.OBJECTIVE_METRICS[objective]; Tune's own time_total_s becomes trial_time_s)."""
    metric = rs.OBJECTIVE_METRICS[objective]
    return "time_total_s" if metric == rs.METRIC_TRIAL_TIME else metric
