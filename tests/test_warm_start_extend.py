"""`orchestrate sweep --warm-start EXPERIMENT` and `--extend`, through the CLI, asserted on the
MLflow store and on Tune's experiment folders. The sweeps run in this process on the module's Ray
instance (a new process costs seconds of imports and a Ray instance of its own), but for the one
that a Ctrl-C interrupts: that claim is about the real process."""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest
from testkit.cli import orchestrate, start_orchestrate
from testkit.processes import kill_session, wait_while_driving
from testkit.specs import merge, write_spec
from testkit.store import client_for, runs_of, trial_running
from testkit.toy import decomposable

from orchestrator.ray_adapter.optuna_study import STUDY_NAME
from results import run_schema as rs

SEARCHED = ("lr", "dropout")


def _ok(result) -> None:
    assert result.returncode == 0, result.stdout + result.stderr


def _points(children: list) -> list[tuple]:
    return [tuple(json.loads(c.data.tags[rs.TAG_PARAMS_JSON])[k] for k in SEARCHED) for c in children]


def _sampler_spec(folder: Path, name: str, override: dict | None = None) -> Path:
    """Random sampling of a 6-point categorical space, 3 configurations, one epoch each."""
    search = {
        "sampler": "random",
        "space": {"lr": {"choice": [0.001, 0.003, 0.01]}, "dropout": {"choice": [0.0, 0.2]}},
        "num_samples": 3,
        "sampler_seed": 0,
        "max_concurrent_trials": 2,
    }
    override = override or {}
    search["space"] = override.get("space", search["space"])  # a whole space of its own
    model = {"model": override["model"]} if "model" in override else {}
    return write_spec(folder, {"name": name, "training": {"epochs": 1}, **model},
                      replace_search=merge(search, override.get("search", {})))


@pytest.mark.parametrize("stack", ["off", 3])
def test_warm_start_tells_the_study_the_finished_trials_and_runs_none_of_them_again(ray_session, workdir,
                                                                                   earlier_store, stack):
    """With stack: 3 the sampler's 3 new proposals train as one stacked trial (StackProposals in
    front of the same searchers): the same points, told and skipped the same way."""
    (workdir / "mlruns.db").write_bytes(earlier_store.read_bytes())  # the sweep `earlier`, completed
    _, earlier = runs_of(workdir, "earlier")
    finished = set(_points(earlier))
    assert len(finished) == 3 and all(c.info.status == "FINISHED" for c in earlier)

    # The same sampler seed proposes the earlier sweep's points first: each is told its recorded
    # value and the sampler asked again.
    spec = _sampler_spec(workdir, "warm", {"search": {"stack": stack}})
    result = orchestrate("sweep", spec, "--warm-start", "earlier", cwd=workdir)
    _ok(result)
    stacked = list((workdir / "ray_results").glob("warm-*/run_stack_trial_*"))
    assert len(stacked) == (1 if stack == 3 else 0)
    (parent,), children = runs_of(workdir, "warm")
    assert len(children) == 3  # warm-start points do not count toward num_samples
    new = _points(children)
    assert not finished & set(new), f"re-ran finished configurations: {finished & set(new)}"
    assert len(set(new)) == 3  # the space's other three points
    earlier_parent = runs_of(workdir, "earlier")[0][0]
    assert parent.data.tags[rs.TAG_WARM_START] == f"earlier/{earlier_parent.info.run_id}"
    assert parent.data.tags[rs.TAG_WARM_START_CONFIGURATIONS] == "3"

    # Tune saved the Optuna searcher beside the run: its study holds the earlier trials, with the
    # value each reported last (the store's latest dev_accuracy), before this sweep's own.
    tune_folder = workdir / "ray_results" / f"warm-{parent.info.run_id[:8]}"
    (state_file,) = tune_folder.glob("searcher-state-*.pkl")
    study = optuna.load_study(study_name=STUDY_NAME, storage=pickle.loads(state_file.read_bytes())["study_storage"])
    told = {(t.params["lr"], t.params["dropout"]): t.value for t in study.trials[:3]}
    assert told == {
        point: run.data.metrics[rs.METRIC_DEV_ACCURACY] for point, run in zip(_points(earlier), earlier, strict=True)
    }


def _history(client, run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))


