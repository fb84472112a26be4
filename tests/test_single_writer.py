"""One writer: every MLflow write of orchestrator/ is in the uploader (orchestrator/tracking/uploader.py),
which applies the sweep's journal; the driver only appends to it. So a store away at the very end
of a sweep changes nothing of its outcome (exit code, summary), and a later `orchestrate sweep`
(which first uploads what earlier drivers journaled) or `orchestrate sync` puts everything in the
store: the parent completed, the test metrics once, the best run linked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from testkit.cli import run_orchestrate, start_orchestrate
from testkit.processes import wait_while_driving
from testkit.specs import write_spec
from testkit.tracking_server import TrackingServer

from results import run_schema as rs

ORCHESTRATOR = Path(__file__).resolve().parents[1] / "orchestrator"
# MlflowClient's (and the fluent API's) writes, as calls.
WRITE_CALL = re.compile(
    r"\.(set_tags?|log_batch|create_run|set_terminated|log_artifacts?|update_run|log_inputs|log_text|"
    r"log_metrics?|log_params?|create_experiment|set_experiment_tag|delete_run|log_dict|log_figure)\("
)


def test_only_the_uploader_calls_mlflow_writes():
    writers = {}
    for path in sorted(ORCHESTRATOR.rglob("*.py")):
        calls = [f"{number}: {line.strip()}" for number, line in enumerate(path.read_text().splitlines(), 1)
                 if WRITE_CALL.search(line)]
        if calls:
            writers[path.name] = calls
    assert set(writers) == {"uploader.py"}, writers
    assert len(writers["uploader.py"]) >= 8  # the uploader itself is found by the same pattern


@pytest.mark.ray
def test_a_store_away_at_the_very_end_delays_the_upload_and_changes_no_outcome(tmp_path):
    name = "end-outage"
    server = TrackingServer(f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "artifacts", tmp_path)
    server.start()
    try:
        spec = write_spec(tmp_path, {"name": name, "search": {
            "tracking_uri": server.url, "space": {"lr": {"grid": [0.001, 0.01]}, "dropout": {"grid": [0.0]}}}})
        log = tmp_path / "driver.log"
        with pytest.MonkeyPatch.context() as patch:
            # The selection waits until the server is down; the end gives up on it after 2 s,
            # each request tried once.
            patch.setenv("NLI_TEST_EVALUATION_DELAY_S", "25")
            patch.setenv("NLI_TRACKING_MAX_WAIT_S", "2")
            patch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            driver = start_orchestrate(["sweep", str(spec)], cwd=tmp_path, log=log)
        wait_while_driving(lambda: "selecting on dev" in log.read_text(), driver, log, "the selection")
        server.stop()
        assert driver.wait(timeout=300) == 0  # what it exits with when the store stays up
        output = log.read_text()
        assert "sweep finished: 2 trials (0 failed); best dev accuracy" in output, output
        assert "Traceback" not in output
        [journal] = (tmp_path / "ray_results").glob("tracking-journal-*.jsonl")
        assert "is still unreachable after the sweep" in output
        assert f"orchestrate sync {journal} --tracking-uri {server.url}" in output

        server.start()
        client = server.client()
        [parent] = client.search_runs([client.get_experiment_by_name(name).experiment_id],
                                      filter_string=f"tags.`{rs.TAG_ROLE}` = '{rs.ROLE_SWEEP}'")
        assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_RUNNING  # the end was not uploaded
        assert rs.TAG_BEST_RUN not in parent.data.tags

        # The next `orchestrate sweep` uploads the journal before it reads the store.
        again = run_orchestrate(["sweep", str(spec), "--resume"], cwd=tmp_path)
        assert again.returncode == 2 and "already holds completed sweep run" in again.stderr, again.stderr
        _assert_complete(client, parent.info.run_id)
        synced = run_orchestrate(["sync", str(journal), "--tracking-uri", server.url], cwd=tmp_path)
        assert synced.returncode == 0 and "uploaded 0 operations" in synced.stdout, synced.stderr
        _assert_complete(client, parent.info.run_id)  # nothing doubled
    finally:
        if server.group is not None:
            server.stop()


def _assert_complete(client, parent_run_id: str) -> None:
    parent = client.get_run(parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert rs.METRIC_SWEEP_TEST_ACCURACY in parent.data.metrics
    trials = client.search_runs([parent.info.experiment_id],
                                filter_string=f"tags.`{rs.TAG_PARENT_RUN}` = '{parent_run_id}'")
    assert sorted(t.info.status for t in trials) == ["FINISHED", "FINISHED"]
    [tested] = [t for t in trials if rs.METRIC_TEST_ACCURACY in t.data.metrics]
    assert parent.data.tags[rs.TAG_BEST_RUN] == tested.info.run_id
    assert tested.info.run_id in parent.data.tags[rs.TAG_MLFLOW_NOTE]  # the description links it
    assert len(client.get_metric_history(tested.info.run_id, rs.METRIC_TEST_ACCURACY)) == 1
    assert tested.data.tags[rs.TAG_SELECTED] == "true"
    files = [f.path for f in client.list_artifacts(tested.info.run_id, "predictions")]
    assert files == [rs.ARTIFACT_TEST_PREDICTIONS]
    assert {f.path for f in client.list_artifacts(parent_run_id)} >= {rs.ARTIFACT_SPEC, "provenance"}
