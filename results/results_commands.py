"""``orchestrate results`` (the results table of tracked sweeps, and what is derived from it) and
``orchestrate report`` (a reproducibility page per experiment, results/report.py).

orchestrator/cli/orchestrate.py adds both to the ``orchestrate`` group. Everything is computed before the first file is written, so bad input (exit code 2,
usage error) or an unreachable tracking store (exit code 1) leaves no output behind; each file is
written to a temporary sibling and renamed.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

# Light imports only (`orchestrate --help` loads neither MLflow nor pandas); the commands import
# the rest when they run.
from nli_models.outputs import check_output_path
from results.formats import PAPER_NAMES, SUFFIXES
from results.results_errors import ResultsError, ResultsWarning
from results.tracking_uri import TRACKING_URI_HELP, resolve_tracking_uri

if TYPE_CHECKING:
    import pyarrow as pa
    from mlflow import MlflowClient
    from mlflow.entities import Experiment

    from results.compare import PairedComparison


class _FileWithSuffix(click.Path):
    """A file to write, as a Path, whose name must end in ``suffix``."""

    def __init__(self, suffix: str):
        super().__init__(dir_okay=False, path_type=Path)
        self.suffix = suffix

    def convert(self, value, param, ctx) -> Path:
        path = super().convert(value, param, ctx)
        if path.suffix != self.suffix:
            self.fail(f"must end in {self.suffix}, got {path}", param, ctx)
        return path


_FOLDER = click.Path(file_okay=False, path_type=Path)  # an output folder option


@dataclass
class _Outputs:
    """Everything a run produces, computed before anything is written."""

    files: list[tuple[Path, pa.Table | str | bytes]] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    # (run id, folder whose files are logged, artifact path): logged after the files are written
    artifacts: list[tuple[str, Path, str]] = field(default_factory=list)


@click.command("results")
@click.argument("experiments", nargs=-1)
@click.option("--tracking-uri", default=None, help=TRACKING_URI_HELP)
@click.option(
    "--out",
    required=True,
    type=_FileWithSuffix(".parquet"),
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
    type=click.Choice(PAPER_NAMES),
    help="Compare with the paper's published rows: prints a paper-style table (our row beside "
    "the paper's, known reproductions, and every way our protocol differs from the paper's) and "
    "writes it to OUT's stem + .PAPER-table.parquet (.md/.csv/.tex with --format); every "
    "published value and ours, one per line, go to OUT's stem + .PAPER.parquet.",
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="With --paper: compare experiments whose sweeps have not completed too (interrupted or "
    "still running), marked INCOMPLETE in the note column; refused otherwise.",
)
@click.option(
    "--evp",
    type=_FileWithSuffix(".png"),
    help="Plot expected validation performance (Dodge et al. 2019) per model configuration "
    "over trials to this PNG, with .pdf and .svg beside it, and over wall-clock hours to "
    "STEM.hours.png/.pdf/.svg; its table goes beside it with suffix .parquet.",
)
@click.option(
    "--mcnemar",
    "mcnemar_rows",
    nargs=2,
    metavar="ROW_A ROW_B",
    help="McNemar test of two rows on their selected runs' test predictions, printed to "
    "stdout. A row is its model configuration, or EXPERIMENT:MODEL_CONFIG when ambiguous.",
)
@click.option(
    "--per-seed",
    is_flag=True,
    help="Also write OUT's stem + .seeds.parquet (one row per seed of each selected "
    "configuration) and show those rows under their configuration with --format md/latex.",
)
@click.option(
    "--analysis",
    type=_FOLDER,
    help="Write each experiment's hyperparameter importance (Optuna fANOVA, PED-ANOVA), "
    "parallel coordinates and top-5 learning curves to ANALYSIS/EXPERIMENT/, and log them to "
    "the sweep's parent run under analysis/.",
)
@click.option(
    "--pareto",
    type=_FOLDER,
    help="Write each experiment's Pareto front over its sweep's search.objectives (dev_accuracy "
    "max, theta_m min for a sweep with one metric) to PARETO/EXPERIMENT/pareto.png (.pdf, .svg) "
    "and pareto.parquet, print the trials on it, and log them to the sweep's parent run under "
    "pareto/. The figure marks the configuration selected on dev and the paper's own.",
)
@click.option("--caption", default=None, help="LaTeX caption (--format latex); default: describes the table.")
@click.option("--label", default=None, help="LaTeX label (--format latex); default: tab:OUT's stem.")
def results_command(experiments: tuple[str, ...], tracking_uri: str | None, **options) -> None:
    """Build the results table of EXPERIMENT... (default: every experiment with trial runs).

    One row per model configuration (experiment, nli.model_config): the hyperparameters
    selected on dev (best mean best_dev_accuracy over seeds, FINISHED runs only; ties: higher
    minimum over seeds, fewer parameters, smallest config_key), their train/dev/test accuracy
    with std and 95% Student-t interval over seeds, per-class test accuracy, parameter counts,
    trials searched and compute time. Test accuracy is read only for the selected
    configuration's runs. The Parquet schema is documented in its field metadata and in
    results.table.
    """
    from mlflow.exceptions import MlflowException

    tracking_uri = resolve_tracking_uri(tracking_uri)
    request = _Request(**options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResultsWarning)
        try:
            check_output_path(request.out, "--out")  # before the store is read: fails in a second
            if request.evp is not None:
                check_output_path(request.evp, "--evp")
            if request.pareto is not None:
                check_output_path(request.pareto, "--pareto", folder=True)
            outputs = _compute(experiments, tracking_uri, request)
            for path, _ in outputs.files:  # every file checked before the first is written
                check_output_path(path, _option_of(path, request.evp))
        except MlflowException as exc:
            raise click.ClickException(f"reading the tracking store failed: {exc}") from exc
    from results.run_reader import open_client

    _echo_warnings(caught)
    _write(outputs, open_client(tracking_uri))


def _echo_warnings(caught: list[warnings.WarningMessage]) -> None:
    for warning in caught:
        if issubclass(warning.category, ResultsWarning):
            click.echo(f"warning: {warning.message}", err=True)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )


@dataclass(frozen=True)
class _Request:
    """The options of `orchestrate results`, as click passes them (one field per option)."""

    out: Path
    fmt: str | None
    paper: str | None
    include_incomplete: bool
    evp: Path | None
    mcnemar_rows: tuple[str, str] | None
    per_seed: bool
    caption: str | None
    label: str | None
    analysis: Path | None
    pareto: Path | None


def _compute(experiments: tuple[str, ...], tracking_uri: str, request: _Request) -> _Outputs:
    from results.evp import evp_table, plot_evp
    from results.figures import figure_files
    from results.paper_table import describe_paper_table, paper_table
    from results.published import comparison_table
    from results.run_reader import fetch_test_metrics, load_trials, open_client, resolve_experiments
    from results.table import build_table, seed_table

    client = open_client(tracking_uri)
    chosen = resolve_experiments(client, experiments)
    trials = load_trials(client, chosen)
    incomplete = _incomplete_sweeps(client, chosen)
    out, fmt, paper, evp = request.out, request.fmt, request.paper, request.evp
    if paper and incomplete and not request.include_incomplete:
        raise ResultsError(
            "not comparing incomplete sweeps with the paper: "
            + "; ".join(f"{name}: {why}" for name, why in incomplete.items())
            + ". Finish them (orchestrate sweep SPEC --resume) or pass --include-incomplete "
            "to compare them marked INCOMPLETE"
        )
    fetch = lambda run_id: fetch_test_metrics(client, run_id)  # noqa: E731
    table = build_table(trials, fetch, [e.name for e in chosen])
    outputs = _Outputs(files=[(out, table)])
    seeds = seed_table(trials, table, fetch) if request.per_seed else None
    if seeds is not None:
        outputs.files.append((out.with_suffix(".seeds.parquet"), seeds))
    if fmt:
        _add_rendering(outputs, out, _render_table(client, table, seeds, request), fmt)
    if paper:
        frame = table.to_pandas()
        comparison = comparison_table(frame, paper, incomplete)
        outputs.files.append((out.with_suffix(f".{paper}.parquet"), comparison))
        wide = paper_table(frame, paper)
        wide_path = out.with_suffix(f".{paper}-table.parquet")
        outputs.files.append((wide_path, wide))
        text = describe_paper_table(wide, fmt or "md")
        if incomplete:  # only with --include-incomplete: the table says so above its rows
            text = "".join(
                f"INCOMPLETE sweep(s) in {name}: {why}\n" for name, why in incomplete.items()
            ) + text
        if fmt:
            _add_rendering(outputs, wide_path, text, fmt)
        else:
            outputs.stdout.append(text)
    if evp:
        curves = evp_table(trials)
        outputs.files += figure_files(plot_evp(curves, "trials"), evp)
        outputs.files += figure_files(plot_evp(curves, "hours"), evp.with_suffix(".hours.png"))
        outputs.files.append((_evp_table(evp), curves))
    if request.mcnemar_rows:
        from results.compare import describe_comparison

        outputs.stdout.append(describe_comparison(_mcnemar(client, table, *request.mcnemar_rows)))
    if request.analysis:
        _add_analysis(outputs, client, trials, request.analysis)
    if request.pareto:
        _add_pareto(outputs, client, trials, request.pareto)
    return outputs


def _add_pareto(outputs: _Outputs, client: MlflowClient, trials: list, folder: Path) -> None:
    """Per experiment: its front's figure and table under FOLDER/EXPERIMENT/, printed, and logged
    to each parent run of its trials under pareto/."""
    from results.atomic_files import file_stem
    from results.figures import figure_files
    from results.pareto import describe_front, pareto_front, plot_front, sweep_objectives
    from results.run_schema import ARTIFACT_PARETO_DIR

    for experiment in sorted({t.experiment for t in trials}):
        parents = sorted({t.parent_run_id for t in trials if t.experiment == experiment and t.parent_run_id})
        objectives = sweep_objectives([client.get_run(p).data.tags for p in parents], experiment)
        front = pareto_front(trials, experiment, objectives)
        target = folder / file_stem(experiment)
        outputs.files += figure_files(plot_front(front), target / "pareto.png")
        outputs.files.append((target / "pareto.parquet", front.table))
        outputs.stdout.append(describe_front(front))
        outputs.artifacts += [(parent, target, ARTIFACT_PARETO_DIR) for parent in parents]


def _add_analysis(
    outputs: _Outputs, client: MlflowClient, trials: list, folder: Path
) -> None:
    """Per experiment: importance, parallel coordinates and top-k learning curves under
    FOLDER/EXPERIMENT/, also logged to the parent run of the experiment's best trial."""
    from results.analysis import analysis_files, importance_with_notes, top_trials
    from results.atomic_files import file_stem
    from results.run_reader import metric_histories
    from results.run_schema import ARTIFACT_ANALYSIS_DIR, METRIC_DEV_ACCURACY

    importance, notes = importance_with_notes(trials)
    for experiment, why in notes.items():
        warnings.warn(f"{experiment}: importance not computed: {why}", ResultsWarning, stacklevel=2)
    for experiment in sorted({t.experiment for t in trials}):
        top = top_trials(trials, experiment)
        histories = metric_histories(client, [t.record.run_id for t in top], METRIC_DEV_ACCURACY)
        target = folder / file_stem(experiment)
        outputs.files += analysis_files(trials, importance, histories, experiment, target)
        parent = next((t.parent_run_id for t in top if t.parent_run_id), None)
        if parent:
            outputs.artifacts.append((parent, target, ARTIFACT_ANALYSIS_DIR))


