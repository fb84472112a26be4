"""What the cluster commands share: the Ray address option's help and the ClusterError -> exit code
rule (a ClusterError's message and exit code, through orchestrator.cli.exits.fail)."""

from __future__ import annotations

from orchestrator.cli.exits import fail

ADDRESS_HELP = "Ray dashboard of the head node (default: RAY_ADDRESS or http://127.0.0.1:8265)"


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
