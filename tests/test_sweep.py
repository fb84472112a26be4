"""Sweeps on a real local Ray instance with a real MLflow SQLite store, on generated data."""

from __future__ import annotations

import pytest
from testkit.cli import run_orchestrate
from testkit.specs import write_spec
from testkit.store import client_for, runs_of

from nli_models.training.device_info import cpu_model
from orchestrator.journal.parent_records import SweepExists
from orchestrator.sweep.driver import SweepRequest, run_sweep
from results import run_schema as rs

pytestmark = pytest.mark.ray
EPOCHS = 3


def _history(client, run_id: str, metric: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, metric))


@pytest.mark.check
def test_grid_sweep_records_parent_and_children(ray_session, workdir):
    spec = write_spec(workdir)
    summary = run_sweep(SweepRequest(spec))
    assert summary.trials == 4 and summary.failed == 0 and not summary.interrupted

    parents, children = runs_of(workdir, "tiny")
    assert len(parents) == 1 and len(children) == 4
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert parent.data.tags[rs.TAG_PLANNED_TRIALS] == "4"
    for tag in (rs.TAG_SPEC_HASH, rs.TAG_GIT_COMMIT, rs.TAG_GIT_DIRTY, rs.TAG_RAY_VERSION, rs.TAG_TORCH_VERSION):
        assert parent.data.tags.get(tag), tag
    # Each trial records what its own process trained on (resources.gpu 0: the CPU, 1 thread per
    # resources.cpu); the parent counts them.
    for child in children:
        tags = child.data.tags
        assert (tags[rs.TAG_DEVICE], tags[rs.TAG_DEVICE_NAME], tags[rs.TAG_PRECISION],
                tags[rs.TAG_CPU_THREADS]) == ("cpu", cpu_model(), "fp32", "1")
    assert parent.data.tags[rs.TAG_TRIAL_DEVICES] == f"cpu ({cpu_model()}) x4"
    client = client_for(workdir)
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == [
        rs.ARTIFACT_ANALYSIS_DIR, "provenance", rs.ARTIFACT_SPEC
    ]
    analysis = [a.path for a in client.list_artifacts(parent.info.run_id, rs.ARTIFACT_ANALYSIS_DIR)]
    assert f"{rs.ARTIFACT_ANALYSIS_DIR}/importance.parquet" in analysis
    assert f"{rs.ARTIFACT_ANALYSIS_DIR}/parallel_coordinates.png" in analysis
    _assert_readable_in_the_mlflow_ui(client, parent, children)

    grid = set()
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags[rs.TAG_PARENT_RUN] == parent.info.run_id
        # searched params under their name, the sweep's constants as const.<name>
        params = {k.removeprefix(rs.CONSTANT_PARAM_PREFIX): v for k, v in child.data.params.items()}
        for name in rs.COMMON_PARAMS:
            assert name in params, name
        assert {"lr", "dropout", "seed"} <= set(child.data.params)
        assert {"const.model", "const.variant", "const.batch_size"} <= set(child.data.params)
        assert params["model"] == "decomposable" and params["variant"] == "vanilla"
        grid.add((float(params["lr"]), float(params["dropout"])))
        for metric in ("train_loss", rs.METRIC_TRAIN_ACCURACY, "dev_loss", "dev_accuracy"):
            assert _history(client, child.info.run_id, metric) == list(range(1, EPOCHS + 1))
        metrics = child.data.metrics
        assert metrics[rs.METRIC_THETA_M] > 0 and metrics[rs.METRIC_THETA_WM] >= metrics[rs.METRIC_THETA_M]
        assert metrics[rs.METRIC_EPOCHS_TRAINED] == EPOCHS
        assert metrics[rs.METRIC_TRIAL_TIME] > 0
        assert "checkpoint" in [a.path for a in client.list_artifacts(child.info.run_id)]
    assert grid == {(0.001, 0.0), (0.001, 0.2), (0.01, 0.0), (0.01, 0.2)}

    # Paper protocol: the test metric only on the configuration selected on dev.
    selected = [c for c in children if c.data.tags.get(rs.TAG_SELECTED) == "true"]
    assert len(selected) == 1
    best = max(children, key=lambda c: c.data.metrics[rs.METRIC_BEST_DEV_ACCURACY])
    assert selected[0].data.metrics[rs.METRIC_BEST_DEV_ACCURACY] == best.data.metrics[rs.METRIC_BEST_DEV_ACCURACY]
    for child in children:
        has_test = rs.METRIC_TEST_ACCURACY in child.data.metrics
        assert has_test == (child in selected)
    assert parent.data.metrics[rs.METRIC_SWEEP_TEST_ACCURACY] == selected[0].data.metrics[rs.METRIC_TEST_ACCURACY]
    assert rs.METRIC_TEST_ACCURACY not in parent.data.metrics  # no bar among the trials' charts
    assert parent.data.tags[rs.TAG_BEST_RUN] == selected[0].info.run_id
    predictions = [a.path for a in client.list_artifacts(selected[0].info.run_id, "predictions")]
    assert predictions == [rs.ARTIFACT_TEST_PREDICTIONS]

    # A second sweep of the same experiment must be asked for explicitly; a completed one has
    # nothing to resume.
    with pytest.raises(SweepExists, match="completed .* --new"):
        run_sweep(SweepRequest(spec))
    with pytest.raises(SweepExists, match="nothing to --resume"):
        run_sweep(SweepRequest(spec, resume=True))


