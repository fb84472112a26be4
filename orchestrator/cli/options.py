"""Options shared by several `orchestrate` commands. Imports nothing heavy: `--help` of every
command must not load torch, Ray or MLflow."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import click

from results.tracking_uri import TRACKING_URI_HELP

# Seconds of warning a SLURM job asks for before its time limit (orchestrator.cluster.slurm); here so
# that `--help` shows it without importing the SLURM and Ray job modules.
DEFAULT_SIGNAL_BEFORE_S = 180
# `sweep --ray-start-timeout`: how long starting or joining Ray may take. Ray's own start gives its
# raylet a fixed 30 s to register (ray/_private/node.py): on a loaded machine that ran out ("The
# current node timed out during startup"), and whole starts took up to 268 s (issue 44).
RAY_START_TIMEOUT_ENV = "NLI_RAY_START_TIMEOUT_S"
DEFAULT_RAY_START_TIMEOUT_S = 300.0
# `submit --slurm --requeue --max-requeues N`: each requeue is a whole allocation; a chain longer
# than this is a sweep that needs a longer --time, not more requeues.
MAX_REQUEUES_LIMIT = 20

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


class Seconds(click.ParamType):
    """A finite number of seconds, >= 0 (or > 0 with `positive`): click's FloatRange lets `nan`
    and `inf` through (both compare false with its bounds)."""

    name = "seconds"

    def __init__(self, positive: bool = False):
        self.positive = positive

    def convert(self, value, param, ctx):
        allowed = "a finite number of seconds " + ("> 0" if self.positive else ">= 0")
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number; expected {allowed}", param, ctx)
        if not math.isfinite(seconds) or seconds < 0 or (self.positive and seconds == 0):
            self.fail(f"{value!r}: expected {allowed}", param, ctx)
        return seconds
