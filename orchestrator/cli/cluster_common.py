"""What the cluster commands share: the Ray address option's help, one way to fail with a message
and an exit code, and the ClusterError -> exit code rule."""

from __future__ import annotations

import sys

import click

from nli_models.errors import error_line

ADDRESS_HELP = "Ray dashboard of the head node (default: RAY_ADDRESS or http://127.0.0.1:8265)"


def fail(message: str, code: int) -> None:
    click.echo(error_line(message), err=True)
    sys.exit(code)


def ray_jobs_client(address: str | None):
    """The Ray Jobs client of the head at `address` (a ClusterError becomes its message and exit code)."""
    from orchestrator.ray_adapter.ray_jobs import ClusterError, Jobs

    try:
        return Jobs(address)
    except ClusterError as exc:
        fail(str(exc), exc.exit_code)


def cluster_errors(function):
    """Turn a ClusterError raised by the command into its message and exit code."""
    import functools

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        from orchestrator.ray_adapter.ray_jobs import ClusterError

        try:
            return function(*args, **kwargs)
        except ClusterError as exc:
            fail(str(exc), exc.exit_code)

    return wrapper
