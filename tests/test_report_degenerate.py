"""Issue 27 items 1 and 2 through the real `orchestrate` process on a store of fake sweeps
(test_results_cli's helpers): sweeps an analysis cannot be computed for (every trial ties, one
trial, every trial failed, one value per hyperparameter) still give the table and the report,
with a note; experiment names, params and tags holding HTML or path parts cannot write outside
--out nor reach the Markdown as markup."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from test_results_cli import WBW, Seed, log_config, start_sweep
from testkit.cli import run_orchestrate

from results import run_schema as rs
from results.atomic_files import file_stem

SCRIPT = "<script>alert(1)</script>"
IMAGE = "<img src=x onerror=alert(2)>"
HOSTILE = f"../../{SCRIPT}"  # an experiment named on a shared server by someone else
# experiment -> its configurations: (lr, seeds)
DEGENERATE = {
    "ties": [(0.001, [Seed(1, 0.5)]), (0.003, [Seed(1, 0.5)]), (0.01, [Seed(1, 0.5)])],
    "one-trial": [(0.001, [Seed(1, 0.6)])],
    "all-failed": [(0.001, [Seed(1, None, status="FAILED")]),
                   (0.003, [Seed(1, None, status="FAILED")])],
    "one-value": [(0.001, [Seed(1, 0.6), Seed(2, 0.7)])],  # only the seed differs
}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("degenerate")
    uri = f"sqlite:///{root}/mlruns.db"
    client = MlflowClient(tracking_uri=uri)
    for name, configurations in DEGENERATE.items():
        experiment = client.create_experiment(name, artifact_location=str(root / "artifacts"))
        parent = start_sweep(client, experiment, name)
        for lr, seeds in configurations:
            log_config(client, experiment, parent, {**WBW, "lr": lr}, seeds, False, root / "scratch")
    experiment = client.create_experiment(HOSTILE, artifact_location=str(root / "artifacts"))
    parent = start_sweep(client, experiment, HOSTILE)
    client.set_tag(parent, rs.TAG_HOST, IMAGE)
    for lr, dev in ((0.001, 0.6), (0.003, 0.7)):
        log_config(client, experiment, parent, {**WBW, "variant": IMAGE, "lr": lr},
                   [Seed(1, dev, test=dev)], lr == 0.003, root / "scratch")
    return uri


def _env(tmp_path: Path) -> dict:
    return {"MLFLOW_DISABLE_TELEMETRY": "true", "TMPDIR": str(tmp_path)}


def test_report_of_degenerate_sweeps_says_what_it_could_not_compute(store, tmp_path):
    out = tmp_path / "report"
    result = run_orchestrate(["report", *DEGENERATE, "--out", str(out), "--tracking-uri", store],
                             cwd=tmp_path, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for name in DEGENERATE:
        page = (out / f"{name}.html").read_text()
        markdown = (out / f"{name}.md").read_text()
        assert "Results" in page and "| corpus | model |" in markdown
        assert "Importance: not computed" in page and "Importance: not computed" in markdown
    ties = (out / "ties.md").read_text()
    assert "all 3 finished trials have the same best dev accuracy" in ties
    assert "fewer than two finished trials" in (out / "one-trial.md").read_text()
    assert "fewer than two finished trials" in (out / "all-failed.md").read_text()
    assert "no hyperparameter took two values" in (out / "one-value.md").read_text()


def test_results_analysis_of_degenerate_sweeps_writes_the_table_and_warns(store, tmp_path):
    out = tmp_path / "tables" / "degenerate.parquet"
    analysis = tmp_path / "analysis"
    result = run_orchestrate(
        ["results", *DEGENERATE, "--out", str(out), "--analysis", str(analysis),
         "--tracking-uri", store], cwd=tmp_path, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert set(pq.read_table(out).column("experiment").to_pylist()) >= {"ties", "one-trial"}
    assert ("warning: ties: importance not computed: all 3 finished trials have the same best "
            "dev accuracy") in result.stderr
    for name in DEGENERATE:
        assert (analysis / name / "importance.parquet").is_file()
    assert (analysis / "ties" / "parallel_coordinates.png").is_file()


def test_report_of_a_hostile_experiment_name_stays_in_out_and_escapes_markup(store, tmp_path):
    out = tmp_path / "deep" / "er" / "report"
    result = run_orchestrate(["report", HOSTILE, "--out", str(out), "--tracking-uri", store],
                             cwd=tmp_path, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    stem = file_stem(HOSTILE)
    assert "/" not in stem and not stem.startswith(".")
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert written and all(p.parts[:3] == ("deep", "er", "report") for p in written), written
    assert (out / f"{stem}.html").is_file() and (out / f"{stem}_files").is_dir()
    page = (out / f"{stem}.html").read_text()
    markdown = (out / f"{stem}.md").read_text()
    for raw in (SCRIPT, IMAGE):
        assert raw not in page and raw not in markdown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markdown  # shown, as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in markdown
    assert markdown.count("<") == 0  # no tag of any kind


def test_results_analysis_folder_of_a_hostile_name_stays_inside(store, tmp_path):
    analysis = tmp_path / "a" / "b" / "analysis"
    result = run_orchestrate(
        ["results", HOSTILE, "--out", str(tmp_path / "t.parquet"), "--analysis", str(analysis),
         "--tracking-uri", store], cwd=tmp_path, env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    folders = [p for p in tmp_path.rglob("*") if p.is_dir()]
    assert all(p == tmp_path / "a" or p == tmp_path / "a" / "b" or analysis in (p, *p.parents)
               for p in folders), folders
    assert (analysis / file_stem(HOSTILE) / "importance.parquet").is_file()
    assert os.listdir(analysis) == [file_stem(HOSTILE)]
