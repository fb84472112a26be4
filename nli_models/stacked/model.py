"""A stack of k members of one architecture as one module: every parameter that differs between
members gets a leading member dimension, and one forward pass computes all k members' logits.

The members are the registered models themselves, built as a solo run builds them (their own
seed, their own initialisation); ``StackedModel`` stacks their tensors
(``torch.func.stack_module_state`` semantics) and runs the solo module's own ``forward`` under
``torch.vmap`` over the member dimension with ``torch.func.functional_call``. So a member
computes exactly the solo model's equations: no second implementation of any paper exists here.
Members of one seed share the batch (``in_dims=None``): everything computed from it alone
(masks, distinct words, ABCNN's NONOVER sentences, the CPU path's real positions) is computed
once for all members, and the per-member work runs as batched matmuls. Members of several seeds
get a batch each ([k, B, L] inputs, ``in_dims=0``), through the models' off-CPU path. Dropout draws each member's own masks
(``randomness="different"``).

Tensors that are frozen and equal in every member (a fixed pretrained embedding table and its
row masks: Parikh and Yin keep every word vector fixed) are kept once and shared, not stacked:
a k x [V, D] lookup and copy would cost more than the rest of a small model's step.

One formulation differs from the solo module's: under vmap, torch turns ``conv1d`` with a stacked
weight into a grouped convolution, which oneDNN runs several times slower than k separate
convolutions on CPU (ABCNN-3 at SICK sizes: 31 ms against 4 ms per forward, measured while
writing this). The stack's copy of the module runs each ``nn.Conv1d`` as
``WindowedConv1d``: the same wide convolution as one matmul of every position against every
tap's weights, then a sum along the taps' diagonals (equal to float rounding; batched over
members it is one ``bmm``; its tap sum is a ``torch.autograd.Function`` with its own vmap rule,
run on the [k, ...] tensors as they are). Dropout runs as ``StackDropout`` (the same masks'
law, with an op vmap batches).

cuDNN's and oneDNN's LSTM kernels cannot be vmapped (pytorch#105982): the stack's copy runs each
``nn.LSTM`` as a ``StepwiseLSTM`` (the same gate equations, one batched matmul per time step,
the state held at padding as a packed run holds it), and word-by-word attention's fused
functions (which write into their own buffers) as ``WordByWordEquations`` (eq. 11-13 with
autograd). Module-for-module swaps, like the convolution's: the model's own ``forward`` runs.

Stacked: decomposable attention (vanilla and intra), ABCNN (BCNN, ABCNN-1/2/3, one or more
blocks, NONOVER; layerwise training is not stacked yet), Rocktäschel et al. (conditional,
attention, word-by-word; shared encoder, two-way, delimiter) and CAM (full, intra-only,
inter-only).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from nli_models.models import layers
from nli_models.models.stepwise_lstm import StepwiseLSTM
from nli_models.models.word_by_word import WordByWordAttention, WordByWordEquations

STACKED_MODELS = ("decomposable", "abcnn", "rocktaschel", "cam")


class WindowedConv1d(nn.Module):
    """``nn.Conv1d``'s zero-padded, stride-1 convolution as one matmul and a sum:
    out[:, o, j] = b_o + sum_t (W[:, :, t] x_pad[:, :, j + t])_o. The matmul gives every
    position's product with every tap's weights ([B, L, width x O]), ``_TapSum`` adds each output
    column's taps. The parameters are the convolution's own (same names), so a stack's tensors
    replace them by name. Against the earlier matmul over windows (the input's width shifted
    copies side by side, [B, L', width x C]) there is no copy of the input and the matmul's inner
    dimension is C, not width x C: a stacked ABCNN-3 step (8 members, SICK batches) took 51 ms
    against 60 (interleaved A/B, medians)."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        if conv.stride != (1,) or conv.dilation != (1,) or conv.groups != 1 or conv.padding_mode != "zeros" \
                or not isinstance(conv.padding, tuple):
            raise ValueError(f"WindowedConv1d runs stride-1, ungrouped, zero-padded convolutions; got {conv}")
        self.width, self.padding = conv.kernel_size[0], conv.padding[0]
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, L] -> [B, O, L + 2 padding - width + 1]."""
        out_channels, channels, width = self.weight.shape
        # Every tap of every position at once: taps[b, i, t] = W[:, :, t] x[b, :, i], [B, L, width x O].
        weights = self.weight.permute(1, 2, 0).reshape(channels, width * out_channels)
        taps = (x.transpose(1, 2) @ weights).unflatten(-1, (width, out_channels))
        out = _TapSum.apply(taps, self.padding)
        if self.bias is not None:
            out = out + self.bias
        return out.transpose(1, 2)


class _TapSum(torch.autograd.Function):
    """The wide convolution's sum over its taps: out[b, j] = sum_t taps[b, j + t - padding, t] for
    taps [B, L, width, O] (zero outside 0..L-1) -> [B, L + 2 padding - width + 1, O]. Forward one
    sum over a strided view of the zero-padded taps; backward one strided view of the gradient,
    flipped (autograd's own, through width slices of the padded taps, filled a zero tensor per
    slice and added them: 10% of a stacked ABCNN-3 step). Under vmap (the stack) the members are
    more rows of B."""

    @staticmethod
    def _diagonals(padded: torch.Tensor, columns: int) -> torch.Tensor:
        """[B, columns, width, O]: column j's tap t is padded[b, j + t, t]."""
        rows, length, width, out_channels = padded.shape
        return padded.as_strided((rows, columns, width, out_channels),
                                 (length * width * out_channels, width * out_channels,
                                  (width + 1) * out_channels, 1), padded.storage_offset())

    @staticmethod
    def forward(taps: torch.Tensor, padding: int) -> torch.Tensor:
        padded = F.pad(taps, (0, 0, 0, 0, padding, padding))
        return _TapSum._diagonals(padded, padded.shape[1] - taps.shape[2] + 1).sum(dim=2)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        taps, ctx.padding = inputs
        ctx.shape = taps.shape

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # taps[b, i, t] feeds column i + padding - t: with the gradient zero-padded to
        # L + width - 1 columns (none added for the wide convolution, padding = width - 1), tap
        # width - 1 - t of row i is column i + t of it, a strided view; its flip along the taps is
        # the one tensor written. (A zero tensor filled, then its diagonals written, took 2.5x as
        # long at a stacked ABCNN-3 step's shapes, [256, 20, 3, 50], for the same values.)
        rows, length, width, out_channels = ctx.shape
        extra = width - 1 - ctx.padding
        padded = F.pad(grad, (0, 0, extra, extra)) if extra else grad.contiguous()
        windows = padded.as_strided((rows, length, width, out_channels),
                                    (padded.shape[1] * out_channels, out_channels, out_channels, 1),
                                    padded.storage_offset())
        return windows.flip(2), None

    @staticmethod
    def vmap(info, in_dims, taps: torch.Tensor, padding: int) -> tuple[torch.Tensor, int]:
        members = taps.movedim(in_dims[0], 0)
        out = _TapSum.apply(members.flatten(0, 1), padding)
        return out.unflatten(0, members.shape[:2]), 0


class StackDropout(layers.Dropout):
    """The models' CPU dropout (a uniform draw thresholded at p) without its in-place
    comparison, which vmap has no batching rule for: it ran once per member, then stacked
    (decomposable attention's step, 8 members: 0.18 -> 0.25-0.37 s). The same masks' law; each
    member draws its own (``randomness="different"``). (Made in place by an autograd.Function
    with its own vmap rule instead, it measured the same: 33.1 against 33.7 ms per width-50 step,
    177.8 against 174.8 at width 200.)

    Members may differ in their rate (a grid over dropout): the stack then sets ``rate``, a
    buffer no solo model has (not persistent, so not in a member's state_dict), and replaces it
    by the members' rates [k]; each member draws with its own p, on every device."""

    def __init__(self, p: float):
        super().__init__(p)
        self.register_buffer("rate", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.rate is not None:
            keep = torch.rand(x.shape, device=x.device) >= self.rate
            return x * keep.to(x.dtype) / (1.0 - self.rate)
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        keep = torch.rand(x.shape, device=x.device) >= self.p
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))


