"""The project's GPU check (benchmarks/gpu_check.py, `make gpu-check`).

CI has no GPU: it runs the check's CPU dry run (tiny sizes, the same code) as a bare GPU machine
would run it, with Ray, MLflow, Optuna, pandas, pytest and the orchestrator made unimportable: every
pure-torch check passes and the sweep is SKIP, naming what is missing. The sweep part runs on its
own where Ray is present (0 GPUs on CPU). The tests marked ``gpu`` run the same check functions on
CUDA and are skipped, saying so, without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import (
    B32_FP32_GOALS,
    CHECKED,
    GPU_SIZES,
    PRECISIONS,
    Row,
    check_checkpoint,
    check_determinism,
    check_goals,
    check_graphs_match_eager,
    check_training,
    main,
    packed_rates,
)

REPO = Path(__file__).resolve().parents[1]
# What a bare GPU machine lacks: the check must not import any of it.
ABSENT = ("ray", "mlflow", "optuna", "pandas", "pyarrow", "scipy", "matplotlib", "click", "pytest",
          "orchestrator", "results")
BARE_MACHINE = (
    "import runpy, sys\n"
    f"sys.modules.update(dict.fromkeys({ABSENT!r}))\n"
    "sys.argv[0] = 'gpu_check'\n"
    "runpy.run_module('benchmarks.gpu_check', run_name='__main__')\n"
)


def run_check(*args: str, bare: bool, timeout: float = 900) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", BARE_MACHINE, *args] if bare else [sys.executable, "-m", "benchmarks.gpu_check", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def rows_of(out: Path) -> dict[str, dict]:
    return {row["check"]: row for row in json.loads((out / "summary.json").read_text())}


def test_the_cpu_dry_run_passes_on_a_machine_with_only_torch_and_nli_models(tmp_path):
    done = run_check("--device", "cpu", "--out", str(tmp_path), bare=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = rows_of(tmp_path)
    expected = [f"train.{m}.{p}" for m in CHECKED for p in PRECISIONS]
    expected += [f"checkpoint.{m}" for m in CHECKED]
    expected += [f"determinism.{m}.{p}" for m in CHECKED for p in PRECISIONS]
    for check in expected:
        assert rows[check]["status"] == "PASS", rows.get(check)
    for model in CHECKED:
        for precision in PRECISIONS:
            measured = rows[f"step.{model}.b32.{precision}.eager"]["data"]
            assert measured["pairs_per_s"] > 0 and measured["pairs"] >= 32
            graphs = rows[f"step.{model}.b32.{precision}.graphs"]
            assert graphs["status"] == "SKIP" and "need a CUDA device" in graphs["detail"]
        assert rows[f"graphs_match.{model}"]["status"] == "SKIP"
    assert rows["packing"]["status"] == "SKIP"
    stacking = rows["stacking.rates"]["data"]
    assert stacking["members"] == 4 and stacking["solo_pairs_per_s"] > 0 and stacking["stack_pairs_per_s"] > 0
    assert rows["stacking.rates"]["status"] == "INFO" and "a stack of 4" in rows["stacking.rates"]["detail"]
    assert rows["stacking.one_at_a_time"]["status"] == "INFO"  # the goal is judged on a GPU only
    assert rows["stacking.seeds"]["status"] == "INFO" and rows["stacking.seeds"]["data"]["ratio"] > 0
    assert rows["sweep"]["status"] == "SKIP" and "ray" in rows["sweep"]["detail"]
    assert "| train.cam.bf16 | PASS |" in (tmp_path / "summary.md").read_text()
    assert rows["environment"]["data"]["missing_packages"] == ["ray", "mlflow", "optuna", "pandas"]


def test_no_check_starts_once_the_budget_is_spent(tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # main() sets it for the process
    assert main(["--device", "cpu", "--budget-s", "0", "--out", str(tmp_path)]) == 0
    rows = rows_of(tmp_path)
    checks = [r for name, r in rows.items() if name not in ("environment", "total")]
    # train, checkpoint, determinism, step (eager and graphs), graphs_match, packing, stacking, sweep
    assert len(checks) == 4 * 2 + 4 + 4 * 2 + 4 * 2 * 2 + 4 + 1 + 1 + 1
    assert all(r["status"] == "SKIP" and "budget of 0 s was spent" in r["detail"] for r in checks)


def _step_row(model, batch_size, precision, pairs_per_s):
    return Row(f"step.{model}.b{batch_size}.{precision}.graphs", "INFO", "",
               {"model": model, "batch_size": batch_size, "precision": precision, "mode": "graphs",
                "pairs_per_s": pairs_per_s})


def test_a_missed_goal_is_a_fail_row():
    """b32 fp32 at the goal passes, below it fails; b128 under 3x b32 and bf16 under fp32 fail."""
    goal = B32_FP32_GOALS["decomposable"]
    rows = [_step_row("decomposable", 32, "fp32", goal), _step_row("decomposable", 128, "fp32", 2.9 * goal),
            _step_row("decomposable", 32, "bf16", goal * 1.1), _step_row("decomposable", 128, "bf16", 2.8 * goal),
            _step_row("cam", 32, "fp32", B32_FP32_GOALS["cam"] - 1)]
    status = {r.check: r.status for r in check_goals(rows)}
    assert status == {"goal.decomposable.b32": "PASS", "goal.decomposable.b128": "FAIL",
                      "goal.decomposable.b32.bf16": "PASS", "goal.decomposable.b128.bf16": "FAIL",
                      "goal.cam.b32": "FAIL"}


def test_packed_trial_processes_wait_for_each_other_and_report_their_rates():
    """The packing check's processes, on the CPU: each trains after all are ready, and each
    count adds to the aggregate."""
    rates, failed = packed_rates("cpu", (1, 2), seconds=1.0)
    assert not failed, failed[0].detail
    assert set(rates) == {1, 2} and all(rate > 0 for rate in rates.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_exits_2_saying_so(tmp_path):
    done = run_check("--out", str(tmp_path), bare=True, timeout=120)
    assert done.returncode == 2
    assert "--device cuda but torch" in done.stderr and "--device cpu for a dry run" in done.stderr
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.ray
@pytest.mark.slow
def test_the_sweep_part_runs_two_trials_at_once(tmp_path):
    """On CPU with 0 GPUs per trial: the same command as on a GPU with 0.5 each."""
    done = run_check("--device", "cpu", "--only", "sweep", "--out", str(tmp_path), bare=False)
    rows = rows_of(tmp_path)
    assert done.returncode == 0, json.dumps(rows, indent=1)
    assert rows["sweep.exit"]["status"] == "PASS"
    assert rows["sweep.two_at_once"]["status"] == "PASS", rows["sweep.two_at_once"]


# -- on a GPU ------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@pytest.fixture(scope="module")
def gpu_toy(tmp_path_factory):
    from nli_models.data import prepare_data

    return prepare_data({"corpus": "toy", "toy": {"size": GPU_SIZES.toy_pairs, "seed": 0}},
                        cache_dir=tmp_path_factory.mktemp("prepared"))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model", list(CHECKED))
def test_each_model_trains_on_cuda(model, precision, gpu_toy):
    row = check_training(model, precision, "cuda", GPU_SIZES, gpu_toy)
    assert row.status == "PASS", row.detail


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("model", list(CHECKED))
def test_a_checkpoint_saved_on_cuda_loads_on_cuda(model, gpu_toy, tmp_path):
    row = check_checkpoint(model, "cuda", GPU_SIZES, gpu_toy, tmp_path)
    assert row.status == "PASS", row.detail


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model", list(CHECKED))
def test_deterministic_cuda_runs_are_bit_identical(model, precision, gpu_toy):
    row = check_determinism(model, precision, "cuda", GPU_SIZES, gpu_toy)
    assert row.status == "PASS", row.detail


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("model", list(CHECKED))
def test_cuda_graphs_train_as_eager_training_does(model):
    from benchmarks.common import Context
    from benchmarks.throughput import make_pool, select_batches

    pool, _ = make_pool(Context())
    row = check_graphs_match_eager(model, "cuda", GPU_SIZES, select_batches(pool, 4, 32))
    assert row.status == "PASS", row.detail
