"""`orchestrate results` end to end on a real MLflow SQLite store holding fake sweeps.

The sweeps are logged with MlflowClient following results/run_schema.py; one store and one
full CLI run (table, markdown, paper comparison, EVP, McNemar) are shared by the module.
"""

import os

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # before anything imports mlflow

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from orchestrator.cli.orchestrate import main
from results import run_schema as rs
from results import table as results_table
from results.results_errors import ResultsWarning
from results.run_reader import fetch_test_metrics, load_trials, resolve_experiments
from results.table import build_table

ABSURD = 12.345  # a test accuracy no honest run has: it must never reach the table
LABELS = ("entailment", "neutral", "contradiction")
N_TEST = 40
# Test examples each representative run gets right: McNemar sees 10 examples only word-by-word
# gets right, 3 only attention gets right, 20 both, 7 neither.
WBW_CORRECT = [i < 10 or 13 <= i < 33 for i in range(N_TEST)]
ATT_CORRECT = [10 <= i < 33 for i in range(N_TEST)]

WBW = {
    "model": "rocktaschel",
    "variant": "word_by_word",
    "hidden_size": 100,
    "shared_encoder": False,
    "two_way": False,
}
ATT = {**WBW, "variant": "attention"}
DEC = {"model": "decomposable", "variant": "vanilla", "hidden_size": 200}
COMMON = {"dropout": 0.1, "l2": 0.0, "batch_size": 32, "optimizer": "adam", "epochs": 10}


@dataclass
class Seed:
    seed: int
    dev: float | None
    status: str = "FINISHED"
    test: float | None = None
    per_class: dict = field(default_factory=dict)
    early_stopped: bool = False
    correct: list | None = None  # logs a predictions artifact getting these examples right
    trial_time: float = 100.0


def config_key(params: dict) -> str:
    without_seed = {k: str(v) for k, v in params.items() if k != rs.PARAM_SEED}
    return hashlib.sha1(json.dumps(without_seed, sort_keys=True).encode()).hexdigest()[:12]


def log_config(client, experiment_id, parent_id, params, seeds, selected, scratch) -> dict:
    """One configuration's seed-runs as a sweep logs them; returns {seed: run_id}."""
    run_ids = {}
    for s in seeds:
        full = {**params, **COMMON, "seed": s.seed}
        tags = {
            rs.TAG_ROLE: rs.ROLE_TRIAL,
            rs.TAG_PARENT_RUN: parent_id,
            rs.TAG_TRIAL_ID: f"trial-{len(run_ids)}",
            rs.TAG_MODEL_CONFIG: rs.model_config_label(full),
            rs.TAG_CONFIG_KEY: config_key(full),
            rs.TAG_EARLY_STOPPED: str(s.early_stopped).lower(),
            rs.TAG_CORPUS: "snli",
        }
        if selected:
            tags[rs.TAG_SELECTED] = "true"
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        metrics = [Metric(rs.METRIC_TRIAL_TIME, s.trial_time, 0, 0)]
        if s.dev is not None:
            epochs = 3 if s.early_stopped else 10
            metrics += [
                Metric(name, value, 0, epoch)
                for epoch in (1, 2)
                for name, value in (
                    (rs.METRIC_TRAIN_LOSS, 1.0 / epoch),
                    (rs.METRIC_TRAIN_ACCURACY, s.dev),
                    (rs.METRIC_DEV_LOSS, 1.1 / epoch),
                    (rs.METRIC_DEV_ACCURACY, s.dev),
                    (rs.METRIC_EPOCH_TIME, 9.0),
                )
            ]
            final = {
                rs.METRIC_BEST_DEV_ACCURACY: s.dev,
                rs.METRIC_BEST_TRAIN_ACCURACY: s.dev + 0.05,
                rs.METRIC_BEST_EPOCH: 2,
                rs.METRIC_EPOCHS_TRAINED: epochs,
                rs.METRIC_THETA_M: 242_000 if params["variant"] == "attention" else 252_000,
                rs.METRIC_THETA_WM: 3_900_000,
            }
            if s.test is not None:
                final[rs.METRIC_TEST_ACCURACY] = s.test
                final.update({rs.CLASS_ACCURACY_PREFIX + k: v for k, v in s.per_class.items()})
            metrics += [Metric(name, value, 0, 0) for name, value in final.items()]
        params_logged = [Param(k, str(v)) for k, v in sorted(full.items())]
        client.log_batch(run_id, metrics=metrics, params=params_logged)
        if s.correct is not None:
            log_predictions(client, run_id, s.correct, scratch / run_id)
        client.set_terminated(run_id, s.status)
        run_ids[s.seed] = run_id
    return run_ids


