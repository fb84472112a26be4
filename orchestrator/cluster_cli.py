"""Cluster commands of `orchestrate`: submit, jobs, logs, stop (Ray jobs), server (MLflow
tracking server) and sync (upload a sweep's tracking journal).

Exit codes: 0 done, 1 the cluster / server / job failed or is unreachable, 2 bad input.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import click

from nli_models.errors import error_line, mask_secrets
from orchestrator.cli_options import DEFAULT_SIGNAL_BEFORE_S, make_overrides, override_options

ADDRESS_HELP = "Ray dashboard of the head node (default: RAY_ADDRESS or http://127.0.0.1:8265)"


def _fail(message: str, code: int) -> None:
    click.echo(error_line(message), err=True)
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
    click.option("--max-requeues", type=click.IntRange(0), default=None,
                 help="[--slurm] with --requeue: requeue at most this many times (default 3); "
                      "never after an allocation that finished no trial"),
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
    from orchestrator.ray_jobs import JobInputError

    given = [name for name, value in options.items() if value not in (None, False, ())]
    if given:
        flags = ", ".join("--" + name.replace("_lines", "").replace("time_limit", "time").replace("_", "-")
                          for name in given)
        raise JobInputError(f"{flags}: SLURM options; add --slurm (or drop them for a Ray job)")


def submit_to_slurm(spec_path, tracking_uri, resume, new, env, ray_only, overrides, *, nodes, cpus_per_task,
                    gpus_per_node, partition, time_limit, account, qos, sbatch_lines, setup_lines,
                    requeue, max_requeues, signal_before, log_dir, job_name, dry_run) -> None:
    """`submit --slurm`: render the batch script, sbatch it, record the job."""
    from orchestrator import slurm
    from orchestrator.spec import load_spec

    given = [flag for flag, value in ray_only.items() if value]
    if given:
        raise slurm.SlurmInputError(f"{', '.join(given)}: Ray Jobs options; not with --slurm")
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
    job = slurm.build_batch_job(spec_path, options, tracking_uri=tracking_uri, resume=resume,
                                new=new, env=env, overrides=overrides)
    for warning in job.warnings:
        click.echo(f"warning: {warning}", err=True)
    refusal = slurm.host_header_refusal(job.tracking_uri)
    if dry_run:  # what would be submitted, its passwords masked (the job gets them)
        click.echo(mask_secrets(job.script), nl=False)
        click.echo(f"(dry run: nothing submitted; {options.allocation.describe()} runs {job.at_once})",
                   err=True)
        if refusal:
            _fail(refusal, 1)
        from results.tracking_uri import unreachable_store

        away = unreachable_store(job.tracking_uri)
        if away:  # it may be started later, before the submission
            click.echo(f"warning: tracking server {mask_secrets(job.tracking_uri)} does not answer "
                       f"({away}); submit checks it again", err=True)
        return
    if refusal:
        _fail(f"{refusal}. Nothing was submitted.", 1)
    from orchestrator.tracking import Tracker, TrackingUnavailable

    try:  # a typo in the server's address is found here, not after the job waited in the queue
        Tracker(job.tracking_uri).check_reachable()
    except TrackingUnavailable as exc:
        _fail(f"{exc} Nothing was submitted.", 1)
    job_id = slurm.sbatch(job)
    entry = slurm.record(job, job_id)
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
    from orchestrator import slurm

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
@_cluster_errors
def submit_command(spec_path, address, tracking_uri, resume, new, working_dir, env, job_id, follow,
                   assignments, data_dir, **slurm_options):
    """Submit a sweep to a Ray cluster as a Ray job (`orchestrate sweep SPEC` on the head), or
    with --slurm to SLURM as a batch job that starts its own Ray cluster (--set and --data-dir
    are checked here and passed on; --data-dir names a folder there)."""
    from orchestrator.ray_jobs import build_submission, resolve_address

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
    jobs = _jobs(address)
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


# -- jobs / logs / stop -----------------------------------------------------------------------
def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _Progress:
    """Trials done per (tracking URI, experiment, since), asked once per listing."""

    def __init__(self):
        self.known: dict[tuple[str, str, int], tuple[int, str] | None] = {}

    def done(self, uri: str, experiment: str, since_ms: int = 0) -> int | None:
        """Trials of the experiment's latest sweep finished at or after `since_ms`."""
        from orchestrator.tracking import sweep_progress

        if not uri or not experiment:
            return None
        if (uri, experiment, since_ms) not in self.known:
            self.known[(uri, experiment, since_ms)] = sweep_progress(uri, experiment, since_ms)
        found = self.known[(uri, experiment, since_ms)]
        return None if found is None else found[0]

    def done_by(self, entry) -> int | None:
        """Trials the SLURM job `entry` finished: those after it started the sweep."""
        since = entry.sweep_started_ms()
        return 0 if since is None else self.done(entry.tracking_uri, entry.spec_name, since)


