"""The results table: one row per model configuration (experiment, nli.model_config).

Within a row the hyperparameters are selected on dev by ``results.selection`` over every trial
run of that model configuration in the experiment (all its sweeps pooled, so runs added by a
later sweep compete too). When the sweep's ``nli.selected`` tags name another configuration, the
rule wins and a ResultsWarning says so. Train, dev and test accuracies are those of the selected
configuration's FINISHED seed-runs; test metrics are read for those runs only (Rocktäschel et
al. 2016 §3: only the configuration chosen on dev is evaluated on test), and are null when the
selected runs have none. Accuracies are fractions in [0, 1], as logged.

The Parquet file carries the schema version under the schema metadata key
``nli.schema_version``, ``nli.table`` = "results", the experiments read (``nli.experiments``,
JSON) and each column's description as field metadata ``description``.

Columns:

"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from results.params import as_int, canonical, parse_param
from results.results_errors import ResultsWarning
from results.run_reader import TrialRun
from results.run_schema import (
    CLASS_ACCURACY_PREFIX,
    DEV_CLASS_ACCURACY_PREFIX,
    METRIC_BEST_TRAIN_ACCURACY,
    METRIC_EPOCHS_TRAINED,
    METRIC_REFIT_EPOCHS,
    METRIC_TEST_ACCURACY,
    METRIC_THETA_WM,
    METRIC_TRIAL_TIME,
    PARAM_MODEL,
    PARAM_SEED,
    PARAM_VARIANT,
)
from results.schema import Column, arrow_table, describe, table_columns
from results.selection import seed_runs, select_configuration
from results.stats import Summary, summarise

TestMetrics = Callable[[str], Mapping[str, float]]  # run_id -> test metrics of that run


def _summary_columns(metric: str, what: str) -> list[Column]:
    return [
        Column(metric, pa.float64(), f"mean {what} over the selected configuration's seeds"),
        Column(
            f"{metric}_std",
            pa.float64(),
            f"sample std (ddof=1) of {what} over seeds; null for one seed",
        ),
        Column(
            f"{metric}_ci95_low",
            pa.float64(),
            f"lower end of the 95% Student-t interval of the mean {what}",
        ),
        Column(
            f"{metric}_ci95_high",
            pa.float64(),
            f"upper end of the 95% Student-t interval of the mean {what}",
        ),
    ]


COLUMNS = table_columns(
    "results",
    dev_accuracy_summary=_summary_columns("dev_accuracy", "best_dev_accuracy"),
    test_accuracy_summary=_summary_columns("test_accuracy", "test_accuracy (seeds that logged it)"),
)

__doc__ += describe(COLUMNS)


def build_table(
    trials: Sequence[TrialRun], test_metrics: TestMetrics, experiments: Sequence[str]
) -> pa.Table:
    """The results table of ``trials``; ``test_metrics`` is only called for selected runs."""
    groups: dict[tuple[str, str], list[TrialRun]] = defaultdict(list)
    for trial in trials:
        groups[trial.experiment, trial.record.model_config].append(trial)
    rows = []
    for (experiment, model_config), group in sorted(groups.items()):
        try:
            config_key = select_configuration([t.record for t in group])
        except ValueError as exc:
            warnings.warn(f"{experiment}: {exc}; no row for it", ResultsWarning, stacklevel=2)
            continue
        rows.append(_row(experiment, model_config, group, config_key, test_metrics))
    return arrow_table(
        rows, COLUMNS, "results", experiments=list(experiments), accuracy_unit="fraction in [0, 1]"
    )


def _row(
    experiment: str,
    model_config: str,
    group: list[TrialRun],
    config_key: str,
    test_metrics: TestMetrics,
) -> dict:
    counted = {r.run_id for r in seed_runs([t.record for t in group]) if r.config_key == config_key}
    seeds = [t for t in group if t.record.run_id in counted]
    best = min(seeds, key=lambda t: (-t.record.best_dev_accuracy, t.record.run_id))
    tagged = {t.record.config_key for t in group if t.tagged_selected}
    if tagged and tagged != {config_key}:
        warnings.warn(
            f"{experiment} / {model_config}: the sweep tagged configuration(s) "
            f"{', '.join(sorted(tagged))} as selected, the selection rule picks {config_key} "
            "(runs added after the sweep?); the table follows the rule",
            ResultsWarning,
            stacklevel=3,
        )
    tests = [test_metrics(t.record.run_id) for t in seeds]
    params = {k: parse_param(v) for k, v in sorted(best.record.params.items()) if k != PARAM_SEED}
    searched = searched_params([t.record.params for t in group])
    return {
        "experiment": experiment,
        "corpus": best.corpus,
        "protocol": json.dumps(dict(best.protocol)) if best.protocol else None,
        "model_config": model_config,
        "model": best.record.params.get(PARAM_MODEL),
        "variant": best.record.params.get(PARAM_VARIANT),
        "k": as_int(best.record.params.get("hidden_size")),
        "theta_wm": as_int(best.metrics.get(METRIC_THETA_WM)),
        "theta_m": best.record.theta_m,
        "hyperparameters": json.dumps(params),
        "searched_hyperparameters": json.dumps({k: params[k] for k in searched if k in params}),
        "config_key": config_key,
        "selected_run_id": best.record.run_id,
        "parent_run_id": best.parent_run_id,
        "selection_matches_tag": tagged == {config_key} if tagged else None,
        "n_trials": len(group),
        "n_configs": len({t.record.config_key for t in group}),
        "n_seeds": len(seeds),
        "train_accuracy_running": _mean(t.metrics.get(METRIC_BEST_TRAIN_ACCURACY) for t in seeds),
        **_summary_fields("dev_accuracy", summarise([t.record.best_dev_accuracy for t in seeds])),
        **_summary_fields(
            "test_accuracy", summarise(_present(m.get(METRIC_TEST_ACCURACY) for m in tests))
        ),
        "test_accuracy_per_class": _per_class(tests, CLASS_ACCURACY_PREFIX),
        "test_evaluation": max(
            (t.test_evaluation for t, m in zip(seeds, tests, strict=True) if METRIC_TEST_ACCURACY in m),
            default=None,
        ),
        "dev_accuracy_per_class": _per_class([t.metrics for t in seeds], DEV_CLASS_ACCURACY_PREFIX),
        "epochs_trained": _mean(t.metrics.get(METRIC_EPOCHS_TRAINED) for t in seeds),
        "refit_epochs": _mean(t.metrics.get(METRIC_REFIT_EPOCHS) for t in seeds),
        "total_trial_time_s": _sum(t.metrics.get(METRIC_TRIAL_TIME) for t in group),
    }


def searched_params(configurations: Sequence[Mapping[str, object]]) -> list[str]:
    """Names of the params (seed aside) whose value differs between configurations: what the
    search varied, read from the runs themselves (the spec's space may hold single values)."""
    names = {name for params in configurations for name in params} - {PARAM_SEED}
    return sorted(
        n for n in names
        if len({canonical(params.get(n)) for params in configurations}) > 1
    )


SEED_COLUMNS = table_columns("seeds")


def seed_table(trials: Sequence[TrialRun], table: pa.Table, test_metrics: TestMetrics) -> pa.Table:
    """One row per FINISHED seed-run of each row's selected configuration (``--per-seed``)."""
    selected = {
        (row["experiment"], row["model_config"]): row["config_key"] for row in table.to_pylist()
    }
    groups: dict[tuple[str, str], list[TrialRun]] = defaultdict(list)
    for trial in trials:
        groups[trial.experiment, trial.record.model_config].append(trial)
    rows = []
    for key, config_key in sorted(selected.items()):
        counted = {r.run_id for r in seed_runs([t.record for t in groups[key]])}
        seeds = [t for t in groups[key] if t.record.run_id in counted and t.record.config_key == config_key]
        for trial in sorted(seeds, key=lambda t: (t.record.seed is None, t.record.seed)):
            rows.append(
                {
                    "experiment": key[0],
                    "model_config": key[1],
                    "seed": trial.record.seed,
                    "run_id": trial.record.run_id,
                    "train_accuracy_running": trial.metrics.get(METRIC_BEST_TRAIN_ACCURACY),
                    "dev_accuracy": trial.record.best_dev_accuracy,
                    "test_accuracy": test_metrics(trial.record.run_id).get(METRIC_TEST_ACCURACY),
                }
            )
    return arrow_table(rows, SEED_COLUMNS, "seeds")


def _summary_fields(metric: str, summary: Summary) -> dict:
    return {
        metric: summary.mean,
        f"{metric}_std": summary.std,
        f"{metric}_ci95_low": summary.ci_low,
        f"{metric}_ci95_high": summary.ci_high,
    }


def _per_class(runs: list[Mapping[str, float]], prefix: str) -> str | None:
    labels = sorted({name for m in runs for name in m if name.startswith(prefix)})
    if not labels:
        return None
    return json.dumps(
        {name.removeprefix(prefix): _mean(m.get(name) for m in runs) for name in labels}
    )


def _present(values) -> list[float]:
    return [v for v in values if v is not None]


def _mean(values) -> float | None:
    return summarise(_present(values)).mean


def _sum(values) -> float | None:
    present = _present(values)
    return math.fsum(present) if present else None