def _assert_readable_in_the_mlflow_ui(client, parent, children):
    """Run names, summary params, description, MLflow's own tags, dataset inputs, the view."""
    import json

    names = sorted(c.info.run_name for c in children)
    assert names == sorted(f"lr={lr} dropout={d} seed=1" for lr in ("1e-3", "0.01") for d in ("0", "0.2"))
    params = parent.data.params
    assert (params["model"], params["variant"], params["corpus"]) == ("decomposable", "vanilla", "toy")
    assert (params["sampler"], params["scheduler"], params["budget_trials"], params["grid_size"]) == (
        "grid", "fifo", "4", "4",
    )
    assert "lr" in json.loads(params["search_space"])
    note = parent.data.tags[rs.TAG_MLFLOW_NOTE]
    best = next(c for c in children if c.info.run_id == parent.data.tags[rs.TAG_BEST_RUN])
    assert f"(#/experiments/{parent.info.experiment_id}/runs/{best.info.run_id}?workflowType=machine_learning)" in note
    assert best.info.run_name in note and "127.0.0.1" not in note  # relative to the UI it is read in
    assert "viewStateShareKey=" + rs.RUNS_VIEW_KEY in note
    for run in (parent, *children):
        tags = run.data.tags
        assert tags[rs.TAG_MLFLOW_GIT_COMMIT] == parent.data.tags[rs.TAG_GIT_COMMIT]
        assert tags[rs.TAG_MLFLOW_USER] and tags[rs.TAG_MLFLOW_SOURCE_NAME].startswith("orchestrate sweep")
        inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
        assert [i.dataset.name for i in inputs] == ["toy"]
        assert json.loads(inputs[0].dataset.profile)["splits"]["train"] > 0
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags[rs.EXPERIMENT_TAG_KIND] == rs.EXPERIMENT_KIND_ML
    envelope = json.loads(experiment.tags[rs.EXPERIMENT_TAG_SHARED_VIEW_PREFIX + rs.RUNS_VIEW_KEY])
    assert envelope["name"] == rs.RUNS_VIEW_NAME and envelope["updatedAt"] >= envelope["createdAt"] > 0
    view = json.loads(envelope["state"])  # the Views menu's envelope holds the view as a string
    assert "params.`lr`" in view["selectedColumns"] and view["orderByAsc"] is False
    from pathlib import Path

    data = json.loads(Path(client.download_artifacts(parent.info.run_id, rs.ARTIFACT_DATA_RECORD)).read_text())
    assert data["corpus"] == "toy" and data["vocabulary_size"] > 0
    environment = json.loads(
        Path(client.download_artifacts(parent.info.run_id, rs.ARTIFACT_ENVIRONMENT)).read_text()
    )
    assert "device" not in environment  # no guess of the driver's: the trials record theirs
    assert environment["requested"] == {"training_device": "auto", "cpu": 1.0, "gpu": 0.0}