def _ray_rows(address: str | None, progress: _Progress) -> list[dict]:
    import time

    rows = []
    for job in _jobs(address).list():
        metadata = job.metadata or {}
        end = job.end_time or (time.time() * 1000 if job.start_time else None)
        planned = metadata.get("nli.planned_trials")
        rows.append({
            "job_id": job.submission_id or job.job_id or "-",
            "backend": "ray",
            "spec": metadata.get("nli.spec") or job.entrypoint,
            "experiment": metadata.get("nli.spec_name") or "-",
            "state": job.status.value,
            "elapsed": _clock((end - job.start_time) / 1000) if job.start_time else "-",
            "trials_done": progress.done(metadata.get("nli.tracking_uri", ""),
                                         metadata.get("nli.spec_name", "")),
            "trials_planned": int(planned) if planned else None,
            "start_time": job.start_time,
            "end_time": job.end_time,
            "entrypoint": job.entrypoint,
            "metadata": metadata,
            "message": job.message,
        })
    return rows


def _slurm_rows(progress: _Progress) -> list[dict]:
    from orchestrator import slurm

    entries = slurm.submissions()
    running = [e.job_id for e in entries if e.final_state is None]
    states = slurm.job_states(running) if running else {}
    rows = []
    for entry in entries:
        if entry.final_state is None:
            state = states[entry.job_id]
            if not state.active and state.state != "UNKNOWN":
                entry = slurm.record_end(entry, *_ended(entry, state))
        if entry.final_state is not None:  # ended: as recorded, nothing asked
            shown, elapsed, done = entry.final_state, entry.final_elapsed, entry.trials_done
        else:
            shown = state.state + (f" ({state.reason})" if state.reason else "")
            elapsed, done = state.elapsed, progress.done_by(entry)
        rows.append({
            "job_id": entry.job_id,
            "backend": "slurm",
            "spec": entry.spec,
            "experiment": entry.spec_name,
            "state": shown,
            "elapsed": elapsed,
            "trials_done": done,
            "trials_planned": entry.planned_trials,
            "output": entry.output,
            "tracking_uri": entry.tracking_uri,
        })
    return rows


def _ended(entry, state) -> tuple[str, str, int | None]:
    """A job that just left SLURM's queue: its end state, elapsed time and the trials it finished."""
    from orchestrator import slurm

    final, done = slurm.job_end(entry, state)
    if done is None:  # no end file (killed before it wrote one): the store now
        done = _Progress().done_by(entry)
    return final, state.elapsed, done


