"""`orchestrate report`: one self-contained page per experiment, read as a reviewer would, in a
real headless Chromium, from a real MLflow store (the fake sweeps of test_results_cli, one of
them given the provenance records a sweep writes)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from mlflow import MlflowClient
from test_results_cli import store  # noqa: F401  (the module's store fixture)
from testkit.browser import screenshot
from testkit.cli import orchestrate

from results import run_schema as rs
from results.results_commands import report_command

DATA = {
    "corpus": "snli",
    "files": {"train": {"path": "/data/snli_1.0_train.jsonl", "sha256": "ab" * 32, "bytes": 467_000_000}},
    "splits": {"train": 550_152, "dev": 9_842, "test": 9_824},
    "labels": ["entailment", "neutral", "contradiction"],
    "vocabulary_size": 36_990,
    "vectors": {"source": "glove.840B.300d.txt"},
    "embedding_dim": 300,
    "vector_coverage": 0.91,
    "config": {"corpus": "snli"},
}
ENVIRONMENT = {
    "python": "3.11.9", "packages": {"torch": "2.13.0", "ray": "2.60.0", "mlflow": "3.17.2"},
    "cpu_count": 16, "memory_bytes": 128 * 2**30, "device": "cuda", "gpus": ["NVIDIA H100"],
}


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):  # noqa: F811
    client = MlflowClient(store.uri)
    client.log_text(store.parents["rock"], json.dumps(DATA), rs.ARTIFACT_DATA_RECORD)
    client.log_text(store.parents["rock"], json.dumps(ENVIRONMENT), rs.ARTIFACT_ENVIRONMENT)
    client.set_tag(store.parents["rock"], rs.TAG_GIT_COMMIT, "0123456789abcdef" * 2)
    client.set_tag(store.parents["rock"], rs.TAG_GIT_DIRTY, "true")
    client.set_tag(store.parents["rock"], rs.TAG_TRIAL_DEVICES, "cuda:0 (NVIDIA H100) x6")
    client.log_metric(store.parents["rock"], rs.METRIC_BEST_DEV_ACCURACY, 0.84)  # the old name
    out = tmp_path_factory.mktemp("report")
    result = CliRunner().invoke(
        report_command,
        ["snli-rocktaschel", "snli-decomposable", "--out", str(out), "--tracking-uri", store.uri],
    )
    assert result.exit_code == 0, result.output
    return out


def test_page_is_self_contained_and_has_every_section(report):
    page = (report / "snli-rocktaschel.html").read_text()
    sources = re.findall(r'src="([^"]*)"', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<link" not in page and "<script" not in page  # nothing fetched from elsewhere
    for title in ("Provenance", "Data", "Hyperparameter search", "Selection protocol", "Results",
                  "Pareto front", "Analysis of the search", "Per-class accuracy and confusion",
                  "McNemar test between the top models", "Reproducibility checklist"):
        assert f">{title}" in page, title
    # evp (trials, hours), the Pareto front, importance, parallel coordinates, curves, two
    # confusion matrices
    assert len(sources) == 8


def test_provenance_and_data_come_from_the_record(report):
    page = (report / "snli-rocktaschel.html").read_text()
    assert "0123456789ab" in page and "uncommitted changes" in page  # the dirty flag warns
    assert "<th>spec hash</th>" in page and "<td>spec-hash</td>" in page  # nli.spec_hash
    assert "NVIDIA H100" in page and "torch 2.13.0" in page
    # What the trials trained on (their own record), not environment.json's "device" guess.
    assert "<td>cuda:0 (NVIDIA H100) x6</td>" in page
    assert "trials on cuda:0 (NVIDIA H100) x6" in page
    # the sweep's summary metric, read under its old name (this store predates sweep.*)
    assert "<td>84.00 / -</td>" in page
    assert "ab" * 32 in page and "467,000,000 B" in page  # the file's SHA-256 and size
    assert "train 550,152" in page and "36,990 words" in page and "91.0%" in page


def test_results_per_class_mcnemar_and_checklist(report):
    page = (report / "snli-rocktaschel.html").read_text()
    assert "82.00 ± 2.00" in page and "[77.03, 86.97]" in page  # mean ± std, 95% CI
    assert "Student-t interval of the mean" in page and "one seed: no std" not in page  # several seeds
    assert "Caveat</strong>: importance from" in page  # a handful of trials: importance is rough
    assert "majority class (entailment)" in page
    assert "76.92" in page  # word-by-word's per-class test accuracy on contradiction (10/13)
    assert "exact binomial" in page  # McNemar between the top two rows on dev
    for item in ("B6", "C1", "C2", "C3", "C4"):
        assert f"<strong>{item}</strong>" in page
    assert page.count("needs the authors") == 4


def test_missing_records_are_said_so(report):
    """snli-decomposable's sweeps logged no provenance and its selection was never tested."""
    page = (report / "snli-decomposable.html").read_text()
    assert "not recorded (the sweeps predate" in page
    assert "Test predictions: not recorded" in page  # its selected configuration was never tested
    assert "Fewer than two models with test predictions" in page