def _render_table(
    client: MlflowClient, table: pa.Table, seeds: pa.Table | None, request: _Request
) -> str:
    """Compact view with baseline (and seed) rows for md/LaTeX, the wide numeric view for CSV."""
    from results.render import render, results_view, wide_view

    fmt = request.fmt
    if fmt == "csv":
        return render(wide_view(table), fmt)
    frame = results_view(table, seeds, _majority_baselines(client, table))
    if fmt != "latex":
        return render(frame, fmt)
    corpora = ", ".join(sorted({c for c in table.column("corpus").to_pylist() if c})) or "?"
    return render(
        frame,
        fmt,
        caption=request.caption or default_caption(corpora, request.per_seed),
        label=request.label or f"tab:{request.out.stem}",
    )


def default_caption(corpora: str, per_seed: bool) -> str:
    return (
        f"Accuracy (%) on {corpora}: for each model, the hyperparameters selected on dev (best "
        "mean dev accuracy over seeds), running train accuracy over the best dev epoch, dev and test "
        "accuracy as mean ± sample std over seeds and the 95% Student-t interval of the test "
        "mean; |θ|M counts trainable parameters without word embeddings; the majority-class row "
        "predicts the test set's most frequent class"
        + (", and each seed's own row follows its model" if per_seed else "")
        + "."
    )


