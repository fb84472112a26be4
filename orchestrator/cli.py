"""`orchestrate`: train, validate and sweep NLI models; inspect models; fetch corpora; results."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from orchestrator.cluster_cli import allocation_report, slurm_allocation_options
from orchestrator.environment import configure_environment
from results.cli import attention_command, results_command

configure_environment()

EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Hyperparameter sweeps for NLI models on Ray Tune, Optuna and MLflow."""


# -- models -----------------------------------------------------------------------------------
@main.command()
@click.option("--json", "as_json", is_flag=True, help="paper configurations with |θ|M as JSON")
def models(as_json: bool) -> None:
    """List registered models, their variants and the paper rows they reproduce."""
    from orchestrator.model_catalog import catalog, render_catalog

    rows = catalog()
    click.echo(json.dumps(rows, indent=2) if as_json else render_catalog(rows))


# -- train ------------------------------------------------------------------------------------
@main.command()
@click.argument("config_path", type=click.Path(dir_okay=False))
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="save a checkpoint after every epoch here")
@click.option("--resume", is_flag=True, help="continue from the checkpoint in --checkpoint-dir")
def train(config_path: str, checkpoint_dir: str | None, resume: bool) -> None:
    """Train one configuration (the YAML format of a sweep, without the search block)."""
    from nli_models.config import ConfigError, load_run_config
    from nli_models.training.recipe import train_and_test

    try:
        config = load_run_config(config_path)
    except ConfigError as exc:
        _fail(str(exc))
    try:
        config.model.check()
    except ValueError as exc:
        _fail(f"{config_path}: model: {exc}")
    if resume and not checkpoint_dir:
        _fail("--resume needs --checkpoint-dir")
    try:
        train_and_test(config, checkpoint_dir=checkpoint_dir, resume=resume, echo=click.echo)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))


# -- validate / sweep -------------------------------------------------------------------------
@main.command()
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option("--no-data", is_flag=True, help="skip reading the data (split sizes not shown)")
@slurm_allocation_options
def validate(spec_path: str, no_data: bool, **slurm_allocation) -> None:
    """Validate a sweep spec and print the resolved plan; runs nothing."""
    from nli_models.config import ConfigError
    from orchestrator.plan import describe_plan
    from orchestrator.spec import load_spec

    try:
        spec = load_spec(spec_path)
        click.echo(describe_plan(spec, read_data=not no_data))
        report = allocation_report(spec, **slurm_allocation)
        if report:
            click.echo(report)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        _fail(str(exc))


@main.command()
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True, help="continue the experiment's latest sweep")
@click.option("--new", is_flag=True, help="start another sweep in an experiment that has one")
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or local)")
@click.option("-v", "--verbose", count=True, help="show Ray's own output and trial tables")
def sweep(spec_path: str, resume: bool, new: bool, address: str | None, verbose: int) -> None:
    """Run a hyperparameter sweep on Ray Tune, tracked in MLflow."""
    from nli_models.config import ConfigError
    from orchestrator.sweep import SweepExists, run_sweep
    from orchestrator.tracking import TrackingUnavailable

    if resume and new:
        _fail("--resume and --new exclude each other")
    try:
        summary = run_sweep(spec_path, resume=resume, new=new, verbose=verbose, address=address)
    except (ConfigError, SweepExists, TrackingUnavailable, FileNotFoundError) as exc:
        _fail(str(exc))
    if summary.interrupted:
        _fail(
            f"the sweep stopped before every trial ended ({summary.trials} trials known); "
            f"continue it with `orchestrate sweep {spec_path} --resume`",
            code=1,
        )
    click.echo(
        f"sweep finished: {summary.trials} trials ({summary.failed} failed); "
        f"best dev accuracy {summary.best_dev_accuracy}; test accuracy of the selected "
        f"configuration {summary.test_accuracy}; MLflow parent run {summary.parent_run_id}"
    )
    if summary.failed:
        sys.exit(1)


# -- MLflow UI --------------------------------------------------------------------------------
@main.command()
@click.option("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI or sqlite:///mlruns.db")
@click.option("--port", default=5000, show_default=True)
def ui(tracking_uri: str | None, port: int) -> None:
    """Start the MLflow UI on the configured store, on 127.0.0.1."""
    from orchestrator.spec import DEFAULT_TRACKING_URI

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    click.echo(f"MLflow UI for {uri} at http://127.0.0.1:{port} (Ctrl-C stops it)")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    os.execve(mlflow, [mlflow, "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                       "--port", str(port), "--workers", "1"], env)


# -- data -------------------------------------------------------------------------------------
@main.group()
def data() -> None:
    """Fetch official corpus releases."""


@data.command("download")
@click.argument("corpus", type=click.Choice(["snli", "multinli", "sick", "scitail"]))
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="cache folder (default: $NLI_DATA_DIR or ~/.cache/nli-orchestrator)")
def data_download(corpus: str, data_dir: str | None) -> None:
    """Download, verify and unpack an official corpus release."""
    from nli_models.data.download import DownloadError, download_corpus

    try:
        path = download_corpus(corpus, data_dir=data_dir)
    except DownloadError as exc:
        _fail(str(exc), code=1)
    click.echo(str(path))


main.add_command(results_command, "results")
main.add_command(attention_command, "attention")

from orchestrator.cluster_cli import CLUSTER_COMMANDS  # noqa: E402

for command in CLUSTER_COMMANDS:
    main.add_command(command)

if __name__ == "__main__":
    main()