def test_markdown_beside_it_with_its_images(report):
    markdown = (report / "snli-rocktaschel.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert len(images) == 8
    assert all((report / path).read_bytes().startswith(b"\x89PNG") for path in images)
    assert "| corpus | model |" in markdown


def test_page_renders_in_a_browser(report):
    shot = screenshot(
        (report / "snli-rocktaschel.html").as_uri(), report / "page.png", budget_ms=5_000
    )
    assert shot.stat().st_size > 50_000


def test_unknown_experiment_is_a_usage_error_and_writes_nothing(store, tmp_path):  # noqa: F811
    out = tmp_path / "report"  # through `orchestrate`, whose one handler turns bad input into exit 2
    result = orchestrate("report", "no-such-sweep", "--out", str(out), "--tracking-uri", store.uri)
    assert result.returncode == 2
    assert "error: unknown experiment(s): no-such-sweep" in result.stderr
    assert not out.exists()


def test_selection_protocol_says_what_ran_refit_layerwise_epochs_patience():
    """A refit sweep's test number is the retrain's, not the best dev epoch's: the section says
    so per row, with the budget, patience and layerwise phases, and the refit's epochs and time."""
    from types import SimpleNamespace

    import pyarrow as pa

    from results.report_page import to_markdown
    from results.report_record import Record
    from results.report_sections import selection_section

    refit = {"epochs": "20", "max_steps": "None", "patience": "3", "layerwise": "True",
             "refit_on_train_dev": "True"}
    plain = {**refit, "layerwise": "False", "refit_on_train_dev": "False", "patience": "None",
             "max_steps": "50000000"}
    table = pa.table({
        "model_config": ["abcnn/abcnn3 num_blocks=2", "decomposable/vanilla", "old"],
        "protocol": [json.dumps(refit), json.dumps(plain), None],
    })
    sweep = SimpleNamespace(
        info=SimpleNamespace(run_id="0123456789abcdef"),
        data=SimpleNamespace(metrics={rs.METRIC_SWEEP_REFIT_EPOCHS: 14.0,
                                      rs.METRIC_SWEEP_REFIT_TIME: 81.25}),
    )
    record = Record(None, [sweep], [], table, {}, {}, {})
    text, _ = to_markdown("t", "s", [selection_section(record)], "files")
    abcnn, decomposable, old, refit_line = [
        line for line in text.splitlines() if line.startswith("- ")
    ]
    assert "at most 20 epochs; early stopping after 3 epochs" in abcnn
    assert "layerwise: one phase per block" in abcnn
    assert "retrained on train + dev for its best epoch count" in abcnn
    assert "not those of the best dev epoch" in abcnn and "phase boundary is still chosen" in abcnn
    assert "or 50,000,000 optimizer steps" in decomposable and "no early stopping" in decomposable
    assert "test: the best-dev-epoch weights" in decomposable and "layerwise" not in decomposable
    assert "not recorded" in old
    assert refit_line == "- sweep 0123456789ab: the refit of its best run trained 14 epochs in 81.2 s"
    assert "weights are those of its best dev epoch" not in text
