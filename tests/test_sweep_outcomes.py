"""Issue 27 item 7 through the real `orchestrate sweep` process: a time budget that runs out
before any trial ended leaves the sweep interrupted (resumable), never `completed` with nothing;
a sweep where no trial is selectable (every one diverged) exits 1 with one consistent summary.

Both join one Ray instance of the module (`--address`): what they check is the driver's ending,
not Ray's start."""

from __future__ import annotations

import shlex

import pytest
from testkit.cli import run_orchestrate
from testkit.ray_nodes import RayHead
from testkit.specs import write_spec
from testkit.store import runs_of

from results import run_schema as rs


@pytest.fixture(scope="module")
def ray_head(logs_dir):
    head = RayHead(num_cpus=2, logs=logs_dir)
    yield head
    head.stop()


def _sweep(ray_head, tmp_path, spec):
    return run_orchestrate(["sweep", str(spec), "--address", ray_head.address], cwd=tmp_path,
                           env={"NLI_DATA_DIR": str(tmp_path / "data-cache")})


def test_a_budget_spent_before_any_trial_ended_is_interrupted_not_completed(ray_head, tmp_path):
    """Issue 27: `time_budget_s: 10` spent during start-up gave a `completed` sweep with 0
    trials, exit 0, that could not be resumed. The budget now counts from the first trial's
    start; one that runs out before any trial ended leaves the sweep resumable.

    Issue 44: a budget shorter than an epoch never finished (each resume started epoch 1 again
    and got the budget again), and nothing said to raise it; the resume hint dropped the user's
    options (`--set name=...` here: without it the hint exits 2, no sweep to resume); the raised
    budget was then reported as a changed spec. The hint, run as printed with the budget raised
    as the sweep says, completes the sweep."""
    spec = write_spec(tmp_path, {
        "name": "budget-in-file", "training": {"epochs": 1},
        "search": {"time_budget_s": 0.5, "space": {"lr": {"grid": [0.001, 0.003]},
                                                   "dropout": {"grid": [0.0]}}},
    })
    env = {"NLI_DATA_DIR": str(tmp_path / "data-cache")}
    result = run_orchestrate(["sweep", str(spec), "--address", ray_head.address, "--set", "name=budget"],
                             cwd=tmp_path, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert "ran out before any trial ended; no trial finished an epoch in it" in output
    assert "add --set search.time_budget_s=SECONDS to the resume command" in output
    [hint] = [line for line in output.splitlines() if line.startswith("interrupted: ")]
    assert hint == (f"interrupted: 0/2 trials done; continue with: orchestrate sweep {spec} --resume "
                    f"--set name=budget --address {ray_head.address}")
    assert "selecting on dev" not in output and "Traceback" not in output
    [parent], children = runs_of(tmp_path, "budget")
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_INTERRUPTED
    assert parent.info.status == "KILLED"
    assert all(c.info.status == "KILLED" for c in children)
    assert rs.METRIC_TEST_ACCURACY not in parent.data.metrics

    command = shlex.split(hint.split("continue with: ", 1)[1])
    assert command[0] == "orchestrate"
    resumed = run_orchestrate([*command[1:], "--set", "search.time_budget_s=600"], cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "changed since" not in resumed.stderr
    [parent], children = runs_of(tmp_path, "budget")
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert sorted(c.info.status for c in children) == ["FINISHED", "FINISHED"]


def test_a_sweep_with_nothing_selectable_exits_1_with_one_consistent_summary(ray_head, tmp_path):
    """Issue 27: every trial diverged, yet exit 0, "0 failed" in the summary against "2 failed
    (of 2)" in the progress, and "selecting on dev, then evaluating on test"."""
    spec = write_spec(tmp_path, {
        "name": "all-diverged", "training": {"epochs": 2},
        "search": {"space": {"lr": {"grid": [1e10]}, "dropout": {"grid": [0.0, 0.2]}}},
    })
    result = _sweep(ray_head, tmp_path, spec)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "0 failed, 2 diverged (of 2)" in output
    assert "2 failed" not in output
    assert "selecting on dev" not in output
    assert "2 trials ended, none finished (failed or diverged): nothing to select" in output
    [summary] = [line for line in output.splitlines() if line.startswith("sweep finished:")]
    assert summary.startswith(
        "sweep finished: 2 trials (0 failed), 2 diverged (loss NaN/inf; never selected); no trial "
        "finished: nothing selected, no test evaluation; MLflow parent run ")
    [parent], children = runs_of(tmp_path, "all-diverged")
    assert parent.data.tags[rs.TAG_SWEEP_STATE] == rs.SWEEP_COMPLETED
    assert sorted(c.info.status for c in children) == ["FAILED", "FAILED"]
    assert not any(c.data.tags.get(rs.TAG_SELECTED) for c in children)


def test_normal_output_holds_the_sweeps_lines_only(ray_head, tmp_path):
    """Issue 44: Optuna's "A new study created in memory" and Tune's TensorBoard logger's "NaN or
    Inf found in input tensor." (a diverged trial's metrics) showed in a sweep's normal output;
    and one trial was counted as "1 finished trials". An Optuna sampler, one trial that diverges."""
    spec = write_spec(tmp_path, {"name": "one-diverged", "training": {"epochs": 1}}, replace_search={
        "sampler": "random", "num_samples": 1, "space": {"lr": {"loguniform": [1e10, 1e11]}},
        "seeds": [1], "resources": {"cpu": 1}})
    result = _sweep(ray_head, tmp_path, spec)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "diverged: the training loss became" in output  # the sweep's own line for it
    for foreign in ("A new study created", "NaN or Inf found", "[I ", "[W "):
        assert foreign not in output, output
    assert "1 trial ended, none finished" in output and "sweep finished: 1 trial (0 failed)" in output
    assert "trials ended" not in output and "1 trials" not in output