def _majority_baselines(client: MlflowClient, table: pa.Table) -> dict[str, tuple[str, float]]:
    """corpus -> (majority class, its test share), from one selected run's predictions per
    corpus; corpora whose runs logged no predictions get no baseline row."""
    from results.predictions import majority_class, read_predictions
    from results.run_reader import download_predictions

    baselines: dict[str, tuple[str, float]] = {}
    rows = [r for r in table.to_pylist() if r["test_accuracy"] is not None and r["corpus"]]
    for row in rows:
        if row["corpus"] in baselines:
            continue
        with tempfile.TemporaryDirectory() as scratch:
            try:
                path = download_predictions(client, row["selected_run_id"], Path(scratch))
            except ResultsError:
                continue
            baselines[row["corpus"]] = majority_class(read_predictions(path))
    return baselines


def _evp_table(evp: Path | None) -> Path | None:
    return evp.with_suffix(".parquet") if evp is not None else None


def _option_of(path: Path, evp: Path | None) -> str:
    """The option that named an output file (for the error message if it cannot be written)."""
    if evp is not None and path.parent == evp.parent and path.name.startswith(evp.stem + "."):
        return "--evp"
    return "--out"


def _incomplete_sweeps(client: MlflowClient, experiments: list[Experiment]) -> dict[str, str]:
    """Experiment -> its sweeps that have not completed, described; each sweep's state and
    progress is shown on stderr (a warning for an incomplete one)."""
    from results.stored_sweeps import load_sweeps

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
    from results.compare import compare_predictions, resolve_row
    from results.run_reader import download_predictions

    rows = table.to_pandas()
    a, b = resolve_row(rows, first), resolve_row(rows, second)
    with tempfile.TemporaryDirectory() as scratch:
        paths = [
            download_predictions(client, row["selected_run_id"], Path(scratch) / name)
            for name, row in (("a", a), ("b", b))
        ]
        return compare_predictions(first, paths[0], second, paths[1])


