"""`orchestrate server` over PostgreSQL with every request thread busy at once.

MLflow's `log_batch` holds a database session while it opens others for params and metrics. With
SQLAlchemy's default pool (5 + 10 connections) under uvicorn's 40 request threads, threads held
the pool's connections while they waited for a second one, until the pool's 30 s timeout: the
client got a 400 and the batch was not written (benchmarks/README.md, "scale_tracking"). Here as many
clients as the server has request threads log batches shaped like the uploader's at once;
every batch must be written, once, without any request waiting out the pool.
"""

from __future__ import annotations

import threading
import time

import pytest
from testkit.tracking_server import TrackingServer

from orchestrator.cluster.tracking_server import SERVER_THREADS

pytestmark = pytest.mark.timeout(600)

BATCHES_PER_CLIENT = 8
METRICS = ("train_loss", "dev_loss", "dev_accuracy", "epoch_time_s", "learning_rate")
POOL_TIMEOUT_S = 30  # SQLAlchemy's default pool_timeout, which MLflow does not change


@pytest.fixture
def server(fresh_postgres, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    tracking = TrackingServer(fresh_postgres, tmp_path / "artifacts", logs)
    tracking.start()
    try:
        yield tracking
    finally:
        tracking.stop()


def _log_epochs(client, run_id: str, start: threading.Barrier, latencies: list[float]) -> None:
    """One trial's epochs, one log_batch each (metrics, a param and a tag, as the uploader sends)."""
    from mlflow.entities import Metric, Param, RunTag

    start.wait()
    for step in range(1, BATCHES_PER_CLIENT + 1):
        now_ms = int(time.time() * 1000)
        began = time.monotonic()
        client.log_batch(
            run_id,
            metrics=[Metric(name, step / 10, now_ms, step) for name in METRICS],
            params=[Param(f"epoch_{step}_seed", str(step))],
            tags=[RunTag("nli.last_epoch", str(step))],
        )
        latencies.append(time.monotonic() - began)


def test_as_many_clients_as_request_threads_write_every_batch_without_waiting_for_a_connection(server):
    client = server.client()
    experiment = client.create_experiment("load")
    runs = [client.create_run(experiment).info.run_id for _ in range(SERVER_THREADS)]
    start = threading.Barrier(len(runs))
    latencies: list[float] = []
    errors: list[BaseException] = []

    def trial(run_id: str) -> None:
        try:
            _log_epochs(server.client(), run_id, start, latencies)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=trial, args=(run_id,)) for run_id in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a client hung"
    assert not errors, f"{len(errors)} clients failed; the first: {errors[0]!r}"
    assert len(latencies) == len(runs) * BATCHES_PER_CLIENT
    # A request that waited out the pool's timeout had no connection for 30 s: the pool ran dry.
    assert max(latencies) < POOL_TIMEOUT_S, f"slowest batch {max(latencies):.1f} s"

    for run_id in runs:  # each batch written once: every step of every metric, no step twice
        run = client.get_run(run_id)
        assert len(run.data.params) == BATCHES_PER_CLIENT
        assert run.data.tags["nli.last_epoch"] == str(BATCHES_PER_CLIENT)
        for name in METRICS:
            steps = sorted(m.step for m in client.get_metric_history(run_id, name))
            assert steps == list(range(1, BATCHES_PER_CLIENT + 1)), (run_id, name, steps)
