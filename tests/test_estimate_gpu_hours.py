"""`validate --estimate`'s arithmetic: GPU-hours, the trials' share of a GPU over their estimated
time, only from a probe that trained on CUDA; a stacked sweep's waves of stacks at its probed
stacks' speed (the sweep-against-estimate tests are tests/test_estimate.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def _estimate(device: str, stacks: int = 0, tune_trials: int = 36):
    from orchestrator.sweep.estimate import Estimate, Pilot
    from orchestrator.sweep.estimate_probe import Probe

    probe = Probe(params={}, threads=1, device=device, train_s_per_example=1e-3, dev_s_per_example=1e-4,
                  configurations=1, mean_train_s_per_example=1e-3, mean_dev_s_per_example=1e-4,
                  stacks=stacks, stack_members=8 * bool(stacks), stack_train_s_per_example=3e-3,
                  stack_dev_s_per_example=2e-4)
    pilot = Pilot(trials=2, wall_s=30.0, first_trial_s=10.0, fixed_s=12.0, epoch_s=1.0, first_start_s=2.0,
                  later_start_s=1.0, evaluations=1)
    return Estimate(probe=probe, pilot=pilot, batch_size=32, train_examples=10_000, dev_examples=1_000,
                    test_examples=1_000, epochs=5, trials=36, slots=8, tune_trials=tune_trials, evaluations=1,
                    refit=False, cpus=16, gpus=1)


def test_gpu_hours_are_the_trials_gpu_share_of_their_time_and_only_from_a_gpu_probe():
    on_gpu = _estimate("cuda:0")
    hours = on_gpu.gpu_hours(0.125)
    assert hours == pytest.approx((36 * on_gpu.trial_s + on_gpu.selection_s) * 0.125 / 3600)
    assert on_gpu.gpu_hours(0.25) == pytest.approx(2 * hours)
    assert _estimate("cpu").gpu_hours(0.125) is None and on_gpu.gpu_hours(0) is None


def test_the_estimate_says_gpu_hours_or_why_not(tmp_path):
    from testkit.specs import QUICKSTART_PATH

    from orchestrator.sweep.spec import load_spec

    spec = load_spec(QUICKSTART_PATH)
    search = spec.search.model_copy(update={"resources": spec.search.resources.model_copy(update={"gpu": 0.125})})
    spec = spec.model_copy(update={"search": search})
    hours = _estimate("cuda:0").gpu_hours(0.125)
    assert f"GPU-hours: {hours:.2f} (36 trials" in _estimate("cuda:0").describe(spec)
    assert "GPU-hours: not estimated: the probe trained on cpu" in _estimate("cpu").describe(spec)


def test_a_stacked_sweep_is_estimated_as_waves_of_its_stacks_at_the_probed_stacks_speed():
    """36 configurations as 5 stacks of up to 8 (snli_wbw with stack: 8): one wave of 5 stacked
    trials, each epoch the probed stacks' mean time slowed as the pilot's trials were; the GPU
    holds 5 stacked trials, not 36 trials."""
    from testkit.specs import QUICKSTART_PATH

    from orchestrator.sweep.spec import load_spec

    unstacked, stacked = _estimate("cuda:0"), _estimate("cuda:0", stacks=3, tune_trials=5)
    assert (unstacked.waves, stacked.waves) == (5, 1)
    assert stacked.slowdown == unstacked.slowdown  # the pilot's trials against the first configuration alone
    assert stacked.epoch_s == pytest.approx(stacked.slowdown * (3e-3 * 10_000 + 2e-4 * 1_000))
    assert stacked.selection_s == unstacked.selection_s  # a selected member is tested as a solo trial
    assert stacked.gpu_hours(1) == pytest.approx((5 * stacked.trial_s + stacked.selection_s) / 3600)
    spec = load_spec(QUICKSTART_PATH)
    on_gpus = spec.search.resources.model_copy(update={"gpu": 0.125})
    spec = spec.model_copy(update={"search": spec.search.model_copy(update={"stack": 8, "resources": on_gpus})})
    said = stacked.describe(spec)
    assert "waves: 36 trials as 5 stacked trials (search.stack 8), 8 at once" in said
    assert ("mean over the 3 stack(s) probed (up to 8 members), each alone: 3.000 ms per train example, "
            "0.200 ms per dev example") in said
    assert "a stacked trial trains at the probed stacks' mean speed" in said
    assert "GPU-hours: " in said and "(5 stacked trials x " in said


def test_the_probe_trains_a_stacked_sweeps_stacks(toy, one_thread):
    """The quickstart with stack: 4 is 2 stacks (hidden_size 50 and 100, lr x dropout each): the
    probe trains both (StackedTrainer), and a stack of 4 takes longer per example than one trial."""
    from testkit.specs import QUICKSTART_PATH

    from orchestrator.sweep.estimate_probe import run_probe
    from orchestrator.sweep.spec import load_spec

    spec = load_spec(QUICKSTART_PATH)
    spec = spec.model_copy(update={"search": spec.search.model_copy(update={"stack": 4})})
    probe = run_probe(spec, toy)
    assert (probe.stacks, probe.stack_members) == (2, 4)
    assert probe.stack_train_s_per_example > probe.mean_train_s_per_example > 0
    assert probe.stack_dev_s_per_example > 0
    assert run_probe(load_spec(QUICKSTART_PATH), toy).stacks == 0
