"""`orchestrate models`: every registered model, and the paper rows with published and our |θ|M."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from testkit.cli import ORCHESTRATE, orchestrate

from nli_models import model_names, paper_configs
from orchestrator.cli.model_catalog import compute_catalog, shipped_catalog

pytestmark = pytest.mark.unit


def test_models_lists_every_registered_model_and_variant():
    result = orchestrate("models")
    assert result.returncode == 0, result.output
    for name in model_names():
        assert name in result.output
    assert "word_by_word" in result.output and "abcnn3" in result.output
    assert "ours |θ|W+M" in result.output
    wbw = next(line for line in result.output.splitlines() if "Word-by-word attention (k=100)" in line)
    assert wbw.split()[-2:] == ["252,103", f"{252_103 + 12_100 * 300:,}"]  # |θ|M, |θ|W+M


def test_the_shipped_catalog_is_what_the_models_count_today():
    """model_catalog.json is read instead of building two dozen models; it must match them.
    On a mismatch: python -m orchestrator.cli.model_catalog rewrites it."""
    assert shipped_catalog() == json.loads(json.dumps(compute_catalog()))


def test_models_answers_within_3_seconds(tmp_path):
    """The real command, best of 3: it reads the shipped catalog and imports no torch."""
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        result = subprocess.run([ORCHESTRATE, "models"], capture_output=True, text=True, cwd=tmp_path,
                                timeout=120)
        timings.append(time.perf_counter() - started)
        assert result.returncode == 0 and "|θ|W+M" in result.stdout, result.stderr
    assert min(timings) <= 3, timings


def test_models_json_reports_each_paper_configuration():
    result = orchestrate("models", "--json")
    assert result.returncode == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == len(paper_configs())
    for row in rows:
        assert set(row) >= {"name", "config", "paper", "table_row", "published_theta_m", "theta_m", "theta_wm"}
        assert row["theta_m"] > 0
        if row["paper"] in ("parikh2016", "yin2016"):  # every embedding row fixed
            assert row["theta_wm"] == row["theta_m"], row
        else:  # 12.1k tuned OOV rows (Rocktäschel footnote 1) add to |θ|W+M
            tuned = row["theta_wm"] - row["theta_m"]
            assert tuned == 12_100 * row["config"]["embedding_dim"], row
        published = row["published_theta_m"]
        if published and not row["notes"]:
            assert abs(row["theta_m"] - published) / published <= 0.02, row
    wbw = next(r for r in rows if r["table_row"].startswith("Table 1: Word-by-word attention (k=100)"))
    assert wbw["name"] == "rocktaschel" and wbw["config"]["variant"] == "word_by_word"
    assert wbw["published_theta_m"] == 252_000
