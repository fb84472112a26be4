"""`orchestrate`: train, validate and sweep NLI models; inspect models; fetch corpora; results."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from nli_models.errors import InputError, error_line, mask_secrets
from orchestrator.cli.cluster_commands import allocation_report, slurm_allocation_options
from orchestrator.cli.exits import EXIT_BAD_INPUT, EXIT_INTERRUPTED, fail
from orchestrator.cli.options import (
    DEFAULT_RAY_START_TIMEOUT_S,
    RAY_START_TIMEOUT_ENV,
    Seconds,
    make_overrides,
    override_options,
    tracking_uri_option,
)
from orchestrator.sweep.environment import WAIT_POLICY, configure_environment, wait_policy
from results.attention_command import attention_command
from results.results_commands import report_command, results_command

if TYPE_CHECKING:  # the driver loads Ray and MLflow: imported when `sweep` runs
    from orchestrator.sweep.driver import SweepRequest


def _versions() -> str:
    """Versions of this package and of the libraries a run depends on, read from the installed
    distributions' metadata (importing them would take seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    libraries = ", ".join(f"{name} {installed(name)}" for name in ("torch", "ray", "mlflow", "optuna"))
    return f"orchestrate (nli-orchestrator) {installed('nli-orchestrator')}; {libraries}"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_versions())
        ctx.exit()


class _Commands(click.Group):
    """The one place bad input becomes `error: MESSAGE` and exit 2, whichever command (or
    subcommand) raised it, with no traceback and with passwords in URIs masked; click's own
    errors (bad options, ClickException) get the same `error: ` style instead of its `Error: `,
    and an abort (Ctrl-C, end of input) says why instead of a bare `Aborted!`."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except InputError as exc:
            click.echo(error_line(str(exc)), err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except click.UsageError as exc:  # click's own (a bad option value): one line, as ours
            click.echo(_click_error_line(exc), err=True)
            ctx.exit(EXIT_BAD_INPUT)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        # The process defaults, once the command starts and before anything imports torch or Ray
        # (OMP_WAIT_POLICY is read when torch loads): every module this one imports is light,
        # `orchestrate --help` loads none of torch, Ray, MLflow (tests/test_cli_ux.py).
        configure_environment()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            click.echo(_click_error_line(exc), err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("error: interrupted (Ctrl-C or end of input); stopped", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _click_error_line(exc: click.ClickException) -> str:
    """Click's own error as one `error: COMMAND: message` line, in our style."""
    ctx = getattr(exc, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    return error_line(where + _lowercase_start(exc.format_message()))


def _lowercase_start(message: str) -> str:
    """'No such option' -> 'no such option'; 'MLflow ...' stays."""
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        return message[0].lower() + message[1:]
    return message


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="print the versions of nli-orchestrator, torch, Ray, MLflow and Optuna")
def main() -> None:
    """Hyperparameter sweeps for NLI models on Ray Tune, Optuna and MLflow."""


# -- models -----------------------------------------------------------------------------------
@main.command()
@click.option("--json", "as_json", is_flag=True, help="paper configurations with |θ|M as JSON")
def models(as_json: bool) -> None:
    """List registered models, their variants and the paper rows they reproduce."""
    from orchestrator.cli.model_catalog import render_catalog, shipped_catalog

    catalog = shipped_catalog()
    click.echo(json.dumps(catalog["papers"], indent=2) if as_json else render_catalog(catalog))


# -- train ------------------------------------------------------------------------------------
@main.command()
@click.argument("config_path", type=click.Path(dir_okay=False))
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="save a checkpoint after every epoch here")
@click.option("--resume", is_flag=True, help="continue from the checkpoint in --checkpoint-dir")
@click.option("--refit", "refit_epochs", type=click.IntRange(min=1), default=None,
              metavar="EPOCHS",
              help="a sweep's refit protocol: train on train + dev for EPOCHS epochs (layerwise: "
                   "EPOCHS / blocks per phase), no early stopping, test the final weights "
                   "(`orchestrate best` prints the EPOCHS of a refit sweep)")