@pytest.mark.parametrize("stack", ["off", 2])
def test_extend_runs_only_new_points_and_tests_only_a_new_selection(ray_session, workdir, stack):
    """One configuration that learns little (lr 1e-4, 1 epoch), then an extension that adds one
    that learns (lr 0.01): the selection changes and test data is evaluated again, as a second
    evaluation; a further extension with a worse point changes nothing and tests nothing. Stacked
    (each Tune run's trials are stacked trials), the extensions read the earlier runs' members."""
    base = {"name": "grown", "training": {"epochs": 2},
            "search": {"space": {"lr": {"grid": [0.0001]}, "dropout": {"grid": [0.0]}}, "stack": stack}}
    spec = write_spec(workdir, base)
    _ok(orchestrate("sweep", spec, cwd=workdir))
    client = client_for(workdir)
    (parent,), (first,) = runs_of(workdir, "grown")
    first_test = first.data.metrics[rs.METRIC_TEST_ACCURACY]
    first_epochs = _history(client, first.info.run_id, rs.METRIC_DEV_ACCURACY)

    nothing = orchestrate("sweep", spec, "--extend", cwd=workdir)
    assert nothing.returncode == 2 and "adds no trial" in nothing.stderr, nothing.stderr

    result = orchestrate("sweep", spec, "--extend", "--set", "search.space.lr.grid=[0.0001,0.01]", cwd=workdir)
    _ok(result)
    assert "(test evaluation 2)" in result.stdout
    (parent,), children = runs_of(workdir, "grown")
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert parent.data.tags[rs.TAG_EXTENSIONS] == "1"
    earlier = next(c for c in children if c.info.run_id == first.info.run_id)
    added = next(c for c in children if c.info.run_id != first.info.run_id)
    assert len(children) == 2
    # The earlier trial is untouched: no epoch added, its test metric kept, no longer selected.
    assert _history(client, first.info.run_id, rs.METRIC_DEV_ACCURACY) == first_epochs
    assert earlier.data.metrics[rs.METRIC_TEST_ACCURACY] == first_test
    assert earlier.data.tags[rs.TAG_SELECTED] == "false"
    assert added.data.tags[rs.TAG_SELECTED] == "true"
    assert added.data.tags[rs.TAG_TEST_EVALUATION] == "2"
    assert parent.data.tags[rs.TAG_TEST_EVALUATIONS] == "2"
    assert parent.data.tags[rs.TAG_BEST_RUN] == added.info.run_id
    tests = _history(client, parent.info.run_id, rs.METRIC_SWEEP_TEST_ACCURACY)
    assert tests == [(0, first_test), (1, added.data.metrics[rs.METRIC_TEST_ACCURACY])]
    assert (workdir / "ray_results" / f"grown-{parent.info.run_id[:8]}-extend1").is_dir()

    again = orchestrate("sweep", spec, "--extend", "--set", "search.space.lr.grid=[0.0001,0.01,0.00001]",
                        cwd=workdir)
    _ok(again)
    assert "the selection on dev did not change: test data was not evaluated again" in again.stderr
    (parent,), children = runs_of(workdir, "grown")
    assert len(children) == 3 and parent.data.tags[rs.TAG_EXTENSIONS] == "2"
    third = next(c for c in children if c.info.run_id not in (first.info.run_id, added.info.run_id))
    assert rs.METRIC_TEST_ACCURACY not in third.data.metrics
    assert _history(client, parent.info.run_id, rs.METRIC_SWEEP_TEST_ACCURACY) == tests
    assert parent.data.tags[rs.TAG_TEST_EVALUATIONS] == "2"
    stacked = list((workdir / "ray_results").glob("grown-*/run_stack_trial_*"))
    assert len(stacked) == (3 if stack == 2 else 0)  # one per Tune run
    store = ["--tracking-uri", f"sqlite:///{workdir / 'mlruns.db'}"]
    listing = orchestrate("sweeps", "grown", *store, cwd=workdir)
    _ok(listing)
    assert "(evaluation 2)" in listing.stdout
    # The results table and the report say which evaluation the test number is.
    table = workdir / "grown.parquet"
    _ok(orchestrate("results", "grown", "--out", table, "--format", "md", *store, cwd=workdir))
    (row,) = pq.read_table(table).to_pylist()
    assert (row["test_evaluation"], row["selected_run_id"]) == (2, added.info.run_id)
    assert "(evaluation 2)" in table.with_suffix(".md").read_text()
    _ok(orchestrate("report", "grown", "--out", workdir / "report", *store, cwd=workdir))
    assert any("(test evaluation 2)" in f.read_text() for f in (workdir / "report").rglob("*.md"))


def _store_runs(folder: Path) -> int:
    client = client_for(folder)
    return sum(len(client.search_runs([e.experiment_id])) for e in client.search_experiments())