def _write(outputs: _Outputs, client: MlflowClient | None = None) -> None:
    from results.atomic_files import write_output

    for path, content in outputs.files:
        write_output(path, content)
        click.echo(f"wrote {path}", err=True)
    for run_id, folder, artifact_path in outputs.artifacts:
        client.log_artifacts(run_id, str(folder), artifact_path)
        click.echo(f"logged {folder} to run {run_id} under {artifact_path}/", err=True)
    click.echo("\n".join(outputs.stdout), nl=False)


@click.command("report")
@click.argument("experiments", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for EXPERIMENT.html, EXPERIMENT.md and EXPERIMENT_files/.")
@click.option("--tracking-uri", default=None, help=TRACKING_URI_HELP)
def report_command(experiments: tuple[str, ...], out_dir: Path, tracking_uri: str | None) -> None:
    """A reproducibility report per EXPERIMENT: one self-contained HTML page (and Markdown) with
    provenance, data, the search, the selection protocol, results with confidence intervals,
    EVP, importance, learning curves, per-class accuracy, confusion matrices, McNemar and the
    ACL Rolling Review checklist answered from the record."""
    from mlflow.exceptions import MlflowException

    from results.report import report_files
    from results.run_reader import open_client, resolve_experiments

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResultsWarning)
        try:
            client = open_client(resolve_tracking_uri(tracking_uri))
            chosen = resolve_experiments(client, experiments)
            files = [f for e in chosen for f in report_files(client, e, out_dir)]
        except MlflowException as exc:
            raise click.ClickException(f"reading the tracking store failed: {exc}") from exc
    _echo_warnings(caught)
    _write(_Outputs(files=files))
