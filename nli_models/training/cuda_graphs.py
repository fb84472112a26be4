"""The whole training step (forward, loss, backward, gradient clipping, optimizer step) as one
CUDA graph per batch shape (``training.cuda_graphs``).

Why: at paper sizes a step is hundreds of small kernels, and a GPU waits on the CPU launching
them (an H200 trained at a 2014 K80's speed, launch-bound). A captured graph is replayed with
one launch. Manual capture (``torch.cuda.CUDAGraph``) rather than ``torch.compile(mode=
"reduce-overhead")``: the latter costs ~300 us per call on small graphs (pytorch#150488),
re-records per padded length (pytorch#188150) and does not take LSTMs (pytorch#149909).

How: batches are padded to ``nli_models.data.batch.STATIC_LENGTHS`` (the trainer does it while
graphs are on), so an epoch has a handful of shapes (benchmarks/static_shapes.py: 24 at batch
32 on SNLI dev's lengths). The first batch of a shape is copied into static input buffers, the
step runs three times on a side stream to warm up (cuDNN plans, the optimizer's state), the
parameters, the optimizer's state and the RNG are put back as they were, and the step is
captured into a graph with a memory pool private to the trainer's graphs; that batch and every later one of its shape
copy their tensors into the buffers and replay the graph. Warm-up leaves nothing behind, so
training with graphs takes the steps eager training takes (losses equal on the same seed with
dropout off; dropout draws from the same generator, graph-safe).

Where capture fails (an op that cannot be captured, an optimizer without a capturable step), the
step stays eager: ``auto`` says so once on stderr, ``on`` raises.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from nli_models.data.batch import Batch

WARMUP_STEPS = 3

# (loss, logits) of one training step on a batch, the optimizer's step included.
StepFunction = Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]


class GraphCaptureFailed(RuntimeError):
    """``training.cuda_graphs: on`` and the step could not be captured."""


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Batch  # the static input buffers the graph reads
    loss: torch.Tensor
    logits: torch.Tensor


class GraphedTrainingStep:
    """Replays one captured CUDA graph of ``step`` per batch shape.

    Args:
        step: the eager step on a batch: forward, loss, backward (into gradients that are None
            before it), clipping and the optimizer's step; returns (loss, logits).
        model: the model whose parameters the step updates (restored after warm-up).
        optimizer: the step's optimizer, built with a capturable step (restored after warm-up).
        required: ``training.cuda_graphs: on``: a failed capture raises instead of falling back.
    """

    def __init__(self, step: StepFunction, model: nn.Module, optimizer: torch.optim.Optimizer,
                 required: bool):
        self.step = step
        self.model = model
        self.optimizer = optimizer
        self.required = required
        self.graphs: dict[tuple, _Captured | None] = {}  # None: this shape runs eagerly
        # One memory pool for every shape's graph: replays run one after another on one stream
        # and a replay's outputs (loss, logits) are held, so what one graph frees between steps
        # another may use: the graphs together take about one step's memory.
        self.pool = None
        self.warned = False

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        key = tuple(tuple(t.shape) for t in (batch.premise, batch.hypothesis, batch.label))
        if key not in self.graphs:
            self.graphs[key] = self._capture(batch)
        captured = self.graphs[key]
        if captured is None:
            self.optimizer.zero_grad(set_to_none=True)
            return self.step(batch)
        for static, value in zip(_tensors(captured.inputs), _tensors(batch), strict=True):
            static.copy_(value, non_blocking=True)
        captured.graph.replay()
        return captured.loss, captured.logits

    def _capture(self, batch: Batch) -> _Captured | None:
        inputs = Batch(*(t.clone() for t in _tensors(batch)))
        device = inputs.label.device
        saved = snapshot_state(self.model, self.optimizer)
        rng = None
        try:
            rng = torch.cuda.get_rng_state(device)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream(inputs.label.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self.optimizer.zero_grad(set_to_none=True)
                    self.step(inputs)
            torch.cuda.current_stream().wait_stream(side)
            restore_state(self.model, self.optimizer, saved)
            torch.cuda.set_rng_state(rng, device)
            graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph, pool=self.pool):
                loss, logits = self.step(inputs)
            # Capture records the step without running it: the state is still as it was.
        except Exception as exc:  # noqa: BLE001 - any op that refuses capture: fall back to eager
            restore_state(self.model, self.optimizer, saved)
            if rng is not None:
                torch.cuda.set_rng_state(rng, device)
            if self.required:
                raise GraphCaptureFailed(
                    f"training.cuda_graphs: on, but the training step could not be captured as a "
                    f"CUDA graph ({type(exc).__name__}: {str(exc).strip()[:300]}); use 'auto' or "
                    "'off'") from exc
            if not self.warned:
                print(f"note: the training step runs eagerly: CUDA graph capture failed "
                      f"({type(exc).__name__}: {str(exc).strip()[:200]})", file=sys.stderr)
                self.warned = True
            return None
        return _Captured(graph, inputs, loss, logits)


def _tensors(batch: Batch) -> tuple[torch.Tensor, ...]:
    return batch.premise, batch.premise_mask, batch.hypothesis, batch.hypothesis_mask, batch.label


def snapshot_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, copy) of every parameter, buffer and optimizer state tensor, to put back in place
    (the graph captures their addresses, so they are restored with copy_, never replaced)."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return [(t, t.detach().clone()) for t in tensors]


def restore_state(model: nn.Module, optimizer: torch.optim.Optimizer,
             saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    known = {id(t) for t, _ in saved}
    with torch.no_grad():
        for tensor, copy in saved:
            tensor.copy_(copy)
    # State the warm-up created goes back to its start: make_optimizer creates it all, but a loaded
    # checkpoint's has none for parameters that had no gradient yet, and the first step builds it.
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and id(value) not in known:
                with torch.no_grad():
                    value.zero_()
