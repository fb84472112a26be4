"""search.objectives through the CLI: a multi-objective TPE sweep (real Ray, real MLflow; in this
process, on the module's Ray instance: its claims are what it records), its front (`results
--pareto`, the report) checked against the store, and a bad objective spec refused by the real
`orchestrate` process with exit 2 before anything is written."""

from __future__ import annotations

import json
import pickle

import pandas as pd
import pytest
from testkit.cli import orchestrate, run_orchestrate
from testkit.specs import write_spec
from testkit.store import client_for, runs_of

from orchestrator.ray_adapter.optuna_study import STUDY_NAME
from results import run_schema as rs
from results.selection import SELECTION_RULE

OBJECTIVES = [{"dev_accuracy": "max"}, {"theta_m": "min"}]
SEARCH = {
    "sampler": "tpe",
    "num_samples": 5,
    "sampler_seed": 3,
    "space": {"lr": {"choice": [0.001, 0.01]}, "hidden_size": {"choice": [8, 16, 32]}},
    "objectives": OBJECTIVES,
    "max_concurrent_trials": 2,
    "resources": {"cpu": 1},
}


@pytest.fixture(scope="module")
def swept(ray_session, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pareto")
    spec = write_spec(folder, {"name": "front", "training": {"epochs": 2}}, replace_search=dict(SEARCH))
    sweep = orchestrate("sweep", spec, cwd=folder)
    assert sweep.returncode == 0, sweep.stderr
    results = orchestrate("results", "front", "--tracking-uri", f"sqlite:///{folder / 'mlruns.db'}",
                          "--out", folder / "out" / "front.parquet", "--pareto", folder / "out" / "pareto",
                          cwd=folder)
    assert results.returncode == 0, results.stderr
    return folder, sweep, results


def _objectives(run) -> tuple[float, float]:
    return run.data.metrics[rs.METRIC_BEST_DEV_ACCURACY], run.data.metrics[rs.METRIC_THETA_M]


def test_the_store_holds_every_objective_of_every_trial_and_the_rule_that_chose(swept):
    folder, sweep, _ = swept
    parents, children = runs_of(folder, "front")
    assert [p.info.status for p in parents] == ["FINISHED"]
    tags = parents[0].data.tags
    assert json.loads(tags[rs.TAG_OBJECTIVES]) == [["dev_accuracy", "max"], ["theta_m", "min"]]
    assert tags[rs.TAG_SELECTION_RULE] == SELECTION_RULE
    assert f"selection rule: {SELECTION_RULE}" in sweep.stderr
    assert len(children) == 5 and all(c.info.status == "FINISHED" for c in children)
    client = client_for(folder)
    for child in children:
        for name in rs.OBJECTIVE_METRICS.values():
            assert name in child.data.metrics, (name, child.data.metrics)
        # every epoch reported the objectives to Tune (and so its dev accuracy to the store)
        assert len(client.get_metric_history(child.info.run_id, rs.METRIC_DEV_ACCURACY)) == 2


def test_optuna_searched_both_objectives_with_the_values_the_store_holds(swept):
    folder, _, _ = swept
    import optuna

    _, children = runs_of(folder, "front")
    by_params = {}
    for child in children:
        params = json.loads(child.data.tags[rs.TAG_PARAMS_JSON])
        by_params[(params["lr"], params["hidden_size"])] = _objectives(child)
    (state_file,) = (folder / "ray_results").glob("front-*/searcher-state-*.pkl")
    study = optuna.load_study(study_name=STUDY_NAME, storage=pickle.loads(state_file.read_bytes())["study_storage"])
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    told = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(told) >= len(children)  # repeats of a finished configuration are told its result
    for trial in told:
        assert tuple(trial.values) == pytest.approx(by_params[(trial.params["lr"], trial.params["hidden_size"])])


def test_results_pareto_marks_exactly_the_non_dominated_trials(swept):
    folder, _, results = swept
    _, children = runs_of(folder, "front")
    points = {c.info.run_id: _objectives(c) for c in children}

    def dominated(run_id):
        acc, theta = points[run_id]
        return any(a >= acc and t <= theta and (a > acc or t < theta) for a, t in points.values())

    expected = {run_id for run_id in points if not dominated(run_id)}
    table = pd.read_parquet(folder / "out" / "pareto" / "front" / "pareto.parquet")
    assert set(table["run_id"]) == set(points)
    assert set(table.loc[table["on_front"], "run_id"]) == expected
    selected = {c.info.run_id for c in children if c.data.tags.get(rs.TAG_SELECTED) == "true"}
    assert set(table.loc[table["selected"], "run_id"]) == selected
    header = f"Pareto front of front over dev_accuracy (max), theta_m (min): {len(expected)} of 5 trials"
    assert header in results.stdout
    names = {c.info.run_id: c.info.run_name for c in children}
    listed = results.stdout.split(header, 1)[1]
    assert sum(f"  {names[run_id]} [" in listed for run_id in expected) == len(expected)


def test_the_front_figure_is_written_and_logged_to_the_parent(swept):
    folder, _, _ = swept
    figure = folder / "out" / "pareto" / "front" / "pareto.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(figure.with_suffix(s).stat().st_size > 0 for s in (".pdf", ".svg"))
    parents, _ = runs_of(folder, "front")
    logged = {a.path for a in client_for(folder).list_artifacts(parents[0].info.run_id, rs.ARTIFACT_PARETO_DIR)}
    assert {"pareto/pareto.png", "pareto/pareto.parquet"} <= logged


def test_the_report_draws_the_front(swept):
    folder, _, _ = swept
    report = orchestrate("report", "front", "--tracking-uri", f"sqlite:///{folder / 'mlruns.db'}",
                         "--out", folder / "report", cwd=folder)
    assert report.returncode == 0, report.stderr
    page = (folder / "report" / "front.md").read_text()
    assert "## Pareto front" in page and SELECTION_RULE in page
    assert (folder / "report" / "front_files" / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_a_bad_objective_spec_exits_2_before_anything_is_written(tmp_path):
    """As a user meets it (every other refusal is in test_bad_inputs' table)."""
    objectives = [{"dev_accuracy": "max"}, {"params": "min"}]
    spec = write_spec(tmp_path, {"name": "bad"}, replace_search={**SEARCH, "objectives": objectives},
                      new_store=True)
    result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert (f"{spec}: search: objectives[1]: unknown objective 'params'; allowed: dev_accuracy, "
            "theta_m, theta_wm, trial_time_s") in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec.name]  # no store, no Ray results


# -- the front's rules, on records built in memory --------------------------------------------
PARIKH_VANILLA = {  # Parikh et al.'s own configuration (§5.1) as a trial logs it
    "model": "decomposable", "variant": "vanilla", "hidden_size": 200, "projection_dim": 200,
    "dropout": 0.2, "lr": 0.05, "optimizer": "adagrad", "batch_size": 4, "init": "gaussian_0.01",
}


def _trial_run(run_id: str, dev: float, theta_m: int, params: dict, selected: bool = False):
    from results.run_reader import TrialRun
    from results.selection import TrialRecord

    record = TrialRecord(run_id=run_id, config_key=run_id, model_config="m", params=params,
                         best_dev_accuracy=dev, seed=1, status="FINISHED", theta_m=theta_m)
    metrics = {rs.METRIC_BEST_DEV_ACCURACY: dev, rs.METRIC_THETA_M: theta_m}
    return TrialRun(record=record, experiment="e", parent_run_id="p", tagged_selected=selected,
                    metrics=metrics, run_name=run_id)


def test_the_front_keeps_ties_and_marks_the_papers_configuration():
    from results.pareto import DEFAULT_OBJECTIVES, pareto_front

    smaller = {**PARIKH_VANILLA, "hidden_size": 100}
    trials = [
        _trial_run("paper", 0.80, 380_000, PARIKH_VANILLA),
        _trial_run("tie", 0.80, 380_000, {**PARIKH_VANILLA, "lr": 0.01}),  # same point: both stay
        _trial_run("small", 0.78, 100_000, smaller, selected=True),
        _trial_run("worse", 0.77, 100_000, smaller),  # as small, less accurate
        _trial_run("big", 0.79, 500_000, {**PARIKH_VANILLA, "hidden_size": 300}),
    ]
    front = pareto_front(trials, "e", DEFAULT_OBJECTIVES)
    rows = {r["run_id"]: r for r in front.rows}
    assert {k for k, r in rows.items() if r["on_front"]} == {"paper", "tie", "small"}
    assert rows["paper"]["paper_configuration"] == (  # the row of Table 1 and of Table 2 (dev per class)
        "parikh2016 Table 1: Our approach (vanilla); parikh2016 Table 2: Our approach (vanilla)"
    )
    assert rows["tie"]["paper_configuration"] is None  # another learning rate than the paper's
    assert [r for r in rows if rows[r]["selected"]] == ["small"]
    assert front.references == (("parikh2016 Table 1 (snli): Our approach (vanilla)", 382e3),)


def test_sweeps_of_one_experiment_with_other_objectives_are_refused():
    from results.pareto import DEFAULT_OBJECTIVES, sweep_objectives
    from results.results_errors import ResultsError

    time = json.dumps([["dev_accuracy", "max"], ["trial_time_s", "min"]])
    assert sweep_objectives([{}, {}], "e") == DEFAULT_OBJECTIVES
    assert sweep_objectives([{rs.TAG_OBJECTIVES: time}, {}], "e") == (("dev_accuracy", "max"), ("trial_time_s", "min"))
    with pytest.raises(ResultsError, match="e: its sweeps searched different objectives"):
        sweep_objectives([{rs.TAG_OBJECTIVES: time}, {rs.TAG_OBJECTIVES: json.dumps(DEFAULT_OBJECTIVES)}], "e")
