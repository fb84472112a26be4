"""How an `orchestrate` command ends when it does not succeed: its exit codes and the one way to
fail with a message (`error: MESSAGE` on stderr, secrets masked)."""

from __future__ import annotations

import sys

import click

from nli_models.errors import error_line

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 3


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """End the command with `error: MESSAGE` on stderr.

    Args:
        message: what went wrong (secrets in it are masked).
        code: the exit code: EXIT_BAD_INPUT by default, 1 for a cluster, server or store that failed.
    """
    click.echo(error_line(message), err=True)
    sys.exit(code)