def test_seeds_repeat_every_configuration(ray_session, workdir):
    spec = write_spec(
        workdir,
        {"name": "seeded", "search": {"space": {"lr": {"grid": [0.003]}, "dropout": {"grid": [0.0]}}, "seeds": [1, 2, 3]}},
    )
    run_sweep(SweepRequest(spec))
    _, children = runs_of(workdir, "seeded")
    assert sorted(int(c.data.params["seed"]) for c in children) == [1, 2, 3]
    assert len({c.data.tags[rs.TAG_CONFIG_KEY] for c in children}) == 1
    # All seeds of the selected configuration are tested, as the results table averages them.
    assert all(rs.METRIC_TEST_ACCURACY in c.data.metrics for c in children)


def test_tpe_with_asha_stops_some_trials_early(ray_session, workdir):
    search = {
        "sampler": "tpe",
        "space": {"lr": {"loguniform": [1e-5, 0.05]}, "dropout": {"uniform": [0.0, 0.5]}},
        "num_samples": 8,
        "sampler_seed": 3,
        "seeds": [1],
        "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2},
        # One trial at a time: which trials ASHA stops, and what TPE proposes next, then depend on
        # the (deterministic) results alone, not on which of two concurrent trials reports first.
        "max_concurrent_trials": 1,
        "resources": {"cpu": 1},
    }
    spec = write_spec(workdir, {"name": "asha", "training": {"epochs": 4}}, replace_search=search)
    summary = run_sweep(SweepRequest(spec))
    assert summary.trials == 8 and summary.failed == 0
    _, children = runs_of(workdir, "asha")
    assert len(children) == 8
    stopped = [c for c in children if c.data.tags[rs.TAG_EARLY_STOPPED] == "true"]
    full = [c for c in children if c.data.tags[rs.TAG_EARLY_STOPPED] == "false"]
    assert stopped, "ASHA stopped no trial"
    assert full, "ASHA stopped every trial"
    assert all(c.data.metrics[rs.METRIC_EPOCHS_TRAINED] < 4 for c in stopped)
    assert all(c.data.metrics[rs.METRIC_EPOCHS_TRAINED] == 4 for c in full)
    assert all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.params["lr"] for c in children}) == 8  # TPE sampled distinct points


def test_tpe_on_a_choice_space_trains_each_configuration_once(ray_session, workdir):
    """TPE proposes points again; a repeat is told the recorded result instead of being trained."""
    search = {
        "sampler": "tpe",
        "space": {"lr": {"choice": [0.003, 0.01]}, "dropout": {"choice": [0.0, 0.2]}},
        "num_samples": 4,
        "sampler_seed": 0,
        "seeds": [1],
        "max_concurrent_trials": 2,
        "resources": {"cpu": 1},
    }
    spec = write_spec(workdir, {"name": "distinct"}, replace_search=search)
    summary = run_sweep(SweepRequest(spec))
    assert summary.trials == 4 and summary.failed == 0
    _, children = runs_of(workdir, "distinct")
    points = {(float(c.data.params["lr"]), float(c.data.params["dropout"])) for c in children}
    assert len(children) == 4 and len(points) == 4


