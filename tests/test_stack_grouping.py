"""How a sweep's grid becomes stacks (search.stack; orchestrator/ray_adapter/stacks.py), on the
shipped specs as docs/sweeps.md describes it: configurations that differ only in lr, l2,
adagrad_accumulator, dropout or seed share a stack; `N` stacks seeds, `auto` only where trials
have a GPU; without one `auto` stacks only ABCNN; an Optuna sampler stacks where it searches
nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nli_models.config import ConfigError
from orchestrator.ray_adapter.ray_search import grid_points, param_space
from orchestrator.ray_adapter.ray_trial import trial_params
from orchestrator.ray_adapter.stacks import group_stacks
from orchestrator.sweep.spec import load_spec

pytestmark = pytest.mark.unit

SPECS = Path(__file__).resolve().parents[1] / "search_spaces"


def _spec(tmp_path: Path, name: str, training: dict | None = None, **search):
    raw = yaml.safe_load((SPECS / f"{name}.yaml").read_text())
    raw["search"].update(search)
    raw["training"].update(training or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


def _stacks(spec, slots: int | None = None) -> list[list[dict]]:
    size, why = spec.stacking(slots)
    assert why is None, why
    search = spec.search.model_dump()
    return [[trial_params(member, search) for member in stack]
            for stack in group_stacks(grid_points(param_space(spec)), search, size, spec.stacked_fields())]


def test_stack_36_makes_the_word_by_word_grid_one_stack(tmp_path):
    (stack,) = _stacks(_spec(tmp_path, "snli_wbw", stack=36))
    assert sorted((p["lr"], p["dropout"], p["l2"]) for p in stack) == sorted(
        (lr, dropout, l2) for lr in (1e-4, 3e-4, 1e-3) for dropout in (0.0, 0.1, 0.2)
        for l2 in (0.0, 1e-4, 3e-4, 1e-3))


def test_auto_stacks_up_to_8_and_keeps_what_differs_in_shape_apart(tmp_path):
    wbw_on_gpus = _spec(tmp_path, "snli_wbw", stack="auto", resources={"cpu": 1, "gpu": 0.25})
    assert [len(s) for s in _stacks(wbw_on_gpus)] == [8, 8, 8, 8, 4]
    # ABCNN's grid over eight architectures: one stack of lr x ℓ2 per architecture.
    abcnn = _spec(tmp_path, "sick_abcnn", stack="auto")
    abcnn.training.layerwise = False  # layerwise training is not stacked
    stacks = _stacks(abcnn)
    assert [len(s) for s in stacks] == [8, 1] * 8
    for stack in stacks:
        assert len({(p["variant"], p["num_blocks"]) for p in stack}) == 1


def test_auto_on_a_cpu_stacks_only_the_models_measured_faster_stacked_there(tmp_path):
    """Where trials have no GPU, `auto` trains one configuration per trial but for ABCNN (its
    stacks measured 1.72x separate trials on a CPU; decomposable attention, word-by-word
    attention and CAM 0.79x, 0.69x and 0.74x: benchmarks/README.md), and says why; `N` stacks
    them all the same."""
    for name in ("snli_wbw", "snli_decomposable", "snli_cam"):
        size, why = _spec(tmp_path, name, stack="auto").stacking()
        assert size == 1 and "only abcnn trains faster stacked on a CPU" in why, (name, why)
        assert "set search.stack: N" in why
        assert _spec(tmp_path, name, stack=4).stacking() == (4, None)
        assert _spec(tmp_path, name, stack="auto", resources={"cpu": 1, "gpu": 0.5}).stacking() == (8, None)
    abcnn = _spec(tmp_path, "sick_abcnn", {"layerwise": False}, stack="auto")
    assert abcnn.stacking() == (8, None)


@pytest.mark.parametrize("stack,gpu,device,seeds_share", [
    ("auto", 0, "auto", False), ("auto", 0.5, "auto", True), ("auto", 0.5, "cpu", False), (4, 0, "auto", True),
])
def test_seeds_share_stacks_with_n_or_on_gpus(tmp_path, stack, gpu, device, seeds_share):
    spec = _spec(tmp_path, "sick_abcnn", {"device": device, "layerwise": False}, stack=stack, seeds=[1, 2],
                 resources={"cpu": 1, "gpu": gpu})
    stacks = _stacks(spec)
    assert spec.stacks_seeds() == seeds_share
    assert any(len({p["seed"] for p in s}) > 1 for s in stacks) == seeds_share
    assert sum(len(s) for s in stacks) == spec.num_trials()


def test_a_sampler_stacks_where_it_searches_only_what_members_may_differ_in(tmp_path):
    """An Optuna sampler's stacks take its proposals as it draws them (StackProposals): it stacks
    where it searches only lr, l2, adagrad_accumulator, dropout or seed; a searched name or a
    configuration that changes anything else is named (refused with N, one per trial with auto)."""
    sampled = {"lr": {"loguniform": [1e-4, 1e-2]}, "dropout": {"uniform": [0.0, 0.3]}}
    on_gpus = {"resources": {"cpu": 1, "gpu": 0.25}}
    assert _spec(tmp_path, "snli_wbw", sampler="tpe", num_samples=20, space=sampled, stack="auto",
                 **on_gpus).stacking() == (8, None)
    assert _spec(tmp_path, "snli_wbw", sampler="random", space=sampled, stack=4).stacking() == (4, None)
    wider = {**sampled, "hidden_size": {"choice": [100, 150]}}
    size, why = _spec(tmp_path, "snli_wbw", sampler="tpe", space=wider, stack="auto", **on_gpus).stacking()
    assert size == 1 and why.startswith("sampler 'tpe' searches hidden_size, which a stack's members cannot differ in")
    architectures = [{"hidden_size": 100, "l2": 0.0}, {"hidden_size": 150, "l2": 0.0}]
    with pytest.raises(ConfigError, match="search.stack: 4 asks for stacks, but sampler 'tpe' searches hidden_size,"):
        _spec(tmp_path, "snli_wbw", sampler="tpe", space=sampled, configurations=architectures, stack=4)
    same_sizes = [{"hidden_size": 100, "l2": 0.0}, {"hidden_size": 100, "l2": 1e-4}]
    assert _spec(tmp_path, "snli_wbw", sampler="tpe", space=sampled, configurations=same_sizes,
                 stack=4).stacking() == (4, None)


def test_the_estimate_counts_the_stacks_the_sweep_runs(tmp_path):
    """`validate --estimate` runs waves of Tune trials: a stacked sweep's stacks (estimate.tune_trials),
    grouped as the sweep groups them; for a sampler as StackProposals fills them (seeds apart: a
    stack per seed)."""
    from orchestrator.sweep.estimate import concurrent_trials
    from orchestrator.sweep.estimate_probe import stacked_trials, tune_trials

    on_gpus = {"resources": {"cpu": 1, "gpu": 0.25}}
    wbw = _spec(tmp_path, "snli_wbw", stack=8, **on_gpus)
    assert tune_trials(wbw) == len(_stacks(wbw)) == 5 and concurrent_trials(wbw, cpus=16, gpus=4) == 5
    assert sorted(len(s) for s in stacked_trials(wbw)) == [4, 8, 8, 8, 8]
    assert tune_trials(_spec(tmp_path, "snli_wbw")) == 36  # stack: off
    sampled = {"lr": {"loguniform": [1e-4, 1e-2]}}
    apart = _spec(tmp_path, "sick_abcnn", {"layerwise": False}, stack="auto", sampler="tpe", num_samples=10,
                  space=sampled, seeds=[1, 2], configurations=[])
    assert not apart.stacks_seeds() and tune_trials(apart) == 4  # 2 seeds x (8 + 2)
    together = _spec(tmp_path, "sick_abcnn", {"layerwise": False}, stack=8, sampler="tpe", num_samples=10,
                     space=sampled, seeds=[1, 2], configurations=[])
    assert tune_trials(together) == 3  # 20 trials, 8 + 8 + 4


def test_auto_sizes_its_stacks_to_fill_the_trial_slots(tmp_path):
    """Given the trial slots where the sweep runs (SweepSpec.trial_slots: what a trial asks for
    against the CPUs and GPUs, capped by max_concurrent_trials), auto's stacks hold
    ceil(trials / slots) members, at least 2 and at most 8: on 2 CPUs a stack of 8 alone took
    longer than 8 trials 2 at a time (benchmarks/README.md, "stacked_sweep"). N keeps its size."""
    from orchestrator.sweep.estimate import concurrent_trials
    from orchestrator.sweep.estimate_probe import tune_trials

    abcnn3 = [{"variant": "abcnn3", "num_blocks": 1}]  # lr x ℓ2, 3 x 3: 9 trials
    auto = _spec(tmp_path, "sick_abcnn", {"layerwise": False}, stack="auto", configurations=abcnn3)
    assert auto.trial_slots(cpus=2, gpus=0) == 2
    assert [auto.stacking(slots)[0] for slots in (None, 1, 2, 3, 5, 16)] == [8, 8, 5, 3, 2, 2]
    assert [len(s) for s in _stacks(auto, 2)] == [5, 4] and [len(s) for s in _stacks(auto)] == [8, 1]
    assert tune_trials(auto, 2) == concurrent_trials(auto, cpus=2, gpus=0) == 2
    assert tune_trials(auto, 3) == 3 and concurrent_trials(auto, cpus=16, gpus=0) == 5  # 2, 2, 2, 2, 1
    assert _spec(tmp_path, "sick_abcnn", {"layerwise": False}, stack=4, configurations=abcnn3).stacking(16) == (4, None)
    on_gpus = _spec(tmp_path, "snli_wbw", stack="auto", resources={"cpu": 2, "gpu": 0.25}, max_concurrent_trials=6)
    assert [on_gpus.trial_slots(cpus, gpus) for cpus, gpus in ((16, 1), (16, 4), (6, 4))] == [4, 6, 3]
    assert on_gpus.stacking(4) == (8, None) and on_gpus.stacking(6) == (6, None)  # 36 trials