@override_options
def train(config_path: str, checkpoint_dir: str | None, resume: bool, refit_epochs: int | None,
          assignments: tuple[str, ...], data_dir: str | None) -> None:
    """Train one configuration (the YAML format of a sweep, without the search block).

    Threads: training.num_threads, else one per CPU this process may use; printed. They spin
    while waiting (OMP_WAIT_POLICY=ACTIVE) when they are no more than those CPUs."""
    # Before torch loads, which reads the policy once (the config's module loads it).
    from nli_models.cpus import usable_cpus

    threads = _configured_threads(config_path, assignments) or usable_cpus()
    os.environ[WAIT_POLICY] = wait_policy(owns_cores=threads <= usable_cpus())
    from nli_models.config import ConfigError, load_run_config
    from nli_models.training import TrainingDiverged
    from nli_models.training.recipe import refit_and_report, train_and_test

    overrides = make_overrides(assignments, data_dir)
    try:
        config = load_run_config(config_path, overrides)
    except ConfigError as exc:
        fail(str(exc))
    if overrides:
        click.echo(f"overrides: {', '.join(overrides.describe())}")
    try:
        config.model.check()
    except ValueError as exc:
        fail(f"{config_path}: model: {exc}")
    if resume and not checkpoint_dir:
        fail("--resume needs --checkpoint-dir")
    if refit_epochs is not None and checkpoint_dir:
        fail("--refit trains from scratch and keeps no checkpoint; drop --checkpoint-dir")
    try:
        if refit_epochs is not None:
            refit_and_report(config, refit_epochs, echo=click.echo)
        else:
            train_and_test(config, checkpoint_dir=checkpoint_dir, resume=resume, echo=click.echo)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    except TrainingDiverged as exc:
        fail(f"{config_path}: {exc}; lower training.lr or set training.grad_clip", code=1)


def _configured_threads(config_path: str, assignments: tuple[str, ...]) -> int | None:
    """training.num_threads as the file and its --set give it, read without torch (None when
    unset or not readable: loading the config then says what is wrong)."""
    import yaml

    value = None
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError):
        value = (yaml.safe_load(Path(config_path).read_text()).get("training") or {}).get("num_threads")
    for assignment in assignments:
        key, _, text = assignment.partition("=")
        if key.strip() == "training.num_threads":
            with contextlib.suppress(yaml.YAMLError):
                value = yaml.safe_load(text)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# -- validate / sweep -------------------------------------------------------------------------
@main.command()
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option("--no-data", is_flag=True, help="skip reading the data (split sizes not shown)")
@click.option("--estimate", is_flag=True,
              help="time a probe of the first configuration and a pilot sweep (a minute or "
                   "more) and print the expected wall time of the whole sweep on this machine")
@override_options
@tracking_uri_option
@slurm_allocation_options
def validate(spec_path: str, no_data: bool, estimate: bool, assignments: tuple[str, ...],
             data_dir: str | None, tracking_uri: str | None, **slurm_allocation) -> None:
    """Validate a sweep spec and print the resolved plan; runs nothing (but the --estimate probe).

    Runs every check `sweep` runs before it writes anything (the data, the vectors and whether
    every configuration's model fits them; RAY_ADDRESS and the store answer; a trial fits this
    machine, or with --slurm-* the allocation), except --no-data's."""
    from nli_models.config import ConfigError
    from orchestrator.sweep.plan import (
        check_input,
        check_local_capacity,
        describe_gpu_fit,
        describe_plan,
    )
    from orchestrator.sweep.spec import load_spec

    if estimate and no_data:
        fail("--estimate trains on the data; drop --no-data")
    overrides = make_overrides(assignments, data_dir)
    try:
        spec = load_spec(spec_path, overrides, tracking_uri)
        # The checks `sweep` runs before its first write (with --no-data, those without data).
        data = None if no_data else check_input(spec)
        report = allocation_report(spec, **slurm_allocation)
        if report is None and not os.environ.get("RAY_ADDRESS"):
            check_local_capacity(spec)  # where `sweep` without --address runs its trials
        click.echo(describe_plan(spec, data))
        if data is not None and spec.search.resources.gpu > 0:
            click.echo(describe_gpu_fit(spec, data))
        if overrides:
            click.echo(f"  overrides: {', '.join(overrides.describe())}")
        if report:
            click.echo(report)
        if estimate:
            click.echo(_estimate(spec, spec_path, overrides, data))
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))