@click.command("jobs")
@click.option("--address", default=None, help=ADDRESS_HELP)
@click.option("--slurm", "slurm_only", is_flag=True, help="only the SLURM jobs submitted from here")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per job")
@_cluster_errors
def jobs_command(address, slurm_only, as_json):
    """List sweep jobs, oldest first: the Ray cluster's, and the SLURM jobs submitted from this
    account (the Ray cluster is asked when --address or RAY_ADDRESS names it, or when there are
    no SLURM jobs). TRIALS: trials finished / planned, from the tracking store; for a SLURM job
    the trials that job finished (once it ended: as recorded then)."""
    from orchestrator import slurm
    from orchestrator.ray_jobs import ADDRESS_ENVS

    progress = _Progress()
    ask_ray = not slurm_only and (
        address or any(os.environ.get(n) for n in ADDRESS_ENVS) or not slurm.submissions()
    )
    rows = _ray_rows(address, progress) if ask_ray else []
    rows += _slurm_rows(progress)
    if as_json:
        for row in rows:  # an entrypoint may hold a --set with a URI
            click.echo(mask_secrets(json.dumps(row)))
        return
    if not rows:
        click.echo("no jobs" + (f" on {_jobs(address).address}" if ask_ray else ""))
        return

    def trials(row) -> str:
        done = "?" if row["trials_done"] is None else row["trials_done"]
        return f"{done}/{row['trials_planned'] or '?'}"

    table = [("JOB", "BACKEND", "SPEC", "EXPERIMENT", "STATE", "ELAPSED", "TRIALS")]
    table += [(r["job_id"], r["backend"], r["spec"], r["experiment"], r["state"], r["elapsed"], trials(r))
              for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
    for row in table:
        line = "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo(mask_secrets(line.rstrip()))


def _slurm_entry(job_id: str, address: str | None):
    """The recorded SLURM submission `job_id`, or None for a Ray job. A bare number that was not
    submitted from here is not sent to the Ray cluster: Ray's submission ids are never numbers."""
    from orchestrator import slurm

    entry = slurm.find(job_id)
    if entry is None and job_id.isdigit() and not address:
        raise slurm.SlurmInputError(
            f"no SLURM job {job_id} was submitted from here (`orchestrate jobs` lists them; "
            f"record: {slurm.record_path()})"
        )
    return entry


def _slurm_logs(entry, follow: bool) -> None:
    """Print a SLURM job's output file; with follow, until the job leaves the queue."""
    import time

    from orchestrator import slurm

    path = Path(entry.output)
    position = 0

    def show() -> None:
        nonlocal position
        if path.is_file():
            with path.open("rb") as handle:
                handle.seek(position)
                data = handle.read()
            position += len(data)
            click.echo(data.decode(errors="replace"), nl=False)

    if not follow:
        if not path.is_file():
            state = slurm.job_states([entry.job_id])[entry.job_id].state
            click.echo(f"job {entry.job_id} ({state}) has no output yet at {path}", err=True)
        show()
        return
    while True:
        state = slurm.job_states([entry.job_id])[entry.job_id]
        show()
        if not state.active:
            show()
            final, _ = slurm.job_end(entry, state)
            click.echo(f"job {entry.job_id}: {final}", err=True)
            if final not in ("COMPLETED", "STOPPED"):  # a user's stop is no failure
                sys.exit(1)
            return
        time.sleep(2)


@click.command("logs")
@click.argument("job_id")
@click.option("--address", default=None, help=ADDRESS_HELP)
@click.option("-f", "--follow", is_flag=True, help="stream new output until the job ends")
@_cluster_errors
def logs_command(job_id, address, follow):
    """Print a job's output (its driver's stdout and stderr; for SLURM, the job's output file)."""
    entry = _slurm_entry(job_id, address)
    if entry is not None:
        _slurm_logs(entry, follow)
        return
    jobs = _jobs(address)
    if not follow:
        click.echo(jobs.logs(job_id), nl=False)
        return
    status = jobs.follow(job_id, lambda text: click.echo(text, nl=False))
    click.echo(f"job {job_id}: {status}", err=True)
    if status != "SUCCEEDED":
        sys.exit(1)


SLURM_STOP_WAIT_S = 180  # a clean stop: trials end, the sweep records them, Ray shuts down


@click.command("stop")
@click.argument("job_id")
@click.option("--address", default=None, help=ADDRESS_HELP)
@_cluster_errors
def stop_command(job_id, address):
    """Stop a running job (its trials stop; resume the sweep later with submit --resume)."""
    from orchestrator import slurm

    entry = _slurm_entry(job_id, address)
    if entry is not None:
        was_running, status = slurm.stop(job_id, timeout_s=SLURM_STOP_WAIT_S)
        status = slurm.job_end(entry, slurm.JobState(status))[0]
    else:
        was_running, status = _jobs(address).stop(job_id)
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

    from orchestrator import tracking_server as ts

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
        _fail(str(exc), exc.exit_code)
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
    from orchestrator.journal import JournalError
    from orchestrator.tracking import TrackingUnavailable
    from orchestrator.uploader import upload_journal
    from results.tracking_uri import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri, default=None)
    if not uri:
        _fail("pass --tracking-uri (the sweep's MLflow server) or set MLFLOW_TRACKING_URI", 2)
    path = Path(journal)
    if not path.is_file():
        _fail(f"journal {journal} not found", 2)
    try:
        sent = upload_journal(path, uri)
    except TrackingUnavailable as exc:
        _fail(str(exc), 1)
    except (JournalError, KeyError) as exc:
        _fail(f"{journal}: {exc}", 2)
    except Exception as exc:  # the server refused a record part-way
        _fail(f"uploading {journal} to {mask_secrets(uri)} failed: {exc}; fix and run sync again", 1)
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
