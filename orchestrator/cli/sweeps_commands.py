"""`orchestrate sweeps` (every sweep and the state it is in) and `orchestrate best` (the selected
configuration of a completed sweep as a training config that `orchestrate train` runs)."""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import tracking_uri_option
from results import run_schema as rs
from results.results_errors import ResultsError
from results.tracking_uri import resolve_tracking_uri

if TYPE_CHECKING:  # MLflow is imported when a command runs: `--help` stays light
    from results.stored_sweeps import SweepRecord


def _duration(record: SweepRecord) -> str:
    end = record.end_time_ms / 1000 if record.end_time_ms else time.time()
    seconds = max(int(end - record.start_time_ms / 1000), 0)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _test(record: SweepRecord) -> str:
    """The test accuracy, and which evaluation it is once an extension evaluated test again."""
    evaluation = record.test_evaluation or 1
    return _accuracy(record.test_accuracy) + (f" (evaluation {evaluation})" if evaluation > 1 else "")


def render_sweeps(records: list[SweepRecord]) -> str:
    header = ("experiment", "sweep run", "state", "trials done/failed/planned", "best dev",
              "selected configuration", "test", "started (UTC)", "duration")
    rows = [header]
    for r in records:
        started = datetime.fromtimestamp(r.start_time_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")
        selected = " ".join(f"{k}={v}" for k, v in r.selected.items()) or "-"
        planned = "?" if r.planned is None else str(r.planned)
        rows.append((r.experiment, r.run_id, r.state, f"{r.done}/{r.failed}/{planned}",
                     _accuracy(r.best_dev_accuracy), selected, _test(r),
                     started, _duration(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


@click.command("sweeps")
@click.argument("experiments", nargs=-1)
@tracking_uri_option
def sweeps_command(experiments: tuple[str, ...], tracking_uri: str | None) -> None:
    """Every sweep of EXPERIMENT... (default: all) with its state (planned, running, completed,
    interrupted, failed; a running sweep whose driver died shows as interrupted), trials
    done/failed/planned, best dev accuracy so far, the selected configuration and its test
    accuracy (completed sweeps only), start time and duration."""
    from mlflow.exceptions import MlflowException

    from results.run_reader import open_client, resolve_experiments
    from results.stored_sweeps import load_sweeps

    try:
        client = open_client(resolve_tracking_uri(tracking_uri))
        chosen = resolve_experiments(client, experiments)
        records = [r for e in chosen for r in load_sweeps(client, e.experiment_id, e.name)]
    except MlflowException as exc:
        raise click.ClickException(f"reading the tracking store failed: {exc}") from None
    click.echo(render_sweeps(records))


@click.command("best")
@click.argument("experiment")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the training config here (default: stdout)")
@tracking_uri_option
def best_command(experiment: str, out: Path | None, tracking_uri: str | None) -> None:
    """The configuration EXPERIMENT's latest completed sweep selected on dev (its best seed),
    as a training config: `orchestrate train FILE` retrains it as is. Its header says which
    command reproduces the run's test accuracy: for a sweep that refits on train + dev,
    `orchestrate train FILE --refit EPOCHS`."""
    from mlflow.exceptions import MlflowException

    from nli_models.training import TRIAL_CONFIG_FILE
    from results.run_reader import open_client, resolve_experiments
    from results.stored_sweeps import load_sweeps

    try:
        client = open_client(resolve_tracking_uri(tracking_uri))
        (found,) = resolve_experiments(client, [experiment])
        completed = [r for r in load_sweeps(client, found.experiment_id, found.name) if r.completed]
        if not completed:
            raise ResultsError(
                f"experiment {experiment!r} has no completed sweep (see `orchestrate sweeps "
                f"{experiment}`); a configuration is selected only when a sweep completes"
            )
        parent = client.get_run(completed[0].run_id)
        run_id = parent.data.tags.get(rs.TAG_BEST_RUN)
        if run_id is None:
            raise ResultsError(f"sweep {completed[0].run_id} selected no configuration (no trial ended)")
        with tempfile.TemporaryDirectory() as scratch:
            path = client.download_artifacts(
                run_id, f"{rs.ARTIFACT_CHECKPOINT_DIR}/{TRIAL_CONFIG_FILE}", scratch
            )
            config = Path(path).read_text()
    except (MlflowException, OSError) as exc:
        raise click.ClickException(f"reading the selected run failed: {exc}") from None
    selected = client.get_run(run_id).data
    dev = selected.metrics.get(rs.METRIC_BEST_DEV_ACCURACY)
    text = (f"# selected on dev by sweep {completed[0].run_id} of experiment {experiment!r}: "
            f"trial run {run_id}, best dev accuracy {_accuracy(dev)}\n"
            f"{_how_to_reproduce(selected, out)}{config}")
    if out is None:
        sys.stdout.write(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    click.echo(f"wrote {out}", err=True)


def _how_to_reproduce(selected, out: Path | None) -> str:
    """Header lines: which `orchestrate train` reproduces the run's test accuracy. A refit sweep
    tested a retrain on train + dev for the run's best epoch count, which `train --refit` does."""
    test = selected.metrics.get(rs.METRIC_TEST_ACCURACY)
    file = out or "FILE"
    refit = selected.tags.get(rs.TAG_PROTOCOL_PREFIX + "refit_on_train_dev") == "True"
    if not refit:
        return (f"# test accuracy {_accuracy(test)}, of the best-dev weights: "
                f"`orchestrate train {file}` reproduces it\n")
    best_epoch = selected.metrics.get(rs.METRIC_BEST_EPOCH)
    epochs = "EPOCHS" if best_epoch is None else int(best_epoch)  # a run from before the metric
    return (
        f"# test accuracy {_accuracy(test)}, of a refit on train + dev for the run's best epoch "
        f"count ({epochs}; search.protocol.refit_on_train_dev): `orchestrate train {file} "
        f"--refit {epochs}` reproduces it; `orchestrate train {file}` trains on train alone and "
        "tests the best-dev weights instead\n"
    )


SWEEP_COMMANDS = (sweeps_command, best_command)
