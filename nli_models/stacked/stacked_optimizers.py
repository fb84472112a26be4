"""Adam and Adagrad over stacked parameters ([k, ...]), with a learning rate, ℓ2 and (Adagrad)
initial accumulator per member, and a step that moves only the active members.

Each is torch's own update rule (torch.optim.Adam / Adagrad, single-tensor, no amsgrad, no
maximize), written over the member dimension: the hyperparameters are [k] tensors broadcast
over a parameter's solo dimensions, and the step count is per member (a member stopped for
a while keeps its own bias correction). The count is kept as "member_step", not torch's "step":
``load_state_dict`` moves it to the parameters' device as any other state tensor, where torch
would leave a "step" on the CPU. ℓ2 is added to the gradient (``weight_decay``, classic
ℓ2 regularisation) as torch does. On the CPU a step is torch's fused kernel
(``torch._fused_adam_`` / ``_fused_adagrad_``, what the solo trainer runs there) once per active
member over its slices of the parameters; elsewhere the update is written over [k, ...] tensors
(above) and each member's result kept or dropped by its ``active`` entry, which reads nothing on
the host. tests/test_stacked.py checks each member against torch.optim step by step, both ways.

``step(active)``: members whose entry is False keep their parameters and optimizer state exactly
(a frozen or diverged member; its gradient may be NaN, which never reaches the others).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from nli_models.config import TrainingConfig
from nli_models.models import layers
from nli_models.stacked.model import StackedModel


def _per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[k] values shaped to broadcast over a [k, ...] parameter."""
    return values.view(-1, *([1] * (like.dim() - 1)))


class _StackedOptimizer(torch.optim.Optimizer, ABC):
    """The shared part: per-member hyperparameters as [k] tensors, the masked step."""

    def __init__(self, params, lr: torch.Tensor, weight_decay: torch.Tensor, **defaults):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, **defaults})

    @torch.no_grad()
    def step(self, active: torch.Tensor | None = None) -> None:
        """One step of every member whose ``active`` entry is True.

        Args:
            active: bool [k] (default: every member).
        """
        for group in self.param_groups:
            params = [param for param in group["params"] if param.grad is not None]
            if not params:
                continue
            for param in params:
                if not self.state[param]:
                    self._init_state(self.state[param], param, group)
            if layers.on_host(params[0]):
                self._step_on_host(params, group, active)
                continue
            for param in params:
                keep = torch.ones(param.shape[0], dtype=torch.bool, device=param.device) \
                    if active is None else active.to(param.device)
                state = self.state[param]
                for key, value in self._update(param, param.grad, state, group).items():
                    target = param if key == "param" else state[key]
                    target.copy_(torch.where(_per_member(keep, target), value, target))

    def _step_on_host(self, params: list[torch.Tensor], group: dict, active: torch.Tensor | None) -> None:
        """The CPU step: torch's fused kernel once per active member, over that member's slices
        of every parameter (views: updated in place). Reading ``active`` and the hyperparameters
        costs nothing on the host, and a stopped member's slices are never touched. The masked
        update (every op over [k, ...], then a choice per member) took 15 ms of a 230 ms
        decomposable attention step (8 members, width 200; 37 ms timed alone under load); this
        takes 1.7."""
        members = range(params[0].shape[0]) if active is None else active.nonzero().flatten().tolist()
        hyper = {key: group[key].tolist() for key in ("lr", "weight_decay")}
        for param in params:  # the fused kernels read the step count; torch adds 1 before them
            step = self.state[param]["member_step"]
            step.add_(1 if active is None else active.to(step.dtype))
        for member in members:
            self._fused(params, group, member, lr=hyper["lr"][member], weight_decay=hyper["weight_decay"][member])

    @abstractmethod
    def _init_state(self, state: dict, param: torch.Tensor, group: dict) -> None:
        """The optimizer's state of a parameter before its first step."""

    @abstractmethod
    def _fused(self, params: list[torch.Tensor], group: dict, member: int, lr: float, weight_decay: float) -> None:
        """Member ``member``'s step (its step count already advanced) by torch's fused kernel."""

    @abstractmethod
    def _update(self, param: torch.Tensor, grad: torch.Tensor, state: dict, group: dict
                ) -> dict[str, torch.Tensor]:
        """The new parameter ("param") and state tensors of every member."""


