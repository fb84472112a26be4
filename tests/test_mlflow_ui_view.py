"""The MLflow UI as a comparison tool: the link `orchestrate ui` prints opens, in a real headless
Chromium against a real `mlflow ui`, the experiment's trials named by their hyperparameters, best
on dev first, with the dev-accuracy and hyperparameter columns (the view the sweep stores as the
experiment tag mlflow.sharedViewState.nli-trials) and a parallel-coordinates chart."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from browser_helpers import dump_dom, screenshot
from sweep_helpers import ORCHESTRATE, write_spec

from orchestrator.journal import Journal, journal_file
from orchestrator.ports import free_port
from orchestrator.spec import load_spec
from orchestrator.tracking import (
    JournalUploader,
    SweepRecorder,
    Tracker,
    describe_sweep,
    runs_view_state,
    source_tags,
    trial_param_entities,
    trial_run_name,
)
from results import run_schema as rs

GRID = [(lr, dropout) for lr in (0.001, 0.01) for dropout in (0.0, 0.2)]


def test_trial_names_and_constant_params():
    assert trial_run_name({"lr": 3e-4, "dropout": 0.1, "hidden_size": 100, "seed": 2}) == (
        "lr=3e-4 dropout=0.1 k=100 seed=2"
    )
    logged = {p.key: p.value for p in trial_param_entities({"lr": 0.1, "model": "cam", "seed": 1}, ["lr", "seed"])}
    assert logged == {"lr": "0.1", "const.model": "cam", "seed": "1"}
    view = json.loads(runs_view_state(["dropout", "lr", "seed"], [rs.METRIC_BEST_DEV_ACCURACY]))
    assert view["orderByKey"] == f"metrics.`{rs.METRIC_BEST_DEV_ACCURACY}`" and not view["orderByAsc"]
    assert view["compareRunCharts"][0]["selectedParams"] == ["dropout", "lr"]


def _store(folder: Path) -> tuple[str, str]:
    """A sweep's records as the sweep writes them (same functions), without training."""
    spec_path = write_spec(folder)
    spec = load_spec(spec_path)
    tracker = Tracker(spec.tracking_uri)
    experiment_id = tracker.experiment_id(spec.name)
    parent = tracker.start_sweep(experiment_id, "sweep-tiny", {rs.TAG_CORPUS: "toy"})
    describe_sweep(tracker, spec, spec_path, experiment_id, parent, resume=False)
    journal = Journal(journal_file(spec.storage_path, parent), experiment_id, parent)
    recorder = SweepRecorder(
        journal,
        base_params={"model": "decomposable", "variant": "vanilla", "batch_size": 32},
        run_tags=source_tags(spec_path, "0" * 40),
    )
    for number, (lr, dropout) in enumerate(GRID):
        trial = f"trial_{number}"
        recorder.trial_started(trial, {"lr": lr, "dropout": dropout, "seed": 1})
        recorder.trial_result(trial, {"epoch": 1, "dev_accuracy": 0.4 + number / 20})
        recorder.trial_completed(
            trial, {"best_dev_accuracy": 0.4 + number / 20, "epoch": 1, "trial_finished": 1}, None
        )
    journal.close()
    JournalUploader(tracker, journal.path).upload_available()
    return spec.tracking_uri, spec.name


def test_printed_link_opens_the_trials_view_in_a_browser(tmp_path):
    uri, name = _store(tmp_path)
    port = free_port()
    log_path = tmp_path / "ui.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [ORCHESTRATE, "ui", "--tracking-uri", uri, "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
            env=os.environ.copy(),
        )
    try:
        deadline = time.monotonic() + 120
        while not re.search(r"chart\s+http", log_path.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        printed = log_path.read_text()
        table_link = re.search(rf"{name}: trials (\S+)", printed)[1]
        chart_link = re.search(r"chart\s+(\S+)", printed)[1]
        assert table_link.startswith(f"http://127.0.0.1:{port}/#/experiments/")
        _wait_for_health(port, process, log_path)

        dom = dump_dom(table_link)
        names = [trial_run_name({"lr": lr, "dropout": d, "seed": 1}) for lr, d in GRID]
        found = {n: dom.find(n) for n in names}
        assert all(at >= 0 for at in found.values()), {n: at for n, at in found.items() if at < 0}
        # best on dev first: the last grid point has the highest dev accuracy
        assert sorted(found, key=found.get) == names[::-1]
        assert rs.METRIC_BEST_DEV_ACCURACY in dom  # the dev-accuracy column
        assert "You're viewing a shared view" in dom
        shot = screenshot(table_link, tmp_path / "trials.png")
        assert shot.stat().st_size > 20_000

        chart_dom = dump_dom(chart_link)
        assert "Parallel" in chart_dom and "best_dev_accuracy" in chart_dom
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _wait_for_health(port: int, process: subprocess.Popen, log_path: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, log_path.read_text()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail("the MLflow UI did not answer in time:\n" + log_path.read_text())
            time.sleep(0.5)
