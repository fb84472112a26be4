"""``orchestrate results``: the results table of tracked sweeps, and what is derived from it.

The lead wires it into the ``orchestrate`` group with ``main.add_command(results_command,
"results")``. Everything is computed before the first file is written, so bad input (exit code 2,
usage error) or an unreachable tracking store (exit code 1) leaves no output behind; each file is
written to a temporary sibling and renamed.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import click
import pyarrow as pa
from mlflow import MlflowClient
from mlflow.entities import Experiment
from mlflow.exceptions import MlflowException

from results.compare import PairedComparison, compare_predictions, describe_comparison, resolve_row
from results.errors import ResultsError, ResultsWarning
from results.evp import evp_table, plot_evp
from results.files import write_output
from results.published import PAPERS, comparison_table
from results.render import SUFFIXES, render, results_view
from results.sweeps import load_sweeps
from results.table import build_table
from results.tracking import (
    download_predictions,
    fetch_test_metrics,
    load_trials,
    open_client,
    resolve_experiments,
)

DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"


def _suffix(expected: str):
    def check(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        if value is not None and value.suffix != expected:
            raise click.BadParameter(f"must end in {expected}, got {value}", param=param)
        return value

    return check


@dataclass
class _Outputs:
    """Everything a run produces, computed before anything is written."""

    files: list[tuple[Path, pa.Table | str | bytes]] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)


@click.command("results")
@click.argument("experiments", nargs=-1)
@click.option(
    "--tracking-uri",
    envvar="MLFLOW_TRACKING_URI",
    default=DEFAULT_TRACKING_URI,
    show_default=True,
    help="MLflow tracking URI (SQLite file, HTTP server, ...); MLFLOW_TRACKING_URI if set.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_suffix(".parquet"),
    help="Results table to write, e.g. results/tables/snli.parquet.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(SUFFIXES)),
    help="Also render the table to stdout and to OUT with suffix .md, .csv or .tex.",
)
@click.option(
    "--paper",
    type=click.Choice(list(PAPERS)),
    help="Compare with the paper's published rows; writes OUT's stem + .PAPER.parquet "
    "(and .PAPER.md/.csv/.tex with --format, also printed).",
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="With --paper: compare experiments whose sweeps have not completed too (interrupted or "
    "still running), marked INCOMPLETE in the note column; refused otherwise.",
)
@click.option(
    "--evp",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_suffix(".png"),
    help="Plot expected validation performance (Dodge et al. 2019) per model configuration "
    "to this PNG; its table goes beside it with suffix .parquet.",
)
@click.option(
    "--mcnemar",
    "mcnemar_rows",
    nargs=2,
    metavar="ROW_A ROW_B",
    help="McNemar test of two rows on their selected runs' test predictions, printed to "
    "stdout. A row is its model configuration, or EXPERIMENT:MODEL_CONFIG when ambiguous.",
)
def results_command(
    experiments: tuple[str, ...],
    tracking_uri: str,
    out: Path,
    fmt: str | None,
    paper: str | None,
    include_incomplete: bool,
    evp: Path | None,
    mcnemar_rows: tuple[str, str] | None,
) -> None:
    """Build the results table of EXPERIMENT... (default: every experiment with trial runs).

    One row per model configuration (experiment, nli.model_config): the hyperparameters
    selected on dev (best mean best_dev_accuracy over seeds, FINISHED runs only; ties: higher
    minimum over seeds, fewer parameters, smallest config_key), their train/dev/test accuracy
    with std and 95% Student-t interval over seeds, per-class test accuracy, parameter counts,
    trials searched and compute time. Test accuracy is read only for the selected
    configuration's runs. The Parquet schema is documented in its field metadata and in
    results.table.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResultsWarning)
        try:
            outputs = _compute(
                experiments, tracking_uri, out, fmt, paper, include_incomplete, evp, mcnemar_rows
            )
        except ResultsError as exc:
            raise click.UsageError(str(exc)) from exc
        except MlflowException as exc:
            raise click.ClickException(f"reading the tracking store failed: {exc}") from exc
    for warning in caught:
        if issubclass(warning.category, ResultsWarning):
            click.echo(f"warning: {warning.message}", err=True)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    _write(outputs)


