"""Cluster commands of `orchestrate`: submit, jobs, logs, stop (Ray jobs), server (MLflow
tracking server) and sync (upload what a sweep spooled while its server was away).

Exit codes: 0 done, 1 the cluster / server / job failed or is unreachable, 2 bad input.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import click

from nli_models.errors import mask_secrets
from orchestrator.cli_options import make_overrides, override_options

ADDRESS_HELP = "Ray dashboard of the head node (default: RAY_ADDRESS or http://127.0.0.1:8265)"


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _jobs(address: str | None):
    from orchestrator.ray_jobs import ClusterError, Jobs

    try:
        return Jobs(address)
    except ClusterError as exc:
        _fail(str(exc), exc.exit_code)


def _cluster_errors(function):
    """Turn a ClusterError raised by the command into its message and exit code."""
    import functools

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        from orchestrator.ray_jobs import ClusterError

        try:
            return function(*args, **kwargs)
        except ClusterError as exc:
            _fail(str(exc), exc.exit_code)

    return wrapper


def _time(ms: int | None) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


# -- submit -----------------------------------------------------------------------------------
@click.command("submit")
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option("--address", default=None, help=ADDRESS_HELP)
@click.option("--tracking-uri", default=None,
              help="MLflow server the sweep logs to, e.g. http://HEAD:5000 (default: "
                   "search.tracking_uri or MLFLOW_TRACKING_URI)")
@click.option("--resume", is_flag=True, help="continue the experiment's latest sweep")
@click.option("--new", is_flag=True, help="start another sweep in an experiment that has one")
@click.option("--working-dir", type=click.Path(file_okay=False), default=None,
              help="folder shipped with the job (default: the current folder when it is a "
                   "project (pyproject.toml) holding the spec, else the spec's folder)")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="environment variable of the job's driver and trials (repeatable)")
@click.option("--job-id", default=None, help="submission id (default: SPECNAME-DATE-TIME-XXXXXX)")
@click.option("--follow", is_flag=True, help="stream the job's logs until it ends")
@override_options
@_cluster_errors
def submit_command(spec_path, address, tracking_uri, resume, new, working_dir, env, job_id, follow,
                   assignments, data_dir):
    """Submit a sweep to a Ray cluster as a Ray job (`orchestrate sweep SPEC` on the head;
    --set and --data-dir are checked here and passed on; --data-dir names a folder there)."""
    from orchestrator.ray_jobs import build_submission, resolve_address

    address = resolve_address(address)
    submission = build_submission(
        spec_path, tracking_uri=tracking_uri, resume=resume, new=new,
        working_dir=working_dir, env=env, submission_id=job_id,
        overrides=make_overrides(assignments, data_dir),
    )
    for warning in submission.warnings:
        click.echo(f"warning: {warning}", err=True)
    jobs = _jobs(address)
    job = jobs.submit(submission)
    click.echo(job)
    click.echo(
        f"submitted sweep {submission.spec_name!r} to {address} as job {job} "
        f"(working dir {submission.runtime_env['working_dir']}; MLflow {mask_secrets(submission.tracking_uri)})\n"
        f"  follow:  orchestrate logs {job} --address {address} --follow\n"
        f"  status:  orchestrate jobs --address {address}\n"
        f"  stop:    orchestrate stop {job} --address {address}\n"
        f"  dashboard: {address}/#/jobs",
        err=True,
    )
    if follow:
        status = jobs.follow(job, lambda text: click.echo(text, nl=False))
        click.echo(f"job {job}: {status}", err=True)
        if status != "SUCCEEDED":
            sys.exit(1)


# -- jobs / logs / stop -----------------------------------------------------------------------
@click.command("jobs")
@click.option("--address", default=None, help=ADDRESS_HELP)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per job")
@_cluster_errors
def jobs_command(address, as_json):
    """List the cluster's jobs, oldest first."""
    jobs = _jobs(address)
    listed = jobs.list()
    if as_json:
        for job in listed:
            click.echo(json.dumps({
                "job_id": job.submission_id or job.job_id,
                "status": job.status.value,
                "start_time": job.start_time,
                "end_time": job.end_time,
                "entrypoint": job.entrypoint,
                "metadata": job.metadata or {},
                "message": job.message,
            }))
        return
    if not listed:
        click.echo(f"no jobs on {jobs.address}")
        return
    rows = [("JOB", "STATUS", "STARTED", "ENDED", "SPEC")]
    for job in listed:
        spec = (job.metadata or {}).get("nli.spec") or job.entrypoint
        rows.append((job.submission_id or job.job_id or "-", job.status.value,
                     _time(job.start_time), _time(job.end_time), spec))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@click.command("logs")
