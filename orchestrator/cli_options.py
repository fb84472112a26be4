"""Options shared by several `orchestrate` commands. Imports nothing heavy: `--help` of every
command must not load torch, Ray or MLflow."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from results.tracking_uri import TRACKING_URI_HELP

# Seconds of warning a SLURM job asks for before its time limit (orchestrator.slurm); here so
# that `--help` shows it without importing the SLURM and Ray job modules.
DEFAULT_SIGNAL_BEFORE_S = 180

if TYPE_CHECKING:
    from nli_models.config import Overrides


def override_options(function):
    """`--set dotted.key=value` (repeatable) and `--data-dir DIR`, passed on as `overrides`."""
    function = click.option(
        "--data-dir", type=click.Path(file_okay=False), default=None,
        help="folder holding the corpus (sets data.data_dir)",
    )(function)
    function = click.option(
        "--set", "assignments", multiple=True, metavar="KEY=VALUE",
        help="override one key of the YAML, e.g. --set training.lr=0.01 or "
             "--set search.space.lr.grid=[1.0e-3,3.0e-3]; values are YAML (repeatable; "
             "validated like the file, recorded with the run)",
    )(function)
    return function


def make_overrides(assignments: tuple[str, ...], data_dir: str | None) -> Overrides:
    from nli_models.config import Overrides

    return Overrides(tuple(assignments), data_dir)


def tracking_uri_option(function):
    return click.option("--tracking-uri", default=None, help=TRACKING_URI_HELP)(function)
