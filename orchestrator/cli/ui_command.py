"""`orchestrate ui`: MLflow's UI on the configured store, on 127.0.0.1 (its server:
orchestrator/tracking/ui_server.py), and the links to each sweep's trials view."""

from __future__ import annotations

import os

import click

from nli_models.errors import mask_secrets
from orchestrator.cli.exits import fail
from orchestrator.cli.options import tracking_uri_option


def _port_in_use(port: int) -> OSError | None:
    """Why 127.0.0.1:PORT cannot be listened on (another server holds it), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As servers do: a port left in TIME_WAIT by a server that just quit counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc
    return None


@click.command()
@tracking_uri_option
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535))
@click.option("-v", "--verbose", is_flag=True, help="show MLflow's and uvicorn's own log lines")
def ui(tracking_uri: str | None, port: int, verbose: bool) -> None:
    """Start the MLflow UI on the configured store, on 127.0.0.1.

    Its home page opens experiments on their runs table; /sweeps lists every sweep's trials."""
    from results.tracking_uri import (
        check_tracking_uri,
        missing_store,
        resolve_tracking_uri,
        unreachable_store,
    )

    uri = resolve_tracking_uri(tracking_uri)
    check_tracking_uri(uri)
    missing = missing_store(uri)
    if missing is not None:
        fail(missing)
    unreachable = unreachable_store(uri)
    if unreachable is not None:
        fail(f"MLflow tracking store {mask_secrets(uri)} is unreachable: "
              f"{mask_secrets(unreachable)}")
    busy = _port_in_use(port)
    if busy is not None:
        fail(f"port {port} on 127.0.0.1 is not free ({busy.strerror}): another server (an "
              f"MLflow UI?) uses it; pick another with --port", code=1)
    if verbose:
        os.environ["MLFLOW_LOGGING_LEVEL"] = "INFO"  # before MLflow loads (environment.py: WARNING)
    from orchestrator.tracking.ui_server import SWEEPS_PAGE, serve

    root = f"http://127.0.0.1:{port}"
    click.echo(f"MLflow UI for {mask_secrets(uri)} at {root}/ (Ctrl-C stops it)\n"
               f"  every sweep's trials: {root}{SWEEPS_PAGE}")
    _echo_sweep_links(uri, root)
    serve(uri, port, verbose)


def _echo_sweep_links(tracking_uri: str, base_url: str) -> None:
    """Each swept experiment's trials view (table and parallel-coordinates chart)."""
    from orchestrator.tracking.run_view import runs_view_path, ui_link
    from orchestrator.tracking.tracker import sweep_views

    try:
        views = sweep_views(tracking_uri)
    except Exception as exc:  # the UI still starts; it shows the same store's error
        click.echo(f"(could not list the sweeps' views: {exc})", err=True)
        return
    for name, experiment_id in views.items():
        table = ui_link(base_url, runs_view_path(experiment_id))
        chart = ui_link(base_url, runs_view_path(experiment_id, charts=True))
        click.echo(f"  {name}: trials {table}\n  {' ' * len(name)}  chart  {chart}")


# -- data -------------------------------------------------------------------------------------
