"""`validate --estimate`'s GPU-hours: the trials' share of a GPU over their estimated time, only
from a probe that trained on CUDA (the sweep-against-estimate tests are tests/test_estimate.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def _estimate(device: str):
    from orchestrator.sweep.estimate import Estimate, Pilot, Probe

    probe = Probe(params={}, threads=1, device=device, train_s_per_example=1e-3, dev_s_per_example=1e-4,
                  configurations=1, mean_train_s_per_example=1e-3, mean_dev_s_per_example=1e-4)
    pilot = Pilot(trials=2, wall_s=30.0, first_trial_s=10.0, fixed_s=12.0, epoch_s=1.0, first_start_s=2.0,
                  later_start_s=1.0, evaluations=1)
    return Estimate(probe=probe, pilot=pilot, batch_size=32, train_examples=10_000, dev_examples=1_000,
                    test_examples=1_000, epochs=5, trials=36, slots=8, evaluations=1, refit=False,
                    cpus=16, gpus=1)


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