def _stack_formulation(module: nn.Module) -> nn.Module:
    """``module`` with every nn.Conv1d replaced by its WindowedConv1d, every nn.LSTM by its
    StepwiseLSTM, word-by-word attention by WordByWordEquations and every dropout by StackDropout
    (in place; returns it). An LSTM held under two names (Rocktäschel's shared encoder) becomes
    two StepwiseLSTMs holding the same parameters: ``functional_call`` restores tied parameters,
    but leaves its batched tensors in a module held under two names (torch 2.13)."""
    # _modules, not named_children(): that yields a module held under two names once.
    for name, child in list(module._modules.items()):
        if isinstance(child, nn.Conv1d):
            setattr(module, name, WindowedConv1d(child))
        elif isinstance(child, nn.LSTM):
            setattr(module, name, StepwiseLSTM(child))
        elif isinstance(child, WordByWordAttention):
            setattr(module, name, WordByWordEquations())
        elif isinstance(child, layers.Dropout):
            setattr(module, name, StackDropout(child.p))
        elif child is not None:
            _stack_formulation(child)
    return module


def _key(name: str) -> str:
    """A parameter's dotted name as an attribute name (register_parameter refuses dots)."""
    return name.replace(".", "__")


class StackedModel(nn.Module):
    """k members of one registered architecture (``STACKED_MODELS``) as one module.

    ``forward`` takes a batch as every model does and returns logits [k, B, num_classes].
    ``parameters()`` are the stacked tensors, each [k, *solo shape]; ``stacked_parameters``
    names the trainable ones as the solo model names its own.
    """

    def __init__(self, members: Sequence[nn.Module]):
        """Args:
            members: solo models built with one architecture's arguments (their own seeds);
                their tensors are copied, the members are not kept.
        """
        super().__init__()
        if not members:
            raise ValueError("a stack needs at least one member")
        name = getattr(type(members[0]), "registered_name", type(members[0]).__name__)
        if name not in STACKED_MODELS:
            raise ValueError(f"model {name!r} is not stacked: stacked models are {', '.join(STACKED_MODELS)}")
        if any(type(m) is not type(members[0]) for m in members):
            raise ValueError("stack members must be one architecture")
        if getattr(members[0], "active_blocks", None) not in (None, getattr(members[0], "num_blocks", None)):
            raise ValueError("layerwise training (ABCNN train_blocks_up_to) is not stacked yet")
        self.size = len(members)
        self.model_name = name
        # The solo module whose forward runs once per member under vmap; not a submodule (its own
        # tensors are replaced at every call), so kept out of parameters() and state_dict().
        self.__dict__["template"] = _stack_formulation(copy.deepcopy(members[0]))
        self.member_tensors = nn.Module()  # [k, ...] parameters and buffers
        self.shared_tensors = nn.Module()  # frozen tensors equal in every member, kept once
        self.stacked_names: list[str] = []
        self.shared_names: list[str] = []
        named = [dict(m.named_parameters()) for m in members]
        for key, first in named[0].items():
            values = [n[key] for n in named]
            if len({v.requires_grad for v in values}) != 1 or {v.shape for v in values} != {first.shape}:
                raise ValueError(f"members differ in the shape or trainability of {key}")
            if not first.requires_grad and all(torch.equal(v, first) for v in values):
                self._share(key, first.detach().clone())
            else:
                stacked = torch.stack([v.detach() for v in values])
                self.member_tensors.register_parameter(
                    _key(key), nn.Parameter(stacked, requires_grad=first.requires_grad))
                self.stacked_names.append(key)
        buffers = [dict(m.named_buffers()) for m in members]
        for key, first in buffers[0].items():
            values = [b[key] for b in buffers]
            if all(torch.equal(v, first) for v in values):
                self._share(key, first.clone())
            else:
                self.member_tensors.register_buffer(_key(key), torch.stack(values))
                self.stacked_names.append(key)
        # Dropout rates that differ between members: [k] tensors in place of the template's rate.
        self.rate_names: list[str] = []
        for key, module in members[0].named_modules(remove_duplicate=False):  # each name's dropout
            rates = [float(m.get_submodule(key).p) for m in members] if isinstance(module, layers.Dropout) else []
            if len(set(rates)) > 1:
                self.template.get_submodule(key).rate = torch.tensor(rates[0])
                self.member_tensors.register_buffer(_key(key + ".rate"), torch.tensor(rates))
                self.rate_names.append(key + ".rate")

    def _share(self, key: str, value: torch.Tensor) -> None:
        self.shared_tensors.register_buffer(_key(key), value)
        self.shared_names.append(key)

    @property
    def template(self) -> nn.Module:
        return self.__dict__["template"]

    def stacked_parameters(self) -> dict[str, nn.Parameter]:
        """The trainable [k, ...] parameters by their solo names (e.g. "attend.1.weight")."""
        return {name: tensor for name in self.stacked_names
                if isinstance(tensor := getattr(self.member_tensors, _key(name)), nn.Parameter)
                and tensor.requires_grad}

    def train(self, mode: bool = True) -> StackedModel:
        super().train(mode)
        self.template.train(mode)  # dropout reads the template's flag
        return self

    def forward(self, premise: torch.Tensor, premise_mask: torch.Tensor, hypothesis: torch.Tensor,
                hypothesis_mask: torch.Tensor) -> torch.Tensor:
        """Logits [k, B, num_classes] of every member: for one batch shared by all (the solo
        forward's inputs, [B, L]), or for a batch per member (each input [k, B, L]: members whose
        seeds differ train on their own solo runs' batches, padded to one shape).

        Per-member batches run the models' off-CPU path (``layers.without_host_reads``): what
        the CPU path computes once from the batch on the host (distinct words, real positions,
        NONOVER's kept words) has data-dependent shapes, which vmap cannot batch.
        """
        stacked = {name: getattr(self.member_tensors, _key(name)) for name in self.stacked_names + self.rate_names}
        shared = {name: getattr(self.shared_tensors, _key(name)) for name in self.shared_names}

        def member(tensors: dict[str, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
            return functional_call(self.template, (tensors, shared), inputs)

        inputs = (premise, premise_mask, hypothesis, hypothesis_mask)
        if premise.dim() == 2:
            members = torch.vmap(member, in_dims=(0, None, None, None, None), randomness="different")
            return members(stacked, *inputs)
        self.template.check_lengths(premise_mask, hypothesis_mask)  # every member's batch, outside vmap
        with layers.without_host_reads(), layers.checked_lengths():
            return torch.vmap(member, randomness="different")(stacked, *inputs)

    @torch.no_grad()
    def member_state_dict(self, member: int) -> dict[str, torch.Tensor]:
        """Member ``member``'s weights as its solo model's ``state_dict`` (CPU copies): a solo
        model of the configuration loads them (checkpoints, best-on-dev, test evaluation).

        Args:
            member: the member's index in the stack.
        """
        solo = copy.deepcopy(self.template)
        tensors = dict(solo.named_parameters()) | dict(solo.named_buffers())
        for name in self.stacked_names:
            tensors[name].copy_(getattr(self.member_tensors, _key(name))[member])
        for name in self.shared_names:
            tensors[name].copy_(getattr(self.shared_tensors, _key(name)))
        return {k: v.detach().cpu().clone() for k, v in solo.state_dict().items()}
