"""The optimizer's implementation follows what torch offers for the parameters' device: fused
where torch's fused kernel takes a step there, foreach where it does not (torch 2.11's CUDA
Adagrad refused ``fused=True`` at the first step and two of the four papers could not train on a
GPU). The meta device stands in for a device without fused kernels: no fused kernel supports it."""

from __future__ import annotations

import pytest
import torch
from test_models_contract import _batch, _build

from nli_models.config import TrainingConfig
from nli_models.training.optimizers import create_adam_state, fused_kernel_available, make_optimizer

OPTIMIZERS = ("adam", "adagrad")


def _step(model, optimizer):
    device = next(model.parameters()).device
    logits = model(*(t.to(device) for t in _batch()))
    optimizer.zero_grad(set_to_none=True)
    logits.float().pow(2).mean().backward()
    optimizer.step()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_cpu_parameters_get_the_fused_kernel(name):
    model = _build("decomposable", {"variant": "intra"})
    optimizer = make_optimizer(model, TrainingConfig(optimizer=name, l2=1e-4))
    assert all(group["fused"] for group in optimizer.param_groups)
    before = [p.detach().clone() for p in model.parameters()]
    _step(model, optimizer)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_device_without_fused_kernels_gets_foreach_and_steps(name):
    assert not fused_kernel_available(name, torch.device("meta"), torch.float32)
    model = _build("abcnn", {"variant": "abcnn3", "nonover": True}).to("meta")
    optimizer = make_optimizer(model, TrainingConfig(optimizer=name, l2=1e-4))
    assert all(group["foreach"] and not group["fused"] for group in optimizer.param_groups)
    _step(model, optimizer)  # fused=True would raise here, at the first step
    assert all(optimizer.state[p] for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_and_foreach_take_the_same_step(name):
    """The choice changes speed only: both implementations of torch's update rule agree."""
    config = TrainingConfig(optimizer=name, l2=1e-3, lr=0.05)
    models = [_build("cam", {"variant": "full"}, seed=3) for _ in range(2)]
    fused = make_optimizer(models[0], config)
    plain = make_optimizer(models[1], config)
    for group in plain.param_groups:
        group.update(foreach=True, fused=False)
    for _ in range(3):
        for model, optimizer in zip(models, (fused, plain), strict=True):
            torch.manual_seed(0)
            _step(model, optimizer)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_capturable_step_is_refused_for_adagrad_without_its_fused_kernel():
    model = _build("decomposable", {"variant": "vanilla"}).to("meta")
    with pytest.raises(ValueError, match="fused kernel"):
        make_optimizer(model, TrainingConfig(optimizer="adagrad"), capturable=True)
    adam = make_optimizer(model, TrainingConfig(optimizer="adam"), capturable=True)
    assert all(group["capturable"] for group in adam.param_groups)


@pytest.mark.parametrize("implementation", [{"fused": True}, {"foreach": True}, {"foreach": False}])
def test_adam_state_created_with_the_optimizer_equals_torchs_lazy_state(implementation):
    """make_optimizer creates Adam's state before the first step (so the first step launches
    no allocation kernels); steps and state equal torch's, which creates it in the first step."""
    config = TrainingConfig(optimizer="adam", l2=1e-3, lr=0.05)
    models = [_build("decomposable", {"variant": "intra"}, seed=5) for _ in range(2)]
    eager = make_optimizer(models[0], config)
    for group in eager.param_groups:
        group.update(fused=implementation.get("fused", False), foreach=implementation.get("foreach"))
    assert all(set(eager.state[p]) == {"step", "exp_avg", "exp_avg_sq"}
               for group in eager.param_groups for p in group["params"])
    eager.state.clear()  # recreate under this implementation's rules (step on CPU unless fused)
    create_adam_state(eager)
    lazy_groups = [{**{k: v for k, v in g.items() if k != "params"},
                    "params": [dict(models[1].named_parameters())[n] for n in _names(models[0], g)]}
                   for g in eager.param_groups]
    lazy = torch.optim.Adam(lazy_groups)
    assert not lazy.state
    for _ in range(3):
        for model, optimizer in zip(models, (eager, lazy), strict=True):
            torch.manual_seed(0)
            _step(model, optimizer)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)
    eager_state, lazy_state = eager.state_dict()["state"], lazy.state_dict()["state"]
    assert eager_state.keys() == lazy_state.keys()
    for index, state in eager_state.items():
        for key, value in state.items():
            other = lazy_state[index][key]
            assert (value.dtype, value.device, value.shape) == (other.dtype, other.device, other.shape), key
            assert torch.equal(value, other), key


def _names(model, group) -> list[str]:
    ids = {id(p) for p in group["params"]}
    return [name for name, p in model.named_parameters() if id(p) in ids]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_without_l2_one_parameter_group_holds_every_trainable_parameter(name):
    """Each group is one more fused kernel per step (two with Adam: the step counts too), so the
    split that keeps ℓ2 off the word vectors is made only when there is ℓ2."""
    model = _build("decomposable", {"variant": "vanilla"})
    optimizer = make_optimizer(model, TrainingConfig(optimizer=name, l2=0.0))
    (group,) = optimizer.param_groups
    assert group["weight_decay"] == 0.0
    assert {id(p) for p in group["params"]} == {id(p) for p in model.parameters() if p.requires_grad}
    assert len(make_optimizer(model, TrainingConfig(optimizer=name, l2=1e-4)).param_groups) == 2


def test_adam_state_off_the_cpu_is_where_torchs_own_would_be():
    """A device without fused kernels (meta stands in): the state make_optimizer creates has
    the devices and dtypes of the state torch's first step creates (the step count on the host);
    a capturable step keeps its count on the parameters' device, as torch's rule says (CUDA
    graphs replay it there)."""
    def states(optimizer):
        return {(id(p), k): (v.device.type, v.dtype, tuple(v.shape))
                for p, state in optimizer.state.items() for k, v in state.items()}

    model = _build("decomposable", {"variant": "vanilla"}).to("meta")
    made = make_optimizer(model, TrainingConfig(optimizer="adam"))
    lazy = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], foreach=True)
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    lazy.step()
    assert states(made) and states(made) == states(lazy)
    assert all(state["step"].device.type == "cpu" for state in made.state.values())
    captured = make_optimizer(model, TrainingConfig(optimizer="adam"), capturable=True)
    assert all(s["step"].device.type == "meta" for s in captured.state.values())