def log_predictions(client, run_id, correct, directory):
    gold = [i % len(LABELS) for i in range(N_TEST)]
    frame = pd.DataFrame(
        {
            "index": range(N_TEST),
            "label": gold,
            "prediction": [
                g if ok else (g + 1) % len(LABELS) for g, ok in zip(gold, correct, strict=True)
            ],
            "label_name": [LABELS[g] for g in gold],
        }
    )
    directory.mkdir(parents=True)
    path = directory / Path(rs.ARTIFACT_TEST_PREDICTIONS).name
    frame.to_parquet(path, index=False)
    client.log_artifact(run_id, str(path), str(Path(rs.ARTIFACT_TEST_PREDICTIONS).parent))


def start_sweep(client, experiment_id, name):
    tags = {rs.TAG_ROLE: rs.ROLE_SWEEP, rs.TAG_SPEC_NAME: name, rs.TAG_SPEC_HASH: "spec-hash",
            rs.TAG_SWEEP_STATE: rs.SWEEP_COMPLETED}
    return client.create_run(experiment_id, tags=tags).info.run_id


@dataclass
class Store:
    uri: str
    runs: dict  # (configuration name, seed) -> run_id
    parents: dict  # sweep name -> parent run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root}/mlruns.db"
    client = MlflowClient(tracking_uri=uri)
    runs, parents = {}, {}

    def log(name, experiment_id, parent, params, seeds, selected):
        for seed, run_id in log_config(
            client, experiment_id, parents[parent], params, seeds, selected, root / "scratch"
        ).items():
            runs[name, seed] = run_id

    snli = client.create_experiment("snli-rocktaschel", artifact_location=str(root / "artifacts"))
    parents["rock"] = start_sweep(client, snli, "snli-rocktaschel")
    # (name, params, seeds, selected) of each configuration in the Rocktäschel sweep
    rock_trials = [
        ("wbw_a", {**WBW, "lr": 0.001}, [
            Seed(1, 0.80, test=0.80, per_class={"entailment": 0.9, "neutral": 0.7}),
            Seed(2, 0.82, test=0.82, per_class={"entailment": 0.9, "neutral": 0.8}),
            Seed(3, 0.84, test=0.84, per_class={"entailment": 0.9, "neutral": 0.9}, correct=WBW_CORRECT),
        ], True),
        ("wbw_b", {**WBW, "lr": 0.0003}, [
            # A test metric a non-selected run should never have had: the table must ignore it.
            Seed(1, 0.79, test=ABSURD, per_class={"entailment": ABSURD}),
            Seed(2, 0.81),
            Seed(3, 0.83, early_stopped=True, trial_time=30.0),
        ], False),
        ("wbw_c", {**WBW, "lr": 0.01}, [
            Seed(1, None, status="FAILED", trial_time=5.0),
            Seed(2, 0.99, status="KILLED", trial_time=7.0),  # best dev of all, but never finished
        ], False),
        ("att_a", {**ATT, "lr": 0.001}, [Seed(1, 0.81, test=0.80), Seed(2, 0.83, test=0.81, correct=ATT_CORRECT)], True),
    ]
    for name, params, seeds, selected in rock_trials:
        log(name, snli, "rock", params, seeds, selected)
    client.set_tag(parents["rock"], rs.TAG_BEST_RUN, runs["wbw_a", 3])

    # A first sweep selects dec_a; a later sweep adds dec_b, better on dev and never tested.
    dec = client.create_experiment("snli-decomposable", artifact_location=str(root / "artifacts"))
    parents["dec1"] = start_sweep(client, dec, "snli-decomposable")
    parents["dec2"] = start_sweep(client, dec, "snli-decomposable")
    log("dec_a", dec, "dec1", {**DEC, "lr": 0.05}, [Seed(1, 0.85, test=0.84), Seed(2, 0.86, test=0.85)], selected=True)
    log("dec_b", dec, "dec2", {**DEC, "lr": 0.025}, [Seed(1, 0.87), Seed(2, 0.88)], selected=False)
    return Store(uri, runs, parents)


