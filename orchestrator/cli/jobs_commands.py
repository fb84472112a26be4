"""`orchestrate jobs`, `logs` and `stop`: sweeps running as Ray jobs or SLURM batch jobs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from nli_models.errors import mask_secrets
from orchestrator.cli.cluster_common import ADDRESS_HELP, cluster_errors, ray_jobs_client
from orchestrator.ray_adapter.ray_jobs import (
    JOB_PLANNED_TRIALS,
    JOB_SPEC,
    JOB_SPEC_NAME,
    JOB_TRACKING_URI,
)


def _clock(seconds: float | None) -> str:
    """ELAPSED, one format for every job (H:MM:SS, hours past 24 counted on): SLURM's own
    mixes `00:02:45` (sacct) with `1:10` (squeue) and `1-02:03:04`; '-' when unknown."""
    if seconds is None:
        return "-"
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _Progress:
    """Trials done per (tracking URI, experiment, since), asked once per listing."""

    def __init__(self):
        self.known: dict[tuple[str, str, int], tuple[int, str] | None] = {}

    def done(self, uri: str, experiment: str, since_ms: int = 0) -> int | None:
        """Trials of the experiment's latest sweep finished at or after `since_ms`."""
        from orchestrator.tracking.tracker import sweep_progress

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
    for job in ray_jobs_client(address).list():
        metadata = job.metadata or {}
        end = job.end_time or (time.time() * 1000 if job.start_time else None)
        planned = metadata.get(JOB_PLANNED_TRIALS)
        rows.append({
            "job_id": job.submission_id or job.job_id or "-",
            "backend": "ray",
            "spec": metadata.get(JOB_SPEC) or job.entrypoint,
            "experiment": metadata.get(JOB_SPEC_NAME) or "-",
            "state": job.status.value,
            "elapsed": _clock((end - job.start_time) / 1000) if job.start_time else "-",
            "trials_done": progress.done(metadata.get(JOB_TRACKING_URI, ""),
                                         metadata.get(JOB_SPEC_NAME, "")),
            "trials_planned": int(planned) if planned else None,
            "start_time": job.start_time,
            "end_time": job.end_time,
            "entrypoint": job.entrypoint,
            "metadata": metadata,
            "message": job.message,
        })
    return rows


def _slurm_rows(progress: _Progress) -> list[dict]:
    from orchestrator.cluster import slurm_jobs

    entries = slurm_jobs.submissions()
    running = [e.job_id for e in entries if e.final_state is None]
    states = slurm_jobs.job_states(running) if running else {}
    rows = []
    for entry in entries:
        if entry.final_state is None:
            state = states[entry.job_id]
            # A job SLURM no longer knows (no accounting, and the controller forgot it after
            # MinJobAge) ended if its script wrote its end.
            forgotten_but_ended = state.state == "UNKNOWN" and slurm_jobs.end_record(entry) is not None
            if not state.active and (state.state != "UNKNOWN" or forgotten_but_ended):
                entry = slurm_jobs.record_end(entry, *_ended(entry, state))
        if entry.final_state is not None:  # ended: as recorded, nothing asked
            shown, done = entry.final_state, entry.trials_done
            elapsed = _clock(slurm_jobs.slurm_seconds(entry.final_elapsed))
        else:
            shown = state.state + (f" ({state.reason})" if state.reason else "")
            elapsed, done = _clock(entry.elapsed_s(state)), progress.done_by(entry)
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
    """A job that just left SLURM's queue: its end state, time over all its runs and the trials
    it finished, as its end file says (else SLURM and the store now)."""
    from orchestrator.cluster import slurm_jobs

    final, done = slurm_jobs.job_end(entry, state)
    if done is None:  # no end file (killed before it wrote one): the store now
        done = _Progress().done_by(entry)
    written = slurm_jobs.end_record(entry) or {}
    elapsed = written.get("elapsed_s")
    return final, _clock(elapsed if isinstance(elapsed, int | float) else entry.elapsed_s(state)), done


