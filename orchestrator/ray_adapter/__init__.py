"""The Ray adapter: the only modules of the project that import Ray (tests/test_architecture.py).
Ray's start, stop and resources (ray_runtime.py), the Tuner and its callbacks, Tune's checkpoints
and pickled state (tuner.py), the search space, the distinct-proposal guard and schedulers (ray_search.py), the Optuna
samplers over a study Optuna's public API reaches (optuna_study.py), the
trial function (ray_trial.py), a stacked trial's function (stack_trial.py) and its driver side
(stacks.py: search.stack), Ray's job API and a node's address (ray_jobs.py), and the reaper
that ends what a killed driver's Ray left (reaper.py). A Ray release that moves things changes
this folder alone."""

__all__ = ["optuna_study", "ray_jobs", "ray_runtime", "ray_search", "ray_trial", "reaper", "stack_trial", "stacks",
           "tuner"]