@click.argument("job_id")
@click.option("--address", default=None, help=ADDRESS_HELP)
@click.option("-f", "--follow", is_flag=True, help="stream new output until the job ends")
@_cluster_errors
def logs_command(job_id, address, follow):
    """Print a job's output (its driver's stdout and stderr)."""
    jobs = _jobs(address)
    if not follow:
        click.echo(jobs.logs(job_id), nl=False)
        return
    status = jobs.follow(job_id, lambda text: click.echo(text, nl=False))
    click.echo(f"job {job_id}: {status}", err=True)
    if status != "SUCCEEDED":
        sys.exit(1)


@click.command("stop")
@click.argument("job_id")
@click.option("--address", default=None, help=ADDRESS_HELP)
@_cluster_errors
def stop_command(job_id, address):
    """Stop a running job (its trials stop; resume the sweep later with submit --resume)."""
    jobs = _jobs(address)
    was_running, status = jobs.stop(job_id)
    if was_running:
        click.echo(f"job {job_id}: stop requested; now {status}")
    else:
        click.echo(f"job {job_id} was not running ({status})")


# -- MLflow tracking server -------------------------------------------------------------------
@click.command("server")
@click.option("--backend-store-uri", envvar="MLFLOW_BACKEND_STORE_URI", required=True,
              help="database of runs and metrics, e.g. postgresql://mlflow@127.0.0.1:5432/mlflow "
                   "(or MLFLOW_BACKEND_STORE_URI)")
@click.option("--artifacts-destination", default="mlartifacts", show_default=True,
              help="where the server stores artifacts: a folder on shared storage or s3://...")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="interface to listen on (0.0.0.0: reachable from the cluster's nodes)")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option("--allowed-hosts", default=None,
              help="Host headers MLflow accepts (default: localhost and private IPs)")
@click.option("--basic-auth", is_flag=True,
              help="require a username and password (MLflow's basic-auth app); the admin is "
                   "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from the environment")
def server_command(backend_store_uri, artifacts_destination, host, port, workers, allowed_hosts,
                   basic_auth):
    """Run the MLflow tracking server that sweeps log to (--tracking-uri http://HOST:PORT)."""
    import tempfile

    from orchestrator import tracking_server as ts

    try:
        ts.check_backend(backend_store_uri)
        artifacts = ts.artifacts_location(artifacts_destination)
        auth = None
        if basic_auth:
            # A private folder for the auth app's ini file, which the server reads after exec.
            auth = ts.basic_auth_settings(backend_store_uri, Path(tempfile.mkdtemp(prefix="nli-auth-")))
        argv, env = ts.server_command(
            backend_store_uri, artifacts, host, port, workers, allowed_hosts, auth
        )
    except ts.ServerError as exc:
        _fail(str(exc), exc.exit_code)
    click.echo(
        f"MLflow tracking server on {ts.mask_uri(backend_store_uri)} at "
        f"{ts.tracking_url(host, port)} (artifacts: {artifacts}); sweeps: "
        f"--tracking-uri http://HOST:{port}. Ctrl-C stops it.",
        err=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)


# -- sync -------------------------------------------------------------------------------------
@click.command("sync")
@click.argument("spool_file", type=click.Path(dir_okay=False))
@click.option("--tracking-uri", default=None,
              help="MLflow server to upload to (default: MLFLOW_TRACKING_URI)")
def sync_command(spool_file, tracking_uri):
    """Upload what a sweep recorded to its spool file while the tracking server was away."""
    from orchestrator.tracking import TrackingUnavailable, replay_spool
    from results.tracking_uri import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri, default=None)
    if not uri:
        _fail("pass --tracking-uri (the sweep's MLflow server) or set MLFLOW_TRACKING_URI", 2)
    path = Path(spool_file)
    if not path.is_file():
        _fail(f"spool file {spool_file} not found", 2)
    try:
        sent = replay_spool(path, uri)
    except TrackingUnavailable as exc:
        _fail(str(exc), 1)
    except (ValueError, KeyError) as exc:
        _fail(f"{spool_file}: {exc}", 2)
    except Exception as exc:  # the server refused an operation part-way
        _fail(f"uploading {spool_file} to {uri} failed: {exc}; fix and run sync again", 1)
    click.echo(f"uploaded {sent} operations from {spool_file} to {uri}; the file can be deleted")


CLUSTER_COMMANDS = [
    submit_command,
    jobs_command,
    logs_command,
    stop_command,
    server_command,
    sync_command,
]
