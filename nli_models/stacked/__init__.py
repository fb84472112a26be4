"""Stacked trials: k configurations of one architecture trained as one batched model.

A paper grid is many configurations of one small network that differ only in learning rate, ℓ2,
Adagrad's accumulator, dropout or seed. ``StackedModel`` holds k members' parameters with a leading member
dimension and runs the solo model's own forward for all of them at once (``torch.vmap``), the
per-member optimizers (``StackedAdam``, ``StackedAdagrad``) step each member with its own
hyperparameters, and ``StackedTrainer`` trains the stack with per-member results, stopping and
divergence (issue 47). Like the rest of nli_models it knows nothing of Ray or MLflow; a sweep
stacks its grid with ``search.stack`` (orchestrator/ray_adapter/stacks.py).

Stacked: every paper model, decomposable attention (vanilla, intra), ABCNN (BCNN, ABCNN-1/2/3,
NONOVER), Rocktäschel et al.'s LSTM models (their LSTMs run as ``StepwiseLSTM``: cuDNN/oneDNN
LSTMs cannot be vmapped, pytorch#105982) and CAM. Not yet: ABCNN's layerwise training (see
``model`` and ``trainer``).

What a stack can gain on a CPU (benchmarks/README.md, ``stacking``): the per-op overhead of k
runs, paid once, and small kernels batched into larger ones; never the work that is the same per
member. Decomposable attention at width 200 (SICK, batch 32, one thread): of a solo step (23.7 ms,
profiled) 56% is matmuls, at 77-88 GFLOP/s (one core's peak, in the solo's ``mm`` as in the stack's
``bmm``: 105 ms per stacked step against 8 x 13.3), and 15% dropout's uniform draws, the same count
per member. So a stack of 8 cannot exceed 1 / 0.71 = 1.41x of 8 trials there, whatever its
formulation; it measured 0.83-0.94x under load. What it still adds over that floor: vmap turns an
``index_select`` / ``index_copy`` by a shared index (``layers.RealPositions``) into a gather /
scatter over an index expanded to every member's every element (about 17 ms of a 200 ms step), and
vmap's per-op dispatch. ABCNN-3's step is mostly small ops (its convolution is where the stack
gains, as one matmul per member batch): 1.53-1.76x of 8 trials under load.
"""

from nli_models.stacked.model import STACKED_MODELS, StackDropout, StackedModel, WindowedConv1d
from nli_models.stacked.stacked_optimizers import (
    StackedAdagrad,
    StackedAdam,
    make_stacked_optimizer,
)
from nli_models.stacked.stacked_trainer import (
    MEMBER_FIELDS,
    MemberBatch,
    StackedTrainer,
    check_stackable,
    stack_refusal,
)

__all__ = [
    "MEMBER_FIELDS",
    "MemberBatch",
    "STACKED_MODELS",
    "StackDropout",
    "StackedAdagrad",
    "StackedAdam",
    "StackedModel",
    "StackedTrainer",
    "WindowedConv1d",
    "check_stackable",
    "make_stacked_optimizer",
    "stack_refusal",
]
