"""The papers' optimizers (Adam, Adagrad) over a model's trainable parameters, with torch's
fastest implementation that works for the parameters' device.

A fused optimizer (one kernel over all parameters) is what a step wants: the optimizer was about
half of a CPU training step at paper size before it (benchmarks/throughput.py), and a per-tensor
loop is dozens of kernel launches on a GPU. But whether torch has the fused kernel depends on the
release and the device: fused Adagrad on CUDA exists in torch 2.13 and not in 2.11, which checks
it only at the first step (``RuntimeError: fused=True requires all the params to be floating point
Tensors of supported devices``). So the choice is made by trying: one step of the fused optimizer
on a one-element parameter of the same device and dtype, once per process and (optimizer,
device, dtype); where it raises, the ``foreach`` implementation (a few multi-tensor kernels,
available everywhere) is used. The meta device, which no fused kernel supports, takes the
foreach branch (tests/test_optimizers.py).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from nli_models.config import TrainingConfig

OPTIMIZER_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adagrad": torch.optim.Adagrad,
}


@functools.cache
def fused_kernel_available(optimizer: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's fused ``optimizer`` ("adam" or "adagrad") takes a step on parameters of
    this device and dtype.

    Args:
        optimizer: a key of ``OPTIMIZER_CLASSES``.
        device: the parameters' device.
        dtype: the parameters' floating-point dtype.
    """
    probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    try:
        OPTIMIZER_CLASSES[optimizer]([probe], lr=0.0, fused=True).step()
    except (RuntimeError, NotImplementedError):
        return False
    return True


def create_adam_state(adam: torch.optim.Adam) -> None:
    """Create Adam's state now, as torch's own first step would (the same tensors, dtypes and
    devices), rather than in the first step: torch's Adagrad creates its state in its constructor,
    Adam lazily, which made a trainer's first step three allocations per parameter (63 kernels for
    decomposable attention) heavier than the rest. tests/test_optimizers.py checks the steps and
    state equal torch's lazily created ones.

    Args:
        adam: a ``torch.optim.Adam`` that has not taken a step.
    """
    for group in adam.param_groups:
        on_device = group["capturable"] or group["fused"]
        step_dtype = torch.float32 if group["fused"] else (
            torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32)
        for p in group["params"]:
            state = adam.state[p]
            if state:
                continue
            state["step"] = torch.zeros((), dtype=step_dtype, device=p.device if on_device else "cpu")
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def make_optimizer(model: nn.Module, config: TrainingConfig,
                   params: list[nn.Parameter] | None = None,
                   capturable: bool = False, split_embeddings: bool | None = None) -> torch.optim.Optimizer:
    """The configured optimizer over the model's trainable parameters (or ``params``): with ℓ2,
    in two groups, ℓ2 on the network and none on the word vectors; without, in one. Adam's state
    is created here (``create_adam_state``), Adagrad's by its constructor.

    Args:
        model: the model; its ``word_embeddings`` parameters get no ℓ2.
        config: the training block (optimizer, lr, l2, Adagrad's initial accumulator).
        params: the parameters to train (default: those of ``model`` that require grad).
        capturable: the step may be captured in a CUDA graph: Adam keeps its step count on the
            device (``capturable=True``); Adagrad needs its fused kernel for that (its foreach
            step reads the step count on the host) and raises ``ValueError`` without it.
        split_embeddings: the two groups even without ℓ2 (None: only with ℓ2): the layout of
            a checkpoint saved before one group replaced them (the same update).
    """
    # The papers regularise the network, not the word vectors; both optimizers add ℓ2 to the
    # gradient, i.e. classic ℓ2 regularisation.
    embedding_ids = {id(p) for p in model.word_embeddings.parameters()}
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    if not (config.l2 > 0.0 if split_embeddings is None else split_embeddings):
        # One group: each group is one more kernel per step (two with Adam).
        groups = [{"params": list(params), "weight_decay": 0.0}]
    else:
        groups = [
            {"params": [p for p in params if id(p) not in embedding_ids], "weight_decay": config.l2},
            {"params": [p for p in params if id(p) in embedding_ids], "weight_decay": 0.0},
        ]
        groups = [g for g in groups if g["params"]]
    first = groups[0]["params"][0]
    fused = fused_kernel_available(config.optimizer, first.device, first.dtype)
    implementation = {"fused": True} if fused else {"foreach": True}
    if config.optimizer == "adam":
        adam = torch.optim.Adam(groups, lr=config.lr, betas=(0.9, 0.999), capturable=capturable,
                                **implementation)
        create_adam_state(adam)
        return adam
    if capturable and not fused:
        raise ValueError(
            f"Adagrad's step can be captured in a CUDA graph only with its fused kernel, which "
            f"torch {torch.__version__} lacks for {first.device.type} parameters"
        )
    return torch.optim.Adagrad(
        groups, lr=config.lr, initial_accumulator_value=config.adagrad_accumulator, **implementation
    )
