"""`orchestrate models`: every registered model, and the paper rows with published and our |θ|M."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nli_models import model_names, paper_configs
from orchestrator.cli import main


def test_models_lists_every_registered_model_and_variant():
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    for name in model_names():
        assert name in result.output
    assert "word_by_word" in result.output and "abcnn3" in result.output


def test_models_json_reports_each_paper_configuration():
    result = CliRunner().invoke(main, ["models", "--json"])
    assert result.exit_code == 0, result.output
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
