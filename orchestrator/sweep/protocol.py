"""The paper protocol, applied once every planned trial of a sweep ended (Rocktäschel §3): within
each model configuration pick the hyperparameters with the best mean dev accuracy over seeds
(results/selection.py, the rule the results table uses too), and evaluate test data for that
configuration alone, from its best-on-dev weights or a refit on train + dev (search.protocol).
Nothing here is recorded: the driver records the ``Selection`` in one go."""

from __future__ import annotations

import io
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

from nli_models.data import PreparedData
from nli_models.training import make_trainer, refit_and_test
from nli_models.training.refit import refit_epochs
from orchestrator.ray_adapter.tuner import TrialOutcome
from orchestrator.sweep.lifecycle import (
    Interruption,
    SweepInterrupted,
)
from orchestrator.sweep.spec import (
    SweepSpec,
    apply_hyperparameters,
    config_key,
)
from results import run_schema as rs
from results.selection import FINISHED, SELECTION_RULE, seed_runs, select_configuration


def _predictions_table(evaluation, labels: tuple[str, ...]) -> bytes:
    frame = pd.DataFrame(
        {
            "index": range(len(evaluation.gold)),
            "label": evaluation.gold,
            "prediction": evaluation.predictions,
            "label_name": [labels[i] for i in evaluation.gold],
        }
    )
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


@dataclass
class Selection:
    """The selection on dev and the test evaluation of a completed sweep, computed before any
    of it is recorded (record_selection writes it in one go)."""

    tested: dict[str, dict[str, float]] = field(default_factory=dict)  # run id -> test metrics
    selected: set[str] = field(default_factory=set)  # the selected configurations' seeds (ids as in tested)
    predictions: dict[str, bytes] = field(default_factory=dict)  # run id -> test predictions
    best_dev: float | None = None
    best_test: float | None = None
    best_run_id: str | None = None


def _test_evaluation(spec, config, data, trainer, outcome: TrialOutcome):
    """The protocol's test evaluation (search.protocol): the best-dev weights, or a refit on
    train + dev for the run's best epoch count. Returns it and, for a refit, its epochs (all
    phases) and wall time."""
    if spec.search.protocol.refit_on_train_dev:
        started = time.perf_counter()
        refit, evaluation = refit_and_test(
            config, data, outcome.result.best_epoch, _refit_progress(config, data, outcome, started)
        )
        return evaluation, {
            rs.METRIC_REFIT_EPOCHS: refit.state.epoch,
            rs.METRIC_REFIT_TIME: time.perf_counter() - started,
        }
    return trainer.evaluate_best("test"), {}


def _refit_progress(config, data, outcome: TrialOutcome, started: float):
    """A line per refit epoch on stderr, so that minutes of refit are not silent."""
    total = refit_epochs(config, outcome.result.best_epoch)
    pairs = len(data.splits["train"]) + len(data.splits["dev"])
    print(f"refit of {outcome.params} on train + dev ({pairs:,} pairs): {total} epochs "
          f"(the selection run's best epoch {outcome.result.best_epoch}), then test", file=sys.stderr)

    def progress(trainer, result) -> None:
        elapsed = time.perf_counter() - started
        left = elapsed / result.epoch * (total - result.epoch)
        print(f"  refit epoch {result.epoch}/{total}: {elapsed:.0f} s, about {left:.0f} s left",
              file=sys.stderr)

    return progress


def _evaluate_selected(spec: SweepSpec, data: PreparedData, outcome: TrialOutcome) -> tuple[dict[str, float], bytes]:
    """Test metrics and predictions of one seed of the selected configuration (from its
    best-on-dev weights, or its refit: _test_evaluation)."""
    config = apply_hyperparameters(spec.base_config(), outcome.params)
    config = config.model_copy(update={"training": config.training.model_copy(update={"device": "auto"})})
    trainer = make_trainer(config, data)
    with outcome.local_checkpoint() as directory:
        trainer.load_checkpoint(directory)
    evaluation, refit = _test_evaluation(spec, config, data, trainer, outcome)
    dev = trainer.evaluate_best("dev")
    metrics = {rs.METRIC_TEST_ACCURACY: evaluation.accuracy, **refit}
    metrics.update({rs.CLASS_ACCURACY_PREFIX + k: v for k, v in evaluation.class_accuracy.items()})
    metrics.update({rs.DEV_CLASS_ACCURACY_PREFIX + k: v for k, v in dev.class_accuracy.items()})
    return metrics, _predictions_table(evaluation, data.labels)


def apply_paper_protocol(
    spec: SweepSpec,
    data: PreparedData,
    ended: list[TrialOutcome],
    run_ids: dict[str, str],
    full_params: dict[str, dict],
    interruption: Interruption,
    tested_before: dict[str, float] | None = None,
) -> Selection:
    """Select on dev per model configuration among the trials that ended; evaluate test data for
    the selected configurations only (a trial in `tested_before`, trial id -> test accuracy, is
    not evaluated again: --extend). Stops with SweepInterrupted if a signal comes meanwhile; what
    was selected and tested is printed only once the whole selection completed (an interrupted
    one records no test metric, so shows none)."""
    tested_before = tested_before or {}
    finished = [
        o for o in ended
        if o.error is None and o.result.best_dev_accuracy is not None
        and rs.METRIC_DIVERGED_EPOCH not in o.metrics
    ]
    groups: dict[str, list[TrialOutcome]] = defaultdict(list)
    for outcome in finished:
        groups[rs.model_config_label(full_params[outcome.trial_id])].append(outcome)
    selection = Selection()
    selected_lines = []
    if groups:
        print(f"selection rule: {SELECTION_RULE}", file=sys.stderr)
    for label, members in sorted(groups.items()):
        records = [
            o.result.record(
                run_id=run_ids.get(o.trial_id, o.trial_id),
                config_key=config_key(full_params[o.trial_id]),
                model_config=label,
                params=full_params[o.trial_id],
                status=FINISHED,
            )
            for o in members
        ]
        chosen = select_configuration(records)
        by_run = {record.run_id: o for record, o in zip(records, members, strict=True)}
        seeds = [by_run[r.run_id] for r in seed_runs(records) if r.config_key == chosen]
        dev = sum(o.result.best_dev_accuracy for o in seeds) / len(seeds)
        tests = []
        if "test" in data.splits:
            for outcome in seeds:
                if outcome.checkpoint is not None and outcome.trial_id in run_ids:
                    if interruption.requested:
                        raise SweepInterrupted("interrupted during the test evaluation")
                    run_id = run_ids[outcome.trial_id]
                    selection.selected.add(run_id)
                    if run_id in tested_before:
                        tests.append(tested_before[run_id])
                        continue
                    metrics, predictions = _evaluate_selected(spec, data, outcome)
                    selection.tested[run_id], selection.predictions[run_id] = metrics, predictions
                    tests.append(metrics[rs.METRIC_TEST_ACCURACY])
        test = sum(tests) / len(tests) if tests else None
        selected_lines.append(f"selected on dev for {label}: {seeds[0].params} dev {dev:.2%}"
                              + (f" test {test:.2%}" if test is not None else ""))
        if selection.best_dev is None or dev > selection.best_dev:
            selection.best_dev, selection.best_test = dev, test
            best_run = max(seeds, key=lambda o: o.result.best_dev_accuracy)
            selection.best_run_id = run_ids.get(best_run.trial_id)
    if interruption.requested:
        raise SweepInterrupted("interrupted during the selection")
    for line in selected_lines:
        print(line, file=sys.stderr)
    return selection