def invoke(store, *args):
    """`orchestrate results ARGS` on `store`, through the CLI's one error handler."""
    return CliRunner().invoke(main, ["results", "--tracking-uri", store.uri, *map(str, args)])


@pytest.fixture(scope="module")
def full_run(store, tmp_path_factory):
    """One CLI run with every option; the tests below read what it wrote and printed."""
    out = tmp_path_factory.mktemp("out") / "tables" / "snli.parquet"
    result = invoke(
        store,
        "snli-rocktaschel",
        "snli-decomposable",
        "--out",
        out,
        "--format",
        "md",
        "--paper",
        "rocktaschel2016",
        "--evp",
        out.parent / "evp.png",
        "--mcnemar",
        rs.model_config_label({**WBW, "seed": 0}),
        f"snli-rocktaschel:{rs.model_config_label(ATT)}",
    )
    assert result.exit_code == 0, result.output
    return out, result


@pytest.fixture(scope="module")
def rows(full_run) -> dict:
    table = pd.read_parquet(full_run[0])
    return {row["model_config"]: row for _, row in table.iterrows()}


def test_one_row_per_model_configuration_with_the_dev_selected_configuration(store, rows):
    assert list(rows) == [rs.model_config_label(c) for c in (DEC, ATT, WBW)]  # sorted by experiment
    wbw = rows[rs.model_config_label(WBW)]
    assert wbw["config_key"] == config_key({**WBW, **COMMON, "lr": 0.001})
    assert wbw["selected_run_id"] == store.runs["wbw_a", 3]  # best seed on dev
    assert wbw["parent_run_id"] == store.parents["rock"]
    assert wbw["selection_matches_tag"]
    assert (wbw["model"], wbw["variant"], wbw["k"]) == ("rocktaschel", "word_by_word", 100)
    assert (wbw["theta_m"], wbw["theta_wm"]) == (252_000, 3_900_000)
    assert json.loads(wbw["hyperparameters"]) == {**WBW, **COMMON, "lr": 0.001}  # typed, no seed
    assert (wbw["n_trials"], wbw["n_configs"], wbw["n_seeds"]) == (8, 3, 3)
    assert wbw["epochs_trained"] == 10
    assert wbw["total_trial_time_s"] == 5 * 100 + 30 + 5 + 7  # every trial, failed ones too
    assert wbw["train_accuracy_running"] == pytest.approx(0.87)


def test_mean_std_and_student_t_interval_over_seeds(rows):
    wbw = rows[rs.model_config_label(WBW)]
    half_width = 4.302652729911275 * 0.02 / math.sqrt(3)  # t_{0.975, df=2} * std / sqrt(3)
    for metric in ("dev_accuracy", "test_accuracy"):  # both 0.80, 0.82, 0.84 over the seeds
        assert wbw[metric] == pytest.approx(0.82)
        assert wbw[f"{metric}_std"] == pytest.approx(0.02)
        assert wbw[f"{metric}_ci95_low"] == pytest.approx(0.82 - half_width)
        assert wbw[f"{metric}_ci95_high"] == pytest.approx(0.82 + half_width)
    assert json.loads(wbw["test_accuracy_per_class"]) == pytest.approx(
        {"entailment": 0.9, "neutral": 0.8}
    )


