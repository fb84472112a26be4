"""`orchestrate validate --estimate` against the sweep it estimates, on this machine (issue 28,
item 6): the estimate, run right before the sweep so that both meet the same load, is within 30%
of the sweep's measured wall time, on the quickstart and on a paper spec shrunk with `--set`.
What it measured is kept for `submit --slurm --time` (issue 29): a time limit that leaves less
than the measured start-up and one epoch is warned about with those numbers.

Timings and the load are printed (`pytest -s`); the load moves with whatever else runs here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from testkit import REPO
from testkit.cli import run_orchestrate, start_orchestrate
from testkit.processes import assert_processes_gone, wait_while_driving
from testkit.specs import write_spec

from orchestrator.ray_adapter.reaper import descendants

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.serial]

TOLERANCE = 0.30


def estimate_then_sweep(spec: Path, options: list[str], cwd: Path) -> tuple[float, float, str]:
    """(estimated s, measured s, the estimate's output): validate --estimate, then the sweep."""
    env = {"XDG_CACHE_HOME": str(cwd / "cache"), "RAY_ADDRESS": None, "MLFLOW_TRACKING_URI": None}
    validated = run_orchestrate(["validate", str(spec), "--estimate", *options], cwd, env, timeout=1200)
    assert validated.returncode == 0, validated.stderr
    found = re.search(r"^estimate: .* \((\d+) s\) for the whole sweep on this machine = ",
                      validated.stdout, re.M)
    assert found, validated.stdout
    started = time.monotonic()
    swept = run_orchestrate(["sweep", str(spec), *options], cwd, env, timeout=1200)
    measured = time.monotonic() - started
    assert swept.returncode == 0, swept.stderr
    print(f"{spec.name}: estimate {found[1]} s, sweep {measured:.0f} s, load {os.getloadavg()}")
    return float(found[1]), measured, validated.stdout


def assert_within_tolerance(estimated: float, measured: float, output: str) -> None:
    assert abs(estimated - measured) <= TOLERANCE * measured, (
        f"estimate {estimated:.0f} s, sweep {measured:.0f} s\n{output}")


def test_the_quickstart_estimate_is_within_30_percent_and_informs_submit(tmp_path):
    spec = REPO / "search_spaces" / "quickstart.yaml"
    estimated, measured, output = estimate_then_sweep(spec, [], tmp_path)
    assert_within_tolerance(estimated, measured, output)
    # The arithmetic is stated: the waves follow the CPUs and the cap, the pilot ran here.
    cpus = len(os.sched_getaffinity(0))
    slots = min(cpus, 2)  # quickstart: resources.cpu 1, max_concurrent_trials 2
    assert f"waves: 8 trials, {slots} at once ({cpus} CPUs / 1.0 per trial" in output
    assert f"pilot sweep (run now: {slots + 1} trials of the first configuration" in output
    assert "assumes: every trial runs all its epochs" in output
    probe = re.search(r"probe: first configuration (\{.*\}), 1 torch thread", output)
    assert probe and "'lr': 0.001, 'dropout': 0.0, 'hidden_size': 50, 'seed': 1" in probe[1]
    # The pilot ran on a store of its own: the user's holds the one sweep.
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "quickstart"]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.data.tags.get("nli.role") for run in runs) == ["sweep"] + ["trial"] * 8
    assert not list(tmp_path.rglob("pilot*"))

    # submit --slurm --time checks against what the estimate measured.
    [record] = [json.loads(line) for line in
                (tmp_path / "cache" / "nli-orchestrator" / "estimates.jsonl").read_text().splitlines()]
    startup, epoch = record["startup_s"], record["epoch_s"]
    assert 0 < epoch < startup < measured, record

    def submit(limit_s: int) -> str:
        result = run_orchestrate(
            ["submit", str(spec), "--slurm", "--dry-run", "--time", f"{limit_s // 60}:{limit_s % 60:02d}",
             "--signal-before", "60", "--tracking-uri", "http://mlflow.cluster.example:5000"],
            tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "cache")})
        assert result.returncode == 0, result.stderr
        return result.stderr

    short = int(60 + startup + epoch / 2)
    warned = submit(short)
    assert (f"warning: --time {short // 60}:{short % 60:02d} leaves {max(short - 60 - startup, 0):.0f}s to "
            f"train per allocation after --signal-before 60s and {startup:.0f}s to start Ray and "
            f"the sweep, less than one epoch ({epoch:.0f}s; both measured by `orchestrate "
            f"validate SPEC --estimate` on ") in warned, warned
    roomy = int(60 + startup + 2 * epoch + 2)
    assert "to train per allocation" not in submit(roomy)


def test_a_shrunk_paper_spec_estimate_is_within_30_percent(tmp_path, shared_data):
    """snli_wbw (Rocktäschel et al.'s word-by-word attention) on the real SNLI train sample and
    500 dev and test pairs, 4 trials of 2 epochs, no pretrained vectors (not available here)."""
    spec = REPO / "search_spaces" / "snli_wbw.yaml"
    options = [
        "--data-dir", str(shared_data),
        "--set", "data.files.train=snli_1.0/snli_1.0_train_sample.jsonl",
        "--set", "data.max_examples={dev: 500, test: 500}",
        "--set", "data.vectors=null",
        "--set", "training.epochs=2",
        "--set", "search.space={lr: {grid: [0.0003, 0.001]}, dropout: {grid: [0.0, 0.2]}}",
    ]
    estimated, measured, output = estimate_then_sweep(spec, options, tmp_path)
    assert_within_tolerance(estimated, measured, output)
    assert "waves: 4 trials" in output


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # it ended meanwhile
        return []


def test_sigterm_during_the_pilot_stops_it_and_says_so(tmp_path, monkeypatch):
    """The pilot is a sweep of its own: a SIGTERM to `validate --estimate` stops it too, and
    leaves neither its processes nor its throw-away store behind."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spec = write_spec(tmp_path)
    log = tmp_path / "validate.log"
    validating = start_orchestrate(["validate", str(spec), "--estimate"], tmp_path, log)

    def pilot_folders():
        return {word.removesuffix("/pilot.yaml") for pid in descendants(validating.pid)
                for word in command_line(pid) if word.endswith("/pilot.yaml")}

    [folder] = wait_while_driving(pilot_folders, validating, log, "the pilot sweep to start")
    every = descendants(validating.pid)
    validating.send_signal(signal.SIGTERM)
    assert validating.wait(timeout=300) == 1, log.read_text()
    assert "error: stopped by SIGTERM: the pilot sweep was stopped" in log.read_text()
    assert_processes_gone(every, timeout=60)
    assert not Path(folder).exists()
    assert not (tmp_path / "cache").exists() and "estimate:" not in log.read_text()