@pytest.mark.parametrize(
    ("args", "override", "message"),
    [
        (["--warm-start", "earlier"], {"search": {"sampler": "grid"}, "space": {"lr": {"grid": [0.01]}}},
         "--warm-start earlier: a warm start seeds an Optuna sampler"),
        (["--warm-start", "nowhere"], {}, "holds no experiment 'nowhere'"),
        (["--warm-start", "earlier"], {"search": {"space": {"lr": {"choice": [0.001, 0.003]}}}},
         "ran lr=0.01, outside search.space.lr (choice [0.001, 0.003])"),
        (["--warm-start", "earlier"], {"search": {"space": {"dropout": {"choice": [0.1]}}}},
         "outside search.space.dropout (choice [0.1])"),
        (["--warm-start", "earlier"], {"search": {"num_samples": 4}},
         "the space holds 6 configurations and 3 of them finished before"),
        (["--warm-start", "earlier"],
         {"model": decomposable(dim=16, dropout=0.1), "space": {"lr": {"choice": [0.001, 0.003, 0.01]}}},
         "which this spec does not search (it fixes dropout=0.1)"),
        (["--warm-start", "earlier"], {"search": {"objectives": [{"dev_accuracy": "max"}, {"trial_time_s": "min"}]}},
         "--warm-start earlier: search.objectives ['dev_accuracy', 'trial_time_s'] make a multi-objective study"),
        (["--extend"], {"name": "earlier", "search": {"num_samples": 4,
                                                      "objectives": [{"dev_accuracy": "max"}, {"theta_m": "min"}]}},
         "--extend: search.objectives ['dev_accuracy', 'theta_m'] make a multi-objective study"),
        (["--warm-start", "earlier", "--extend"], {}, "--extend and --warm-start exclude each other"),
        (["--extend"], {"name": "earlier", "search": {"num_samples": 3}}, "adds no trial"),
        (["--extend"], {"name": "never_ran"}, "holds no sweep to extend"),
    ],
)
def test_bad_warm_start_or_extension_is_refused_before_anything_is_written(
    tmp_path_factory, earlier_store, args, override, message
):
    folder = tmp_path_factory.mktemp("bad")
    store = folder / "mlruns.db"
    store.write_bytes(earlier_store.read_bytes())
    spec = _sampler_spec(folder, override.get("name", "warm"), override)
    before = _store_runs(folder)
    result = orchestrate("sweep", spec, *args, cwd=folder)  # refused before Ray: in this process
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert _store_runs(folder) == before
    assert not (folder / "ray_results").exists()


@pytest.fixture(scope="module")
def earlier_store(ray_session, tmp_path_factory) -> Path:
    """A store holding the completed 3-sample sweep `earlier` (the lr 0.01 points included)."""
    folder = tmp_path_factory.mktemp("earlier")
    _ok(orchestrate("sweep", _sampler_spec(folder, "earlier"), cwd=folder))
    _, children = runs_of(folder, "earlier")
    assert any(lr == 0.01 for lr, _ in _points(children)), _points(children)
    return folder / "mlruns.db"


def test_an_interrupted_extension_continues_with_resume(ray_session, workdir, monkeypatch):
    """The extension is the sweep's lifecycle: Ctrl-C leaves it interrupted (exit 3), --resume
    finishes the same extension (its Tune run restored, its trial run reused)."""
    spec = write_spec(workdir, {"name": "paused", "training": {"epochs": 2},
                                "search": {"space": {"lr": {"grid": [0.01]}, "dropout": {"grid": [0.0]}}}})
    _ok(orchestrate("sweep", spec, cwd=workdir))
    (_,), (first,) = runs_of(workdir, "paused")
    first_epochs = _history(client_for(workdir), first.info.run_id, rs.METRIC_DEV_ACCURACY)
    more = ["--set", "search.space.dropout.grid=[0.0,0.2]"]
    monkeypatch.setenv("NLI_EPOCH_DELAY_S", "4")
    log = workdir / "extend.log"
    driver = start_orchestrate(["sweep", str(spec), "--extend", *more], workdir, log)
    try:
        wait_while_driving(trial_running(workdir, "paused", log, epochs_logged=1), driver, log, "an epoch")
        os.kill(driver.pid, signal.SIGINT)
        assert driver.wait(timeout=180) == 3, log.read_text()
    finally:
        kill_session(driver)
    (parent,), children = runs_of(workdir, "paused")
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_INTERRUPTED
    assert parent.data.tags[rs.TAG_EXTENSIONS] == "1"
    (cut,) = [c for c in children if c.info.run_id != first.info.run_id]
    assert cut.info.status == "KILLED"

    monkeypatch.delenv("NLI_EPOCH_DELAY_S")
    _ok(orchestrate("sweep", spec, "--resume", *more, cwd=workdir))
    (parent,), children = runs_of(workdir, "paused")
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert parent.data.tags[rs.TAG_EXTENSIONS] == "1"  # the same extension, finished
    assert sorted(c.info.run_id for c in children) == sorted([first.info.run_id, cut.info.run_id])
    assert all(c.info.status == "FINISHED" for c in children)
    assert _history(client_for(workdir), first.info.run_id, rs.METRIC_DEV_ACCURACY) == first_epochs
    steps = [step for step, _ in _history(client_for(workdir), cut.info.run_id, rs.METRIC_DEV_ACCURACY)]
    assert steps == [1, 2]  # resumed from its checkpoint, no epoch twice
