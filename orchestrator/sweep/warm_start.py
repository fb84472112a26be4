"""An earlier sweep's trials as points of this spec's space: what `--warm-start EXPERIMENT` tells
an Optuna sampler and what `--extend` does not run again (orchestrator/sweep/extend.py).

Compatibility is strict and checked before anything is written: every trial taken from the earlier
sweep must be a point of this spec's space. A hyperparameter this spec does not search must have
the value the spec fixes, and a searched one must lie in its domain (a grid or choice value, within
a uniform/loguniform/randint range, one of search.configurations); otherwise the sweep stops with
an error naming the run, the hyperparameter, its value and what the spec allows (exit 2). Skipping
such trials instead would tell the sampler a smaller record than the user asked for, silently.

What a sampler is told of a configuration is what Tune told it in the earlier sweep
(ray_search.told_result): the last reported `search.metric` of each of its trials (MLflow's
latest value of the per-epoch metric), averaged over seeds as Tune's Repeater does.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from collections.abc import Iterable
from typing import Any

from nli_models.errors import InputError
from orchestrator.ray_adapter.ray_search import PriorTrials, told_result
from orchestrator.ray_adapter.ray_trial import CONFIGURATION_KEY
from orchestrator.sweep.spec import Domain, SweepSpec, logged_params
from results import run_schema as rs
from results.run_reader import trial_params
from results.sweeps import observed_state

FINITE_SPACE_LIMIT = 10_000  # a larger finite space is treated as continuous (not enumerated)


def searched(spec: SweepSpec) -> list[str]:
    """The hyperparameters the spec searches: its space, then its configurations' arguments."""
    names = list(spec.search.space)
    for configuration in spec.search.configurations:
        names += [name for name in configuration if name not in names]
    return names


def finished(runs: list) -> list:
    """Trial runs that finished (not failed, not diverged): the record a sampler is told."""
    return [run for run in runs if run.info.status == "FINISHED" and run.data.tags.get(rs.TAG_DIVERGED) != "true"]


_MISSING = object()


def _in_domain(domain: Domain, value: Any) -> Any:
    """The domain's own value equal to `value` (what the sampler proposes for it), or _MISSING."""
    if domain.kind in ("grid", "choice"):
        return next((v for v in domain.values
                     if value == v and isinstance(value, bool) == isinstance(v, bool)), _MISSING)
    low, high = domain.values
    number = int if domain.kind == "randint" else (int, float)
    inside = isinstance(value, number) and not isinstance(value, bool) and low <= value <= high
    return value if inside else _MISSING


def tune_point(spec: SweepSpec, run, where: str, seed: bool = False) -> dict[str, Any]:
    """Tune's config of a trial run of an earlier sweep in this spec's space (searched names,
    the index of its search.configurations entry, with `seed` its seed); InputError when the run
    is not a point of the space (see the module docstring)."""
    label = f"{where}: trial run {run.info.run_name!r} ({run.info.run_id})"
    return point_of(spec, trial_params(run), label, seed)


def point_of(spec: SweepSpec, params: dict[str, Any], label: str, seed: bool = False) -> dict[str, Any]:
    """Tune's config of a trial that ran the flat hyperparameters `params` (as tune_point; an
    MLflow run's, or a journal's start record's); `label` names the trial in an InputError."""
    names = searched(spec)
    for name, value in logged_params(spec.base_config()).items():
        if name in names or name == rs.PARAM_SEED or name not in params or params[name] == value:
            continue
        raise InputError(
            f"{label} ran {name}={params[name]!r}, which this spec does not search (it fixes "
            f"{name}={value!r}); search {name} in search.space, or use a sweep that ran {name}={value!r}"
        )
    point: dict[str, Any] = {}
    for name, domain in spec.search.space.items():
        point[name] = _in_domain(domain, params.get(name))
        if point[name] is _MISSING:
            raise InputError(
                f"{label} ran {name}={params.get(name)!r}, outside search.space.{name} "
                f"({domain.kind} {domain.values}); widen the domain to hold it"
            )
    configurations = spec.search.configurations
    if configurations:
        index = next((i for i, c in enumerate(configurations)
                      if all(params.get(k) == v for k, v in c.items())), None)
        if index is None:
            ran = {k: params.get(k) for c in configurations for k in c}
            raise InputError(f"{label} ran {ran}, none of search.configurations; add it to them")
        point[CONFIGURATION_KEY] = index
    if seed:
        point[rs.PARAM_SEED] = params.get(rs.PARAM_SEED)
    return point


def config_key(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True, default=str)


