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
from testkit.browser import Browser, dump_dom, screenshot
from testkit.cli import ORCHESTRATE
from testkit.ports import free_port
from testkit.specs import write_spec

from orchestrator.journal.operations import Journal, journal_file
from orchestrator.journal.parent_records import describe_sweep
from orchestrator.journal.recorder import SweepLog, SweepRecorder
from orchestrator.sweep.spec import load_spec
from orchestrator.tracking.run_view import runs_view_state, source_tags, trial_run_name, ui_hint
from orchestrator.tracking.tracker import Tracker
from orchestrator.tracking.uploader import JournalUploader, create_parent, trial_param_entities
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
    experiment_id, parent = create_parent(tracker, spec.name, "sweep-tiny", {rs.TAG_CORPUS: "toy"})
    journal = Journal(journal_file(spec.storage_path, parent), experiment_id, parent)
    describe_sweep(SweepLog(journal), spec, spec_path, experiment_id, resume=False)
    recorder = SweepRecorder(
        journal,
        base_params={"model": "decomposable", "variant": "vanilla", "batch_size": 32},
        run_tags=source_tags(spec_path, "0" * 40),
    )
    for number, (lr, dropout) in enumerate(GRID):
        trial = f"trial_{number}"
        recorder.trial_started(trial, {"lr": lr, "dropout": dropout, "seed": 1})
        recorder.trial_result(trial, {rs.METRIC_EPOCHS_TRAINED: 1, "dev_accuracy": 0.4 + number / 20})
        recorder.trial_completed(
            trial, {"best_dev_accuracy": 0.4 + number / 20, rs.METRIC_EPOCHS_TRAINED: 1, rs.RESULT_TRIAL_FINISHED: 1}, None
        )
    journal.close()
    JournalUploader(tracker, journal.path).upload_available()
    return spec.tracking_uri, spec.name


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """`orchestrate ui` on a store holding one sweep: (root URL, what it printed, sweep name, folder)."""
    folder = tmp_path_factory.mktemp("ui")
    uri, name = _store(folder)
    port = free_port()
    log_path = folder / "ui.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [ORCHESTRATE, "ui", "--tracking-uri", uri, "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder,
            env=os.environ.copy(),
        )
    try:
        deadline = time.monotonic() + 120
        while not re.search(r"chart\s+http", log_path.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        _wait_for_health(port, process, log_path)
        yield f"http://127.0.0.1:{port}/", log_path.read_text(), name, folder
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    quiet = log_path.read_text()
    assert not re.search(r"\bINFO\b|Warning", quiet), quiet  # no third-party log lines without -v


def test_printed_link_opens_the_trials_view_in_a_browser(ui):
    root, printed, name, folder = ui
    table_link = re.search(rf"{name}: trials (\S+)", printed)[1]
    chart_link = re.search(r"chart\s+(\S+)", printed)[1]
    assert table_link.startswith(f"{root}#/experiments/") and "workflowType=machine_learning" in table_link

    dom = dump_dom(table_link)
    names = [trial_run_name({"lr": lr, "dropout": d, "seed": 1}) for lr, d in GRID]
    found = {n: dom.find(n) for n in names}
    assert all(at >= 0 for at in found.values()), {n: at for n, at in found.items() if at < 0}
    # best on dev first: the last grid point has the highest dev accuracy
    assert sorted(found, key=found.get) == names[::-1]
    assert rs.METRIC_BEST_DEV_ACCURACY in dom  # the dev-accuracy column
    assert "You're viewing a shared view" in dom
    shot = screenshot(table_link, folder / "trials.png")
    assert shot.stat().st_size > 20_000

    chart_dom = dump_dom(chart_link)
    assert "Parallel" in chart_dom and "best_dev_accuracy" in chart_dom


BEST_FIRST = [trial_run_name({"lr": lr, "dropout": d, "seed": 1}) for lr, d in GRID][::-1]


def _trials_shown(browser: Browser) -> list[str]:
    """The trial names of the runs table, top to bottom as a reader sees them (the grid keeps its
    rows in the DOM in another order and positions them)."""
    return browser.run(
        "const names = arguments[0];"
        "return Array.from(document.querySelectorAll('a'))"
        ".filter(a => names.includes(a.innerText.trim()) && a.getBoundingClientRect().height > 0)"
        ".sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top)"
        ".map(a => a.innerText.trim())",
        BEST_FIRST,
    )


def _wait_for_trials(browser: Browser) -> list[str]:
    deadline = time.monotonic() + 90
    while (shown := _trials_shown(browser)) != BEST_FIRST and time.monotonic() < deadline:
        time.sleep(0.5)
    return shown


def test_from_the_home_page_to_the_sorted_trials_in_three_clicks(ui, tmp_path):
    """A researcher opens `orchestrate ui`'s root (MLflow's home page), clicks the experiment,
    "Views" and the sweep's view: the trials, best on dev first, with their columns. Opening a
    trial keeps the UI on model training (MLflow 3.17 otherwise flips to its GenAI pages)."""
    root, _, name, _ = ui
    browser = Browser(tmp_path / "chromedriver.log")
    try:
        browser.open(root)
        browser.click(f"//a[normalize-space()='{name}']")
        browser.click("//button[normalize-space()='Views']")
        browser.click(f"//*[@role='menuitem'][contains(normalize-space(), '{rs.RUNS_VIEW_NAME}')]")
        assert _wait_for_trials(browser) == BEST_FIRST
        assert browser.clicks == 3
        page = browser.text()
        assert "Sort: best_dev_accuracy" in page and "sweep-tiny" not in page  # flat, trials only
        for column in (rs.METRIC_BEST_DEV_ACCURACY, "lr", "dropout", "seed"):
            assert column in page.split("\n"), column
        shot = browser.screenshot(tmp_path / "home-to-trials.png")
        assert shot.stat().st_size > 20_000

        browser.click(f"//a[normalize-space()='{BEST_FIRST[0]}']")
        browser.find("//*[normalize-space()='Parameters (6)']")
        assert browser.run(f"return localStorage.getItem('{rs.UI_WORKFLOW_STORAGE_KEY}')") == (
            '"machine_learning"'
        )
        assert "Model metrics" in browser.text() and "Judges" not in browser.text()
    finally:
        browser.close()


def test_the_sweeps_page_and_the_description_link_open_the_trials_in_one_click(ui, tmp_path):
    """`/sweeps` lists each sweep's view; the parent run's description links to it relative to
    the UI it is read in (no host or port written into the store)."""
    root, printed, name, _ = ui
    assert f"{root}sweeps" in printed
    browser = Browser(tmp_path / "chromedriver.log")
    try:
        browser.open(root + "sweeps")
        browser.click(f"//a[normalize-space()='{rs.RUNS_VIEW_NAME}']")
        assert _wait_for_trials(browser) == BEST_FIRST and browser.clicks == 1

        browser.open(root)
        browser.click(f"//a[normalize-space()='{name}']")
        browser.click("//a[normalize-space()='sweep-tiny']")
        note_link = {Browser.ELEMENT: browser.find(f"//a[normalize-space()='{rs.RUNS_VIEW_NAME}']")}
        assert browser.run("return arguments[0].getAttribute('href')", note_link).startswith("#/experiments/")
        # shown above the description's fold (not under its "show more" gradient) ...
        fold = browser.run(  # the description shows its first 100 px under a "show more" gradient
            "let e = arguments[0].parentElement;"
            "while (e && getComputedStyle(e).maxHeight === 'none') e = e.parentElement;"
            "return e && [arguments[0].getBoundingClientRect().bottom - e.getBoundingClientRect().top,"
            " e.clientHeight]",
            note_link,
        )
        assert fold is None or fold[0] <= fold[1] / 2, fold
        # ... and resolved against the UI it is read in (it opens in a new tab: same address)
        target = browser.run("return arguments[0].href", note_link)
        assert target.startswith(root + "#/experiments/")
        browser.open(target)
        assert _wait_for_trials(browser) == BEST_FIRST
    finally:
        browser.close()


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


def test_the_sweeps_hint_names_its_store_or_its_servers_links():
    """A database store has no UI of its own: `sweep` prints the `ui` command for that very store
    (not a bare `orchestrate ui`, which would open the default one); a server's links are its own."""
    hint = ui_hint("sqlite:////data/runs/my store.db", "7")
    assert "orchestrate ui --tracking-uri 'sqlite:////data/runs/my store.db'" in hint
    assert rs.RUNS_VIEW_NAME in hint
    hint = ui_hint("http://login01:5000", "7")
    assert "http://login01:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=" in hint
    assert "&compareRunsMode=CHART" in hint


def test_sweeps_lists_the_readme_columns_in_percent(tmp_path):
    """docs/replay.md: `orchestrate sweeps` shows each sweep's state, trials done/failed/planned, best dev
    so far, selected configuration, test accuracy, start time and duration; accuracies in %."""
    from click.testing import CliRunner

    from orchestrator.cli.orchestrate import main

    uri, name = _store(tmp_path)
    shown = CliRunner().invoke(main, ["sweeps", name, "--tracking-uri", uri])
    assert shown.exit_code == 0, shown.output
    header, row = shown.stdout.splitlines()[:2]
    assert [c.strip() for c in re.split(r"\s{2,}", header)] == [
        "experiment", "sweep run", "state", "trials done/failed/planned", "best dev",
        "selected configuration", "test", "started (UTC)", "duration",
    ]
    assert "55.00%" in row.split()  # the best of the four trials' dev accuracies, in percent
