"""Cluster commands of `orchestrate`: submit (Ray jobs, SLURM), server (MLflow tracking server) and
sync (upload a sweep's tracking journal); jobs, logs and stop are in orchestrator/cli/jobs_commands.py.

Exit codes: 0 done, 1 the cluster / server / job failed or is unreachable, 2 bad input.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

from nli_models.errors import mask_secrets
from orchestrator.cli.cluster_common import ADDRESS_HELP, cluster_errors, ray_jobs_client
from orchestrator.cli.exits import fail
from orchestrator.cli.jobs_commands import jobs_command, logs_command, stop_command
from orchestrator.cli.options import (
    DEFAULT_SIGNAL_BEFORE_S,
    MAX_REQUEUES_LIMIT,
    make_overrides,
    override_options,
)

# -- submit --slurm ---------------------------------------------------------------------------
SLURM_SUBMIT_OPTIONS = [
    click.option("--slurm", is_flag=True,
                 help="submit to SLURM (sbatch): a batch job that starts Ray on its allocation"),
    click.option("--nodes", type=click.IntRange(1), default=None,
                 help="[--slurm] nodes of the allocation (default 1)"),
    click.option("--cpus-per-task", type=click.IntRange(1), default=None,
                 help="[--slurm] CPUs per node for its trials (default: enough for "
                      "search.max_concurrent_trials)"),
    click.option("--gpus-per-node", type=click.IntRange(0), default=None,
                 help="[--slurm] GPUs per node (trials share them: search.resources.gpu 0.25 = 4 "
                      "per GPU)"),
    click.option("--partition", default=None, help="[--slurm] sbatch --partition"),
    click.option("--time", "time_limit", default=None,
                 help="[--slurm] time limit, as sbatch --time takes it (e.g. 4:00:00)"),
    click.option("--account", default=None, help="[--slurm] sbatch --account"),
    click.option("--qos", default=None, help="[--slurm] sbatch --qos"),
    click.option("--sbatch", "sbatch_lines", multiple=True, metavar="OPTION",
                 help="[--slurm] another #SBATCH option, e.g. --sbatch=--mem=32G (repeatable)"),
    click.option("--setup", "setup_lines", multiple=True, metavar="LINE",
                 help="[--slurm] a shell line the job runs before Ray starts, e.g. "
                      "--setup 'module load cuda/12' (repeatable)"),
    click.option("--requeue", is_flag=True,
                 help="[--slurm] at the time-limit warning, stop the sweep cleanly, requeue the "
                      "job and resume, until the sweep completes"),
    click.option("--max-requeues", type=click.IntRange(0, MAX_REQUEUES_LIMIT), default=None,
                 help=f"[--slurm] with --requeue: requeue at most this many times (0 to "
                      f"{MAX_REQUEUES_LIMIT}, default 3); never after an allocation that finished "
                      "no trial"),
    click.option("--signal-before", type=click.IntRange(1), default=None,
                 help=f"[--slurm] seconds before the time limit that the sweep is told to stop "
                      f"(default {DEFAULT_SIGNAL_BEFORE_S}; it needs time to stop its trials)"),
    click.option("--log-dir", type=click.Path(file_okay=False), default=None,
                 help="[--slurm] folder of the job's output JOBNAME-JOBID.out (default: here)"),
    click.option("--job-name", default=None, help="[--slurm] default: nli-SPECNAME"),
    click.option("--dry-run", is_flag=True, help="[--slurm] print the batch script; submit nothing"),
]


def slurm_submit_options(function):
    for option in reversed(SLURM_SUBMIT_OPTIONS):
        function = option(function)
    return function


def _refuse_slurm_options(options: dict) -> None:
    from orchestrator.ray_adapter.ray_jobs import JobInputError

    given = [name for name, value in options.items() if value not in (None, False, ())]
    if given:
        flags = ", ".join("--" + name.replace("_lines", "").replace("time_limit", "time").replace("_", "-")
                          for name in given)
        raise JobInputError(f"{flags}: SLURM options; add --slurm (or drop them for a Ray job)")


def submit_to_slurm(spec_path, tracking_uri, resume, new, env, ray_only, overrides, *, nodes, cpus_per_task,
                    gpus_per_node, partition, time_limit, account, qos, sbatch_lines, setup_lines,
                    requeue, max_requeues, signal_before, log_dir, job_name, dry_run) -> None:
    """`submit --slurm`: render the batch script, sbatch it, record the job."""
    from orchestrator.cluster import slurm, slurm_jobs, slurm_script
    from orchestrator.sweep.spec import load_spec

    given = [flag for flag, value in ray_only.items() if value]
    if given:
        raise slurm.SlurmInputError(f"{', '.join(given)}: Ray Jobs options; not with --slurm")
    if max_requeues is not None and not requeue:
        raise slurm.SlurmInputError(f"--max-requeues {max_requeues}: only with --requeue (without "
                                    "it the job is never requeued); add --requeue or drop it")
    nodes = nodes or 1
    if cpus_per_task is None and Path(spec_path).is_file():
        try:
            cpus_per_task = slurm.default_cpus_per_task(load_spec(spec_path, overrides), nodes)
        except ValueError:
            pass  # build_batch_job reports the spec's error
    options = slurm.SlurmOptions(
        allocation=slurm.Allocation(nodes, cpus_per_task or 1, gpus_per_node or 0),
        partition=partition, time_limit=time_limit, account=account, qos=qos,
        extra=list(sbatch_lines), requeue=requeue,
        max_requeues=slurm.DEFAULT_MAX_REQUEUES if max_requeues is None else max_requeues,
        signal_before_s=signal_before or DEFAULT_SIGNAL_BEFORE_S,
        log_dir=log_dir or ".", job_name=job_name, setup=list(setup_lines),
    )
    job = slurm_script.build_batch_job(spec_path, options, tracking_uri=tracking_uri, resume=resume,
                                new=new, env=env, overrides=overrides)
    for warning in job.warnings:
        click.echo(f"warning: {warning}", err=True)
    refusal = slurm.host_header_refusal(job.tracking_uri)
    if dry_run:  # what would be submitted, its passwords masked (the job gets them)
        click.echo(mask_secrets(job.script), nl=False)
        click.echo(f"(dry run: nothing submitted; {options.allocation.describe()} runs {job.at_once})",
                   err=True)
        if refusal:
            fail(refusal, 1)
        from results.tracking_uri import unreachable_store

        away = unreachable_store(job.tracking_uri)
        if away:  # it may be started later, before the submission
            click.echo(f"warning: tracking server {mask_secrets(job.tracking_uri)} does not answer "
                       f"({away}); submit checks it again", err=True)
        return
    if refusal:
        fail(f"{refusal}. Nothing was submitted.", 1)
    from orchestrator.tracking.tracker import Tracker, TrackingUnavailable

    try:  # a typo in the server's address is found here, not after the job waited in the queue
        Tracker(job.tracking_uri).check_reachable()
    except TrackingUnavailable as exc:
        fail(f"{exc} Nothing was submitted.", 1)
    job_id = slurm_jobs.sbatch(job)
    entry = slurm_jobs.record(job, job_id)
    click.echo(job_id)
    click.echo(
        f"submitted sweep {job.spec_name!r} to SLURM as job {job_id} ({options.allocation.describe()}: "
        f"{job.at_once}; MLflow {mask_secrets(job.tracking_uri)})\n"
        f"  output:  {entry.output}\n"
        f"  follow:  orchestrate logs {job_id} --follow\n"
        f"  status:  orchestrate jobs\n"
        f"  stop:    orchestrate stop {job_id}   (resume: submit --slurm --resume)",
        err=True,
    )


def slurm_allocation_options(function):
    """`validate --slurm-nodes N ...`: how many trials run at once on that allocation."""
    for option in reversed([
        click.option("--slurm-nodes", type=click.IntRange(1), default=None,
                     help="report the trials that run at once on this many SLURM nodes"),
        click.option("--slurm-cpus-per-task", type=click.IntRange(1), default=None,
                     help="... with this many CPUs per node (default as submit --slurm)"),
        click.option("--slurm-gpus-per-node", type=click.IntRange(0), default=None,
                     help="... and this many GPUs per node"),
    ]):
        function = option(function)
    return function


def allocation_report(spec, slurm_nodes, slurm_cpus_per_task, slurm_gpus_per_node) -> str | None:
    if slurm_nodes is None and slurm_cpus_per_task is None and slurm_gpus_per_node is None:
        return None
    from orchestrator.cluster import slurm

    nodes = slurm_nodes or 1
    allocation = slurm.Allocation(
        nodes, slurm_cpus_per_task or slurm.default_cpus_per_task(spec, nodes), slurm_gpus_per_node or 0
    )
    return slurm.allocation_report(spec, allocation)


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
@slurm_submit_options
@cluster_errors
def submit_command(spec_path, address, tracking_uri, resume, new, working_dir, env, job_id, follow,
                   assignments, data_dir, **slurm_options):
    """Submit a sweep to a Ray cluster as a Ray job (`orchestrate sweep SPEC` on the head), or
    with --slurm to SLURM as a batch job that starts its own Ray cluster (--set and --data-dir
    are checked here and passed on; --data-dir names a folder there)."""
    from orchestrator.ray_adapter.ray_jobs import build_submission, resolve_address

    ray_only = {"--address": address, "--working-dir": working_dir, "--job-id": job_id,
                "--follow": follow}
    if slurm_options.pop("slurm"):
        submit_to_slurm(spec_path, tracking_uri, resume, new, env, ray_only,
                        make_overrides(assignments, data_dir), **slurm_options)
        return
    _refuse_slurm_options(slurm_options)
    address = resolve_address(address)
    submission = build_submission(
        spec_path, tracking_uri=tracking_uri, resume=resume, new=new,
        working_dir=working_dir, env=env, submission_id=job_id,
        overrides=make_overrides(assignments, data_dir),
    )
    for warning in submission.warnings:
        click.echo(f"warning: {warning}", err=True)
    jobs = ray_jobs_client(address)
    job = jobs.submit(submission)
    click.echo(job)
    click.echo(mask_secrets(
        f"submitted sweep {submission.spec_name!r} to {address} as job {job} "
        f"(working dir {submission.runtime_env['working_dir']}; MLflow {submission.tracking_uri})\n"
        f"  follow:  orchestrate logs {job} --address {address} --follow\n"
        f"  status:  orchestrate jobs --address {address}\n"
        f"  stop:    orchestrate stop {job} --address {address}\n"
        f"  dashboard: {address}/#/jobs"),
        err=True,
    )
    if follow:
        status = jobs.follow(job, lambda text: click.echo(text, nl=False))
        click.echo(f"job {job}: {status}", err=True)
        if status != "SUCCEEDED":
            sys.exit(1)


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
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="server processes; each may open up to 80 database connections "
                   "(MLFLOW_SQLALCHEMYSTORE_POOL_SIZE / _MAX_OVERFLOW, 40 + 40)")
@click.option("--allowed-hosts", default=None,
              help="more host names clients may address the server by, comma-separated "
                   "(always: this machine's names, localhost and private IPs; * for any)")
@click.option("--basic-auth", is_flag=True,
              help="require a username and password (MLflow's basic-auth app); the admin is "
                   "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from the environment")
@click.option("--no-auth", is_flag=True,
              help="allow a --host other than loopback without --basic-auth (warns)")
def server_command(backend_store_uri, artifacts_destination, host, port, workers, allowed_hosts,
                   basic_auth, no_auth):
    """Run the MLflow tracking server that sweeps log to (--tracking-uri http://HOST:PORT).

    A --host other machines can reach needs --basic-auth, or --no-auth to run it open."""
    import tempfile

    from orchestrator.cluster import tracking_server as ts

    scratch = None
    try:
        warning = ts.check_exposure(host, basic_auth, no_auth)
        ts.check_backend(backend_store_uri)
        artifacts = ts.artifacts_location(artifacts_destination)
        auth = None
        if basic_auth:
            # A private folder for the auth app's ini file, which the server reads as it starts.
            scratch = Path(tempfile.mkdtemp(prefix="nli-auth-"))
            auth = ts.basic_auth_settings(backend_store_uri, scratch)
        argv, env = ts.server_command(
            backend_store_uri, artifacts, host, port, workers, ts.allowed_hosts(allowed_hosts), auth
        )
    except ts.ServerError as exc:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        fail(str(exc), exc.exit_code)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    click.echo(
        f"MLflow tracking server on {ts.mask_uri(backend_store_uri)} at "
        f"{ts.tracking_url(host, port)} (artifacts: {artifacts}); sweeps and jobs: "
        f"--tracking-uri {ts.url_for_jobs(host, port)}. Ctrl-C stops it.",
        err=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    if scratch is None:
        os.execve(argv[0], argv, env)  # nothing to clean up after it: the server takes this process
    sys.exit(ts.run_until_stopped(argv, env, scratch))


# -- sync -------------------------------------------------------------------------------------
@click.command("sync")
@click.argument("journal", type=click.Path(dir_okay=False))
@click.option("--tracking-uri", default=None,
              help="MLflow store to upload to (default: MLFLOW_TRACKING_URI)")
def sync_command(journal, tracking_uri):
    """Upload what a sweep's journal holds that the MLflow store lacks.

    JOURNAL is STORAGE_PATH/tracking-journal-RUN.jsonl, written by every sweep (a spool file of
    earlier versions works too). The same uploader as in the sweep: safe to run again or to
    interrupt, nothing is uploaded twice."""
    from orchestrator.journal.operations import JournalError
    from orchestrator.tracking.tracker import TrackingUnavailable
    from orchestrator.tracking.uploader import upload_journal
    from results.tracking_uri import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri, default=None)
    if not uri:
        fail("pass --tracking-uri (the sweep's MLflow server) or set MLFLOW_TRACKING_URI", 2)
    path = Path(journal)
    if not path.is_file():
        fail(f"journal {journal} not found", 2)
    try:
        sent = upload_journal(path, uri)
    except TrackingUnavailable as exc:
        fail(str(exc), 1)
    except (JournalError, KeyError) as exc:
        fail(f"{journal}: {exc}", 2)
    except Exception as exc:  # the server refused a record part-way
        fail(f"uploading {journal} to {mask_secrets(uri)} failed: {exc}; fix and run sync again", 1)
    click.echo(f"uploaded {sent} operations from {journal} to {mask_secrets(uri)}; the store has "
               "everything it records")


CLUSTER_COMMANDS = [
    submit_command,
    jobs_command,
    logs_command,
    stop_command,
    server_command,
    sync_command,
]