def test_no_test_metric_of_a_non_selected_run_reaches_the_table(store, rows):
    cells = [str(value) for row in rows.values() for value in row.tolist()]
    assert not any(str(ABSURD) in cell for cell in cells)
    # Structurally: test metrics are fetched for the selected configurations' runs only.
    client = MlflowClient(tracking_uri=store.uri)
    experiments = resolve_experiments(client, ["snli-rocktaschel", "snli-decomposable"])
    fetched = []

    def spy(run_id):
        fetched.append(run_id)
        return fetch_test_metrics(client, run_id)

    with pytest.warns(ResultsWarning, match="the selection rule picks"):  # the stale tag, below
        build_table(load_trials(client, experiments), spy, [])
    selected = [
        ("wbw_a", 1),
        ("wbw_a", 2),
        ("wbw_a", 3),
        ("att_a", 1),
        ("att_a", 2),
        ("dec_b", 1),
        ("dec_b", 2),
    ]
    assert sorted(fetched) == sorted(store.runs[key] for key in selected)


def test_stale_selected_tag_is_overruled_with_a_warning(store, full_run, rows):
    dec = rows[rs.model_config_label(DEC)]
    assert dec["config_key"] == config_key({**DEC, **COMMON, "lr": 0.025})
    assert dec["selection_matches_tag"] == False  # noqa: E712  (numpy bool)
    assert dec["parent_run_id"] == store.parents["dec2"]
    assert dec["dev_accuracy"] == pytest.approx(0.875)
    assert pd.isna(dec["test_accuracy"]) and pd.isna(dec["test_accuracy_per_class"])  # never tested
    assert (
        "warning:" in full_run[1].stderr
        and config_key({**DEC, **COMMON, "lr": 0.025}) in full_run[1].stderr
    )


def test_parquet_schema_is_typed_and_documented(full_run):
    schema = pq.read_schema(full_run[0])
    assert schema.metadata[b"nli.schema_version"] == b"1"
    assert schema.metadata[b"nli.table"] == b"results"
    assert json.loads(schema.metadata[b"nli.experiments"]) == [
        "snli-rocktaschel",
        "snli-decomposable",
    ]
    assert schema.names == [c.name for c in results_table.COLUMNS]
    for column in results_table.COLUMNS:
        assert schema.field(column.name).type == column.type
        assert schema.field(column.name).metadata[b"description"] == column.description.encode()
        assert f"``{column.name}``" in results_table.__doc__


def test_markdown_goes_to_stdout_and_beside_the_table(full_run):
    out, result = full_run
    markdown = out.with_suffix(".md").read_text()
    lines = markdown.splitlines()
    assert lines[0] == (
        "| corpus | model | selected hyperparameters | \\|θ\\|M | train (running) | dev | test | test 95% CI "
        "| seeds | trials |"
    )
    # The majority-class baseline: 14 of the 40 test examples are entailment.
    assert lines[2] == "| snli | majority class (entailment) |  |  |  |  | 35.00 |  |  |  |"
    wbw_line = next(line for line in lines if "word_by_word" in line)
    # lr is the only param that varies between the row's trials; counts and percent as in papers
    assert "| lr=1e-3 | 252K | 87.00 | 82.00 ± 2.00 | 82.00 ± 2.00 | [77.03, 86.97] | 3 | 8 |" in wbw_line
    assert markdown in result.stdout


def test_searched_hyperparameters_are_the_ones_that_varied(rows):
    wbw = rows[rs.model_config_label(WBW)]
    assert json.loads(wbw["searched_hyperparameters"]) == {"lr": 0.001}


