"""Stacked trials: k configurations of one architecture trained as one batched model.

A paper grid is many configurations of one small network that differ only in learning rate, ℓ2,
Adagrad's accumulator or seed. ``StackedModel`` holds k members' parameters with a leading member
dimension and runs the solo model's own forward for all of them at once (``torch.vmap``), the
per-member optimizers (``StackedAdam``, ``StackedAdagrad``) step each member with its own
hyperparameters, and ``StackedTrainer`` trains the stack with per-member results, stopping and
divergence (issue 47). Like the rest of nli_models it knows nothing of Ray or MLflow; a sweep
stacks its grid with ``search.stack`` (orchestrator/ray_adapter/stacks.py).

Stacked: decomposable attention (vanilla, intra) and ABCNN (BCNN, ABCNN-1/2/3, NONOVER). Not yet:
Rocktäschel et al.'s LSTM models and CAM (their LSTMs cannot be vmapped, pytorch#105982; they
need a batched-matmul LSTM), and ABCNN's layerwise training (see ``model`` and ``trainer``).
"""

from nli_models.stacked.model import STACKED_MODELS, StackDropout, StackedModel, WindowedConv1d
from nli_models.stacked.stacked_optimizers import (
    StackedAdagrad,
    StackedAdam,
    make_stacked_optimizer,
)
from nli_models.stacked.stacked_trainer import (
    MEMBER_FIELDS,
    StackedTrainer,
    check_stackable,
    stack_refusal,
)

__all__ = [
    "MEMBER_FIELDS",
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