def test_failed_trial_is_retried_from_its_checkpoint(tmp_path):
    spec = write_spec(
        tmp_path,
        {
            "name": "retried",
            "training": {"epochs": 3},
            "search": {"space": {"lr": {"grid": [0.003]}, "dropout": {"grid": [0.0]}}, "max_failures": 1},
        },
    )
    markers = tmp_path / "markers"
    result = run_orchestrate(
        ["sweep", str(spec)], cwd=tmp_path, env={"NLI_FAIL_ONCE_AT_EPOCH": f"2:{markers}"}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(markers.iterdir())) == 1  # the failure did happen
    _, children = runs_of(tmp_path, "retried")
    assert len(children) == 1 and children[0].info.status == "FINISHED"
    client = client_for(tmp_path)
    # Resumed from the epoch-1 checkpoint: epochs 2 and 3 once each, epoch 1 not repeated.
    assert _history(client, children[0].info.run_id, "dev_accuracy") == [1, 2, 3]
    # The retry is on the run: how many, why, and from which epoch's checkpoint.
    tags = children[0].data.tags
    assert tags[rs.TAG_RETRIES] == "1"
    assert "injected failure at epoch 2" in tags[rs.TAG_RETRY_CAUSE]
    assert tags[rs.TAG_RESUMED_FROM_EPOCH] == "1"
    assert "retry 1 from epoch 1" in result.stderr


def test_trial_error_reports_id_config_and_traceback(tmp_path):
    spec = write_spec(
        tmp_path,
        {"name": "failing", "training": {"epochs": 2}, "search": {"max_failures": 0}},
    )
    markers = tmp_path / "markers"
    result = run_orchestrate(
        ["sweep", str(spec)], cwd=tmp_path, env={"NLI_FAIL_ONCE_AT_EPOCH": f"1:{markers}"}
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "failed; config {" in output and "'lr': 0.001" in output
    assert "Traceback" in output and "injected failure at epoch 1" in output
    assert "4 trials (4 failed)" in output  # the sweep went on past the first failure
    _, children = runs_of(tmp_path, "failing")
    assert len(children) == 4
    assert all(c.info.status == "FAILED" for c in children)
    assert all("injected failure" in c.data.tags[rs.TAG_ERROR] for c in children)


@pytest.mark.check
def test_real_sweep_feeds_results_table_and_attention_maps(ray_session, workdir):
    """The sweep's records satisfy the results contract end to end."""
    import json

    import pandas as pd
    from click.testing import CliRunner

    from orchestrator.cli.orchestrate import main

    spec = write_spec(
        workdir,
        {
            "name": "wbw",
            "model": {
                "name": "rocktaschel",
                "variant": "word_by_word",
                "args": {"embedding_dim": 16, "hidden_size": 8, "dropout": 0.0},
            },
            "training": {"epochs": 2},
            "search": {"space": {"lr": {"grid": [0.003, 0.01]}, "dropout": {"grid": [0.0]}}, "seeds": [1, 2]},
        },
    )
    run_sweep(SweepRequest(spec))
    uri = f"sqlite:///{workdir / 'mlruns.db'}"
    out = workdir / "table.parquet"
    result = CliRunner().invoke(main, ["results", "wbw", "--tracking-uri", uri, "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out)
    assert len(table) == 1
    row = table.iloc[0]
    assert row["model"] == "rocktaschel" and row["variant"] == "word_by_word"
    assert row["n_trials"] == 4 and row["n_seeds"] == 2
    assert 0 <= row["test_accuracy"] <= 1 and not pd.isna(row["test_accuracy_std"])
    labels = {"entailment", "neutral", "contradiction"}
    assert set(json.loads(row["dev_accuracy_per_class"])) == labels  # Parikh Table 2's breakdown
    assert set(json.loads(row["test_accuracy_per_class"])) == labels

    _, children = runs_of(workdir, "wbw")
    selected = next(c for c in children if c.data.tags.get(rs.TAG_SELECTED) == "true")
    maps = CliRunner().invoke(
        main,
        ["attention", selected.info.run_id, "--pair-ids", "3,0", "--tracking-uri", uri,
         "--out", str(workdir / "maps")],
    )
    assert maps.exit_code == 0, maps.output
    figures = sorted(p.name for p in (workdir / "maps" / selected.info.run_id).iterdir())
    assert figures == [f"attention_dev_{i:05d}.{fmt}" for i in (0, 3) for fmt in ("pdf", "png", "svg")]
    logged = client_for(workdir).list_artifacts(selected.info.run_id, "attention")
    assert sorted(a.path.rsplit("/", 1)[-1] for a in logged) == figures