def test_per_seed_rows_in_a_parquet_and_under_their_model(store, tmp_path):
    out = tmp_path / "snli.parquet"
    result = invoke(store, "snli-rocktaschel", "--out", out, "--format", "latex", "--per-seed",
                    "--label", "tab:main")
    assert result.exit_code == 0, result.output
    seeds = pd.read_parquet(out.with_suffix(".seeds.parquet"))
    wbw = seeds[seeds["model_config"] == rs.model_config_label(WBW)]
    assert wbw["seed"].tolist() == [1, 2, 3]
    assert wbw["dev_accuracy"].tolist() == pytest.approx([0.80, 0.82, 0.84])
    assert wbw["test_accuracy"].tolist() == pytest.approx([0.80, 0.82, 0.84])
    latex = out.with_suffix(".tex").read_text()
    assert r"\label{tab:main}" in latex and r"\caption{Accuracy (\%) on snli" in latex
    body = latex.split(r"\midrule")[1]
    wbw_at = body.index(r"rocktaschel/word\_by\_word")
    assert body.index("seed 1", wbw_at) < body.index("seed 2", wbw_at) < body.index("seed 3", wbw_at)


@pytest.mark.parametrize(("fmt", "suffix"), [("csv", ".csv"), ("latex", ".tex")])
def test_csv_and_latex_renderings(store, tmp_path, fmt, suffix):
    out = tmp_path / "snli.parquet"
    result = invoke(store, "snli-rocktaschel", "--out", out, "--format", fmt)
    assert result.exit_code == 0, result.output
    text = out.with_suffix(suffix).read_text()
    assert result.stdout == text
    if fmt == "csv":
        frame = pd.read_csv(out.with_suffix(".csv"))
        assert frame.set_index("model config").loc[rs.model_config_label(WBW), "test"] == 82.0
    else:
        assert text.startswith(r"\begin{table}") and r"rocktaschel/word\_by\_word" in text
        assert r"\toprule" in text and r"\label{tab:snli}" in text


def test_paper_comparison_keeps_rows_we_did_not_run(full_run):
    comparison = pd.read_parquet(full_run[0].with_suffix(".rocktaschel2016.parquet"))
    assert comparison["row"].nunique() == 7  # every Table 1 row of a registered model
    test = comparison[comparison["metric"] == "test_accuracy"].set_index("row")
    wbw = test.loc["Word-by-word attention, k=100"]
    assert (wbw["published"], wbw["ours"]) == (83.5, pytest.approx(82.0))
    assert wbw["difference"] == pytest.approx(-1.5)
    assert test.loc["Attention, k=100", "ours"] == pytest.approx(80.5)
    missing = test.loc["Conditional encoding, k=116"]
    assert (
        missing["published"] == 80.9 and pd.isna(missing["ours"]) and pd.isna(missing["experiment"])
    )
    assert pd.isna(test.loc["Attention, two-way, k=100", "model_config"])  # ours is two_way=False
    params = comparison[comparison["metric"] == "theta_m"].set_index("row")
    assert params.loc["Word-by-word attention, k=100", "difference"] == 0
    assert "Conditional encoding, k=116" in full_run[1].stdout  # rendered with --format too