def recorded_points(spec: SweepSpec, runs: list, where: str) -> tuple[list[dict], list[dict[str, float]]]:
    """The configurations the finished `runs` trained (no seed), each with the mean over its
    seeds of what Tune told the sampler of them (told_result)."""
    return evaluated_points((tune_point(spec, run, where), told_result(spec, run.data.metrics))
                            for run in finished(runs))


def evaluated_points(
    measured: Iterable[tuple[dict, dict[str, float] | None]],
) -> tuple[list[dict], list[dict[str, float]]]:
    """Each configuration of the (configuration, told result) pairs once, with the mean of each
    metric of its results (over its seeds, as Tune's Repeater tells the sampler); a pair without
    a result is left out."""
    results: dict[str, tuple[dict, list[dict[str, float]]]] = {}
    for point, result in measured:
        if result is not None:
            results.setdefault(config_key(point), (point, []))[1].append(result)
    return ([p for p, _ in results.values()],
            [{m: statistics.fmean(r[m] for r in told) for m in told[0]} for _, told in results.values()])


def _domain_values(domain: Domain) -> list[Any] | None:
    if domain.kind in ("grid", "choice"):
        return domain.values
    if domain.kind == "randint":
        low, high = domain.values
        return list(range(low, high + 1))
    return None  # continuous


def finite_space(spec: SweepSpec, limit: int | None = FINITE_SPACE_LIMIT) -> list[dict[str, Any]] | None:
    """Every configuration of the space (Tune configs, no seed), or None when a domain is
    continuous or the space holds more than `limit`."""
    axes = {name: _domain_values(domain) for name, domain in spec.search.space.items()}
    if spec.search.configurations:
        axes[CONFIGURATION_KEY] = list(range(len(spec.search.configurations)))
    if any(values is None for values in axes.values()):
        return None
    size = 1
    for values in axes.values():
        size *= len(values)
    if limit is not None and size > limit:
        return None
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]


def check_single_objective(spec: SweepSpec, option: str) -> None:
    """InputError for a spec with search.objectives: --warm-start and a sampler's --extend tell
    earlier trials to a single-objective study only (a resume from the journal tells a
    multi-objective one every objective, ray_search.told_result; these two are not tested so)."""
    if spec.search.objectives:
        raise InputError(
            f"{option}: search.objectives {[name for name, _ in spec.search.objective_directions]} make a multi-objective "
            f"study, which {option} does not tell earlier trials to (it tells a single-objective "
            f"study, search.metric {spec.search.metric!r}); drop search.objectives or {option}"
        )


def check_room(spec: SweepSpec, prior: PriorTrials, configurations: int, option: str) -> None:
    """InputError when a finite space has fewer unfinished configurations than the sweep draws."""
    if prior.finite_space is not None and len(prior.finite_space) - len(prior.points) < configurations:
        raise InputError(
            f"{option}: the space holds {len(prior.finite_space)} configurations and "
            f"{len(prior.points)} of them finished before, so it cannot give {configurations} new "
            f"ones (search.num_samples); widen search.space or draw fewer"
        )


def warm_start(tracker, spec: SweepSpec, experiment: str) -> tuple[PriorTrials, str]:
    """What `--warm-start EXPERIMENT` tells the sampler: the finished trials of the experiment's
    latest sweep that is not running and has any, and the tag naming that sweep."""
    option = f"--warm-start {experiment}"
    if spec.search.sampler == "grid":
        raise InputError(
            f"{option}: a warm start seeds an Optuna sampler (search.sampler random, tpe or "
            "cmaes); sampler grid runs every grid point whatever ran before. To run only the new "
            "points of a completed grid sweep, change its grid and pass --extend"
        )
    check_single_objective(spec, option)
    experiment_id = tracker.find_experiment(experiment)
    if experiment_id is None:
        raise InputError(f"{option}: the tracking store {tracker.tracking_uri} holds no experiment {experiment!r}")
    for parent in tracker.sweeps(experiment_id):
        if observed_state(parent.data.tags) == rs.SWEEP_RUNNING:
            continue
        runs = finished(tracker.trial_runs(experiment_id, parent.info.run_id))
        if runs:
            points, values = recorded_points(spec, runs, option)
            prior = PriorTrials(points, values, finite_space=finite_space(spec))
            check_room(spec, prior, spec.search.num_samples, option)
            print(f"warm start: the sampler is told {len(points)} configurations that sweep run "
                  f"{parent.info.run_id} of experiment {experiment!r} finished", file=sys.stderr)
            return prior, f"{experiment}/{parent.info.run_id}"
    raise InputError(f"{option}: no sweep of experiment {experiment!r} (none running) has a finished trial")