def _estimate(spec, spec_path, overrides, data) -> str:
    import torch

    from nli_models.cpus import usable_cpus
    from orchestrator.sweep.estimate import PilotFailed, estimate_sweep, record_estimate

    try:
        found = estimate_sweep(spec, spec_path, overrides, data, usable_cpus(), torch.cuda.device_count())
    except PilotFailed as exc:
        fail(str(exc), 1)
    record_estimate(spec, found)
    return found.describe(spec)


@main.command()
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True, help="continue the experiment's latest sweep")
@click.option("--new", is_flag=True, help="start another sweep in an experiment that has one")
@click.option("--warm-start", "warm_start", metavar="EXPERIMENT", default=None,
              help="seed the Optuna sampler with the finished trials of EXPERIMENT's latest sweep "
                   "(told to it, never run again, not counted in num_samples); a new sweep")
@click.option("--extend", is_flag=True,
              help="add the spec's new grid points or samples to the experiment's completed sweep "
                   "without running its finished configurations again")
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or local)")
@click.option("-v", "--verbose", count=True, help="show Ray's own output and trial tables")
@click.option("--wait-for-resources", "wait_s", type=Seconds(), default=None,
              envvar="NLI_RESOURCES_WAIT_S", metavar="SECONDS",
              help="when no node can hold a trial, ask the Ray autoscaler for one and wait this "
                   "long before giving up (default: 600 on an autoscaling cluster, else 0)")
@click.option("--ray-start-timeout", "ray_start_timeout_s", type=Seconds(positive=True), default=None,
              envvar=RAY_START_TIMEOUT_ENV, metavar="SECONDS",
              help=f"how long starting (or joining) Ray may take before the sweep gives up, "
                   f"writing nothing (default {DEFAULT_RAY_START_TIMEOUT_S:g}; a loaded machine "
                   "needs longer than Ray's own 30)")