def test_expected_validation_performance_plot_and_table(full_run):
    plot = full_run[0].parent / "evp.png"
    for stem in ("evp", "evp.hours"):  # over trials and over wall-clock hours
        assert (plot.parent / f"{stem}.png").read_bytes().startswith(b"\x89PNG")
        assert (plot.parent / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
        assert b"<svg" in (plot.parent / f"{stem}.svg").read_bytes()[:2000]
    curves = pd.read_parquet(plot.with_suffix(".parquet"))
    wbw = curves[curves["model_config"] == rs.model_config_label(WBW)]
    # FINISHED draws only: 0.80, 0.82, 0.84, 0.79, 0.81, 0.83 (the KILLED 0.99 is no draw)
    assert wbw["n"].tolist() == [1, 2, 3, 4, 5, 6] and (wbw["n_draws"] == 6).all()
    assert wbw["expected_best_dev_accuracy"].iloc[0] == pytest.approx(0.815)
    assert wbw["expected_best_dev_accuracy"].is_monotonic_increasing
    assert wbw["expected_best_dev_accuracy"].iloc[-1] < 0.84
    assert (wbw["corpus"] == "snli").all()
    assert (wbw["min_observed_dev_accuracy"] == 0.79).all() and (wbw["max_observed_dev_accuracy"] == 0.84).all()
    # n x the draws' mean trial time: five of 100 s and the early-stopped one of 30 s
    assert wbw["budget_hours"].tolist() == pytest.approx([n * 530 / 6 / 3600 for n in range(1, 7)])


def test_mcnemar_on_the_selected_runs_predictions(full_run):
    stdout = full_run[1].stdout
    assert f"on {N_TEST} test examples" in stdout
    assert "correct: 10\n" in stdout and "correct: 3\n" in stdout
    assert f"exact binomial, p = {2 * (1 + 13 + 78 + 286) / 2**13:.4g}" in stdout


def test_unknown_experiment_is_a_usage_error_and_writes_nothing(store, tmp_path):
    out = tmp_path / "tables" / "x.parquet"
    result = invoke(store, "snli-rocktaschel", "no-such-sweep", "--out", out, "--format", "md")
    assert result.exit_code == 2
    assert "unknown experiment(s): no-such-sweep" in result.output
    assert "snli-decomposable, snli-rocktaschel" in result.output  # lists what exists
    assert not out.parent.exists()


def test_unknown_mcnemar_row_writes_nothing(store, tmp_path):
    out = tmp_path / "x.parquet"
    result = invoke(store, "--out", out, "--mcnemar", "nope", "also-nope")
    assert result.exit_code == 2 and "'nope' names no row" in result.output
    assert list(tmp_path.iterdir()) == []


def test_missing_sqlite_store_is_not_created(tmp_path):
    database = tmp_path / "typo.db"
    result = CliRunner().invoke(
        main,
        ["results", "--tracking-uri", f"sqlite:///{database}", "--out", str(tmp_path / "x.parquet")],
    )
    assert result.exit_code == 2 and "no tracking store" in result.output
    assert list(tmp_path.iterdir()) == []


def test_mcnemar_needs_the_predictions_artifact(store, tmp_path):
    # The decomposable row's selected configuration was never tested, so it has no predictions.
    out = tmp_path / "x.parquet"
    result = invoke(
        store, "--out", out, "--mcnemar", rs.model_config_label(DEC), rs.model_config_label(ATT)
    )
    assert result.exit_code == 2 and rs.ARTIFACT_TEST_PREDICTIONS in result.output
    assert list(tmp_path.iterdir()) == []


def test_analysis_importance_parallel_coordinates_and_curves_written_and_logged(store, tmp_path):
    out = tmp_path / "snli.parquet"
    folder = tmp_path / "analysis"
    result = invoke(store, "snli-rocktaschel", "--out", out, "--analysis", folder)
    assert result.exit_code == 0, result.output
    importance = pd.read_parquet(folder / "snli-rocktaschel" / "importance.parquet")
    # lr and the variant are what differs between the experiment's finished trials
    assert set(importance["param"]) == {"lr", "variant"}
    assert set(importance["evaluator"]) == {"fanova", "ped_anova"}
    for _, group in importance.groupby("evaluator"):
        assert group["importance"].sum() == pytest.approx(1.0)
    for stem in ("importance", "parallel_coordinates", "evp", "learning_curves"):
        for fmt in ("png", "pdf", "svg"):
            assert (folder / "snli-rocktaschel" / f"{stem}.{fmt}").stat().st_size > 1000
    logged = MlflowClient(store.uri).list_artifacts(store.parents["rock"], rs.ARTIFACT_ANALYSIS_DIR)
    assert f"{rs.ARTIFACT_ANALYSIS_DIR}/parallel_coordinates.png" in [a.path for a in logged]