def _compute(
    experiments: tuple[str, ...],
    tracking_uri: str,
    out: Path,
    fmt: str | None,
    paper: str | None,
    include_incomplete: bool,
    evp: Path | None,
    mcnemar_rows: tuple[str, str] | None,
) -> _Outputs:
    client = open_client(tracking_uri)
    chosen = resolve_experiments(client, experiments)
    trials = load_trials(client, chosen)
    incomplete = _incomplete_sweeps(client, chosen)
    if paper and incomplete and not include_incomplete:
        raise ResultsError(
            "not comparing incomplete sweeps with the paper: "
            + "; ".join(f"{name}: {why}" for name, why in incomplete.items())
            + ". Finish them (orchestrate sweep SPEC --resume) or pass --include-incomplete "
            "to compare them marked INCOMPLETE"
        )
    table = build_table(
        trials, lambda run_id: fetch_test_metrics(client, run_id), [e.name for e in chosen]
    )
    outputs = _Outputs(files=[(out, table)])
    if fmt:
        _add_rendering(outputs, out, render(results_view(table), fmt), fmt)
    if paper:
        comparison = comparison_table(table.to_pandas(), paper, incomplete)
        path = out.with_suffix(f".{paper}.parquet")
        outputs.files.append((path, comparison))
        if fmt:
            _add_rendering(outputs, path, render(comparison.to_pandas(), fmt), fmt)
    if evp:
        curves = evp_table(trials)
        outputs.files += [(evp, plot_evp(curves)), (evp.with_suffix(".parquet"), curves)]
    if mcnemar_rows:
        outputs.stdout.append(describe_comparison(_mcnemar(client, table, *mcnemar_rows)))
    return outputs


def _incomplete_sweeps(client: MlflowClient, experiments: list[Experiment]) -> dict[str, str]:
    """Experiment -> its sweeps that have not completed, described; each sweep's state and
    progress is shown on stderr (a warning for an incomplete one)."""
    incomplete: dict[str, str] = {}
    for experiment in experiments:
        for sweep in load_sweeps(client, experiment.experiment_id, experiment.name):
            line = f"sweep {sweep.run_id} of {experiment.name}: {sweep.state}, {sweep.progress()}"
            if sweep.completed:
                click.echo(line, err=True)
                continue
            warnings.warn(f"{line}; its rows hold only the trials that ended", ResultsWarning, stacklevel=2)
            previous = incomplete.get(experiment.name)
            incomplete[experiment.name] = f"{previous}; {line}" if previous else line
    return incomplete


def _add_rendering(outputs: _Outputs, parquet_path: Path, text: str, fmt: str) -> None:
    outputs.files.append((parquet_path.with_suffix(SUFFIXES[fmt]), text))
    outputs.stdout.append(text)


def _mcnemar(client: MlflowClient, table: pa.Table, first: str, second: str) -> PairedComparison:
    rows = table.to_pandas()
    a, b = resolve_row(rows, first), resolve_row(rows, second)
    with tempfile.TemporaryDirectory() as scratch:
        paths = [
            download_predictions(client, row["selected_run_id"], Path(scratch) / name)
            for name, row in (("a", a), ("b", b))
        ]
        return compare_predictions(first, paths[0], second, paths[1])


def _write(outputs: _Outputs) -> None:
    for path, content in outputs.files:
        write_output(path, content)
        click.echo(f"wrote {path}", err=True)
    click.echo("\n".join(outputs.stdout), nl=False)


@click.command("attention")
@click.argument("run_id")
@click.option("--pairs", type=click.IntRange(1, 500), default=5, show_default=True,
              help="how many pairs of the split, in file order")
@click.option("--split", default="dev", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results/plots/attention"), show_default=True)
@click.option("--tracking-uri", envvar="MLFLOW_TRACKING_URI", default=DEFAULT_TRACKING_URI,
              show_default=True)
def attention_command(run_id: str, pairs: int, split: str, out_dir: Path, tracking_uri: str) -> None:
    """Attention heatmaps of a trial run's best-on-dev checkpoint for PAIRS pairs, written as
    PNGs and logged to the run under attention/."""
    from results.attention import attention_heatmaps

    try:
        client = open_client(tracking_uri)
        written = attention_heatmaps(client, run_id, pairs, out_dir / run_id, split)
    except (ResultsError, MlflowException) as exc:
        raise click.UsageError(str(exc)) from None
    for path in written:
        click.echo(str(path))