@override_options
@tracking_uri_option
def sweep(spec_path: str, resume: bool, new: bool, warm_start: str | None, extend: bool,
          address: str | None, verbose: int, wait_s: float | None, ray_start_timeout_s: float | None,
          assignments: tuple[str, ...], data_dir: str | None, tracking_uri: str | None) -> None:
    """Run a hyperparameter sweep on Ray Tune, tracked in MLflow.

    Exit status: 0 completed; 1 completed with failed trials or with no trial finished
    (nothing selected), or a failure (Ray could not start: nothing written); 2 bad input (nothing written); 3 interrupted
    (SIGINT/SIGTERM, or a time budget that ran out before any trial ended; continue with
    --resume)."""
    from nli_models.errors import InputError
    from orchestrator.sweep.spec import load_spec

    chosen = [name for name, given in (("--resume", resume), ("--new", new), ("--extend", extend),
                                       ("--warm-start", warm_start is not None)) if given]
    if len(chosen) > 1:
        fail(f"{' and '.join(chosen)} exclude each other")
    if verbose:
        os.environ["MLFLOW_LOGGING_LEVEL"] = "INFO"  # before MLflow loads (environment.py: WARNING)
    overrides = make_overrides(assignments, data_dir)
    try:  # before MLflow, Ray Tune and pandas load: a bad spec is refused in half the time
        spec = load_spec(spec_path, overrides, tracking_uri)
    except (InputError, FileNotFoundError) as exc:
        fail(str(exc))

    from orchestrator.journal.parent_records import SweepExists
    from orchestrator.ray_adapter.ray_runtime import RayStartError
    from orchestrator.sweep.driver import SweepRequest, run_sweep
    from orchestrator.sweep.lifecycle import SweepInterrupted
    from orchestrator.sweep.progress import interrupted_line
    from orchestrator.tracking.tracker import TrackingUnavailable

    request = SweepRequest(Path(spec_path), resume=resume, new=new, verbose=verbose, address=address,
                           overrides=overrides, tracking_uri=tracking_uri, wait_for_resources_s=wait_s,
                           warm_start=warm_start, extend=extend, spec=spec,
                           ray_start_timeout_s=ray_start_timeout_s)
    try:
        summary = run_sweep(request)
    except (InputError, SweepExists, TrackingUnavailable, FileNotFoundError) as exc:
        fail(str(exc))
    except RayStartError as exc:
        fail(str(exc), code=1)
    except SweepInterrupted as exc:  # before the parent run existed
        fail(str(exc), code=EXIT_INTERRUPTED)
    if summary.interrupted:
        resume = _resume_command(spec_path, request)
        click.echo(interrupted_line(summary.done, summary.failed, summary.planned, resume), err=True)
        sys.exit(EXIT_INTERRUPTED)
    nothing_selected = summary.best_dev_accuracy is None  # every trial failed or diverged
    click.echo(
        f"sweep finished: {summary.trials} trial{'s' * (summary.trials != 1)} ({summary.failed} failed)"
        + (f", {summary.diverged} diverged (loss NaN/inf; never selected)" if summary.diverged
           else "")
        + "; "
        + ("no trial finished: nothing selected, no test evaluation" if nothing_selected else
           f"best dev accuracy {_percent(summary.best_dev_accuracy)}; test accuracy of the "
           f"selected configuration {_percent(summary.test_accuracy)}"
           + (f" (test evaluation {summary.test_evaluation})" if extend and summary.test_evaluation else ""))
        + f"; MLflow parent run {summary.parent_run_id}"
    )
    if summary.failed or nothing_selected:
        sys.exit(1)


def _resume_command(spec_path: str, request: SweepRequest) -> str:
    """`orchestrate sweep SPEC --resume` with the options this sweep was given on its command line
    (its overrides, store, cluster, waits), quoted for a shell, passwords masked. `request`: the
    sweep's SweepRequest; `spec_path` as the user wrote it."""
    from click.core import ParameterSource

    from orchestrator.ray_adapter.ray_jobs import override_arguments

    context = click.get_current_context()
    words = ["orchestrate", "sweep", spec_path, "--resume", *override_arguments(request.overrides)]
    for flag, value in (("--tracking-uri", request.tracking_uri), ("--address", request.address)):
        if value:
            words += [flag, value]
    for flag, name, seconds in (("--wait-for-resources", "wait_s", request.wait_for_resources_s),
                                ("--ray-start-timeout", "ray_start_timeout_s", request.ray_start_timeout_s)):
        if context.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            words += [flag, f"{seconds:g}"]
    return mask_secrets(shlex.join(words))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


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
        fail(str(exc), code=1)
    click.echo(str(path))


main.add_command(results_command, "results")
main.add_command(attention_command, "attention")
main.add_command(report_command, "report")

from orchestrator.cli.cluster_commands import CLUSTER_COMMANDS  # noqa: E402
from orchestrator.cli.replay_commands import replay_command  # noqa: E402
from orchestrator.cli.specs_commands import specs  # noqa: E402
from orchestrator.cli.sweeps_commands import SWEEP_COMMANDS  # noqa: E402
from orchestrator.cli.ui_command import ui  # noqa: E402

for command in (*CLUSTER_COMMANDS, *SWEEP_COMMANDS, replay_command, specs, ui):
    main.add_command(command)

if __name__ == "__main__":
    main()