@click.command("jobs")
@click.option("--address", default=None, help=ADDRESS_HELP)
@click.option("--slurm", "slurm_only", is_flag=True, help="only the SLURM jobs submitted from here")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per job")
@cluster_errors
def jobs_command(address, slurm_only, as_json):
    """List sweep jobs, oldest first: the Ray cluster's, and the SLURM jobs submitted from this
    account (the Ray cluster is asked when --address or RAY_ADDRESS names it, or when there are
    no SLURM jobs). ELAPSED: H:MM:SS; a requeued SLURM job's over all its runs. TRIALS: trials
    finished / planned, from the tracking store; for a SLURM job the trials that job finished
    (once it ended: as its end file recorded them, also once SLURM has forgotten the job)."""
    from orchestrator.cluster import slurm_jobs
    from orchestrator.ray_adapter.ray_jobs import ADDRESS_ENVS

    progress = _Progress()
    ask_ray = not slurm_only and (
        address or any(os.environ.get(n) for n in ADDRESS_ENVS) or not slurm_jobs.submissions()
    )
    rows = _ray_rows(address, progress) if ask_ray else []
    rows += _slurm_rows(progress)
    if as_json:
        for row in rows:  # an entrypoint may hold a --set with a URI
            click.echo(mask_secrets(json.dumps(row)))
        return
    if not rows:
        click.echo("no jobs" + (f" on {ray_jobs_client(address).address}" if ask_ray else ""))
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
    from orchestrator.cluster import slurm, slurm_jobs

    entry = slurm_jobs.find(job_id)
    if entry is None and job_id.isdigit() and not address:
        raise slurm.SlurmInputError(
            f"no SLURM job {job_id} was submitted from here (`orchestrate jobs` lists them; "
            f"record: {slurm_jobs.record_path()})"
        )
    return entry


def _slurm_logs(entry, follow: bool) -> None:
    """Print a SLURM job's output file; with follow, until the job leaves the queue."""
    import time

    from orchestrator.cluster import slurm_jobs

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
            state = slurm_jobs.job_states([entry.job_id])[entry.job_id].state
            click.echo(f"job {entry.job_id} ({state}) has no output yet at {path}", err=True)
        show()
        return
    while True:
        state = slurm_jobs.job_states([entry.job_id])[entry.job_id]
        show()
        if not state.active:
            show()
            final, _ = slurm_jobs.job_end(entry, state)
            click.echo(f"job {entry.job_id}: {final}", err=True)
            if final not in ("COMPLETED", "STOPPED"):  # a user's stop is no failure
                sys.exit(1)
            return
        time.sleep(2)


@click.command("logs")
@click.argument("job_id")
@click.option("--address", default=None, help=ADDRESS_HELP)
@click.option("-f", "--follow", is_flag=True, help="stream new output until the job ends")
@cluster_errors
def logs_command(job_id, address, follow):
    """Print a job's output (its driver's stdout and stderr; for SLURM, the job's output file)."""
    entry = _slurm_entry(job_id, address)
    if entry is not None:
        _slurm_logs(entry, follow)
        return
    jobs = ray_jobs_client(address)
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
@cluster_errors
def stop_command(job_id, address):
    """Stop a running job (its trials stop; resume the sweep later with submit --resume)."""
    from orchestrator.cluster import slurm_jobs

    entry = _slurm_entry(job_id, address)
    if entry is not None:
        was_running, status = slurm_jobs.stop(job_id, timeout_s=SLURM_STOP_WAIT_S)
        status = slurm_jobs.job_end(entry, slurm_jobs.JobState(status))[0]
    else:
        was_running, status = ray_jobs_client(address).stop(job_id)
    if was_running:
        click.echo(f"job {job_id}: stop requested; now {status}")
    else:
        click.echo(f"job {job_id} was not running ({status})")
