"""GPU memory of one trial: what its training step needs, and a cap for trials that share a GPU.

A paper-size trial uses a sliver of a modern GPU (185-490 MiB of an H200's 140 GiB in the first
CUDA run), so a sweep packs trials with fractional ``resources.gpu``. Ray only counts the
fractions; nothing stops one trial taking another's memory. So each packed trial caps its process
at its share (``cap_memory``), and ``orchestrate validate`` says how many trials of a spec fit one
GPU from the measured need of its largest configuration (``training_step_memory``).

The need is measured on the meta device (shapes, no values, no compute: milliseconds at paper
size), which takes the GPU's code path (tests/test_host_sync.py): the parameters, their
gradients and optimizer state, and every tensor autograd saves for the backward pass (unique
storages, counted by ``torch.autograd.graph.saved_tensors_hooks``), at the batch size and the
longest static lengths the data can produce. It leaves out the step's short-lived temporaries,
the caching allocator's rounding and the CUDA context (about 500 MiB per process on current
drivers), which ``CUDA_CONTEXT_BYTES`` adds per trial.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nli_models.data.batch import static_length

CUDA_CONTEXT_BYTES = 512 * 2**20
# Adam keeps two moments per parameter, Adagrad one sum; both a step count per tensor (negligible).
OPTIMIZER_STATES = {"adam": 2, "adagrad": 1}


@dataclass(frozen=True)
class StepMemory:
    """Bytes one training step holds at its peak, by kind."""

    parameters: int
    gradients: int
    optimizer_state: int
    saved_activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.saved_activations

    @property
    def per_process(self) -> int:
        """With the CUDA context a trial's process holds."""
        return self.total + CUDA_CONTEXT_BYTES


def training_step_memory(model: nn.Module, optimizer: str, batch_size: int, premise_length: int,
                         hypothesis_length: int) -> StepMemory:
    """The memory of one training step of ``model`` (moved to the meta device: pass a copy you
    do not need), measured on the meta device.

    Args:
        model: the trial's model as built for its data (frozen embeddings stay frozen).
        optimizer: "adam" or "adagrad".
        batch_size: pairs per batch.
        premise_length: the longest premise in tokens (padded here to its static length).
        hypothesis_length: the longest hypothesis in tokens (likewise).
    """
    model = model.to("meta").train()
    shapes = ((batch_size, static_length(premise_length)), (batch_size, static_length(hypothesis_length)))
    inputs = []
    for shape in shapes:
        inputs += [torch.ones(shape, dtype=torch.long, device="meta"),
                   torch.ones(shape, dtype=torch.bool, device="meta")]
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage._cdata] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(*inputs)
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return StepMemory(
        parameters=sum(p.numel() * p.element_size() for p in [*model.parameters(), *model.buffers()]),
        gradients=trained,
        optimizer_state=OPTIMIZER_STATES[optimizer] * trained,
        saved_activations=sum(saved.values()),
    )


def cap_memory(device: torch.device, share: float) -> None:
    """Cap this process at ``share`` of the GPU's memory where a trial was given part of one (Ray's
    fractional GPUs): an allocation past it raises CUDA out-of-memory in this trial alone instead
    of starving the trials beside it.

    Args:
        device: the trial's device (nothing happens off CUDA).
        share: the trial's ``resources.gpu`` (nothing happens at 0 or from 1 GPU up).
    """
    if device.type == "cuda" and 0 < share < 1:
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_per_process_memory_fraction(share, index)