class StackedAdam(_StackedOptimizer):
    """torch.optim.Adam's update (eps outside the bias-corrected sqrt), per member."""

    def __init__(self, params, lr: torch.Tensor, weight_decay: torch.Tensor,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        """Args:
            params: stacked parameters, or groups of them (dicts with "params" and optionally
                their own "lr" / "weight_decay").
            lr: [k] learning rates.
            weight_decay: [k] ℓ2 coefficients (added to the gradient).
            betas: Adam's (β1, β2), shared.
            eps: Adam's ε, shared.
        """
        super().__init__(params, lr, weight_decay, betas=betas, eps=eps)

    def _init_state(self, state, param, group):
        state["member_step"] = torch.zeros(param.shape[0], device=param.device)
        state["exp_avg"] = torch.zeros_like(param)
        state["exp_avg_sq"] = torch.zeros_like(param)

    def _fused(self, params, group, member, lr, weight_decay):
        beta1, beta2 = group["betas"]
        states = [self.state[param] for param in params]
        torch._fused_adam_([p[member] for p in params], [p.grad[member] for p in params],
                           [s["exp_avg"][member] for s in states], [s["exp_avg_sq"][member] for s in states], [],
                           [s["member_step"][member] for s in states], lr=lr, beta1=beta1, beta2=beta2,
                           weight_decay=weight_decay, eps=group["eps"], amsgrad=False, maximize=False)

    def _update(self, param, grad, state, group):
        beta1, beta2 = group["betas"]
        grad = grad + _per_member(group["weight_decay"], param) * param
        step = state["member_step"] + 1
        exp_avg = state["exp_avg"].lerp(grad, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"] * beta2 + (1 - beta2) * grad * grad
        # The bias corrections in float64, as torch computes them (from a Python step count):
        # 1 - 0.999^step in float32 is off by ~1e-4 relative at the first steps.
        counts = step.double()
        step_size = _per_member((group["lr"].double() / (1 - beta1**counts)).to(param.dtype), param)
        bias_correction2_sqrt = _per_member((1 - beta2**counts).sqrt().to(param.dtype), param)
        denom = exp_avg_sq.sqrt() / bias_correction2_sqrt + group["eps"]
        return {"param": param - step_size * exp_avg / denom, "member_step": step,
                "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


class StackedAdagrad(_StackedOptimizer):
    """torch.optim.Adagrad's update (no lr decay), per member, with a per-member initial
    accumulator."""

    def __init__(self, params, lr: torch.Tensor, weight_decay: torch.Tensor,
                 initial_accumulator_value: torch.Tensor, eps: float = 1e-10):
        """Args:
            params: stacked parameters, or groups of them.
            lr: [k] learning rates.
            weight_decay: [k] ℓ2 coefficients (added to the gradient).
            initial_accumulator_value: [k] starting values of the squared-gradient sums.
            eps: Adagrad's ε, shared.
        """
        super().__init__(params, lr, weight_decay, eps=eps,
                         initial_accumulator_value=initial_accumulator_value)

    def _init_state(self, state, param, group):
        state["member_step"] = torch.zeros(param.shape[0], device=param.device)
        state["sum"] = _per_member(group["initial_accumulator_value"], param).expand_as(param).clone()

    def _fused(self, params, group, member, lr, weight_decay):
        states = [self.state[param] for param in params]
        torch._fused_adagrad_([p[member] for p in params], [p.grad[member] for p in params],
                              [s["sum"][member] for s in states], [s["member_step"][member] for s in states],
                              lr=lr, lr_decay=0.0, weight_decay=weight_decay, eps=group["eps"], maximize=False)

    def _update(self, param, grad, state, group):
        grad = grad + _per_member(group["weight_decay"], param) * param
        accumulated = state["sum"] + grad * grad
        std = accumulated.sqrt() + group["eps"]
        return {"param": param - _per_member(group["lr"], param) * grad / std,
                "member_step": state["member_step"] + 1, "sum": accumulated}


def make_stacked_optimizer(model: StackedModel, configs: Sequence[TrainingConfig]) -> _StackedOptimizer:
    """The configured optimizer over a stack, member i with ``configs[i]``'s lr, ℓ2 and
    Adagrad accumulator; as ``make_optimizer``, ℓ2 on the network and none on the word vectors.

    Args:
        model: the stack.
        configs: one training block per member; all name one optimizer.
    """
    if len(configs) != model.size:
        raise ValueError(f"{len(configs)} training configs for a stack of {model.size}")
    names = {c.optimizer for c in configs}
    if len(names) != 1:
        raise ValueError(f"stack members must share the optimizer; got {sorted(names)}")
    device = next(iter(model.stacked_parameters().values())).device

    def per_member(field: str) -> torch.Tensor:
        return torch.tensor([float(getattr(c, field)) for c in configs], device=device)

    lr, l2 = per_member("lr"), per_member("l2")
    params = model.stacked_parameters()
    # The papers regularise the network, not the word vectors (make_optimizer).
    groups = [
        {"params": [p for n, p in params.items() if not n.startswith("word_embeddings.")], "weight_decay": l2},
        {"params": [p for n, p in params.items() if n.startswith("word_embeddings.")],
         "weight_decay": torch.zeros_like(l2)},
    ]
    groups = [g for g in groups if g["params"]]
    if names == {"adam"}:
        return StackedAdam(groups, lr=lr, weight_decay=l2)
    return StackedAdagrad(groups, lr=lr, weight_decay=l2,
                          initial_accumulator_value=per_member("adagrad_accumulator"))
