"""Pieces shared by the model modules: masking, pooling, LSTM packing and the
additive attention that Rocktäschel et al. (eq. 7-9) and CAM (eq. 3-5) both use.

Masks are bool tensors, True for a real token, and right-padded (a row is real tokens, then
padding); ``sequence_lengths`` checks the latter on CPU because the held LSTM run relies on it.

Off the CPU (CUDA) nothing here reads a tensor's values on the host: a read (``.item()``,
``.tolist()``, ``bool(t)``, a data-dependent shape as of ``unique`` or ``nonzero``) waits for the
GPU to finish everything queued, once per call, i.e. many times per training step. The CPU keeps
the shortcuts that need such reads (running a layer once per distinct word or real position); a
GPU runs the same layer over every position, where the extra rows cost little.
tests/test_host_sync.py runs every model's forward and backward on the meta device (no values at
all), which takes the same branches as CUDA.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nli_models.embeddings import PAD_INDEX
from nli_models.models.stepwise_lstm import StepwiseLSTM


class Dropout(nn.Dropout):
    """nn.Dropout with a cheaper mask on CPU; the same module (state, repr, eval behaviour).

    torch's CPU ``bernoulli_`` draws each mask element in a branchy scalar loop whose cost grows
    with p (torch 2.13, one thread, 144k elements: 0.8 ms at p=0.1, 1.5 ms at p=0.4, against
    0.4 ms for ``rand_like``). With 2-4 dropout layers per step, that made a decomposable
    attention epoch 27% longer at p=0.4 than at p=0.1, and sweep trials of unequal length leave
    slots idle. Thresholding a uniform draw is exact (24-bit uniforms) and costs the same for every
    p. CUDA keeps torch's fused kernel.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        # The uniform draw is float32 whatever x's dtype: a bfloat16 one (bf16 autocast) has 8
        # bits, which would shift the drop rate.
        keep = torch.rand(x.shape, device=x.device).ge_(self.p)
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax that gives padding exactly zero weight; ``mask`` broadcasts against ``scores``."""
    # The dtype's minimum rather than -inf: a fully masked row (a padding query) stays finite.
    return torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=dim)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over dim 1 of [B, L, D] values, skipping padding."""
    return (values * mask.unsqueeze(-1).to(values.dtype)).sum(dim=1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    counts = mask.sum(dim=1, keepdim=True).clamp(min=1).to(values.dtype)
    return masked_sum(values, mask) / counts


def padding_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 at a real token and the dtype's minimum at padding: added to scores, it is masked_softmax's
    fill (score + minimum rounds to the minimum) by an add that a matmul can fuse, and with no
    op in backward; computed once per batch for every attention over a sentence, in one kernel
    (a choice between two constants)."""
    real, padding = _bias_values(dtype, mask.device)
    return torch.where(mask, real, padding)


@functools.cache
def _bias_values(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``padding_bias``'s two values as 0-d tensors, built once per dtype and device (a Python
    number in ``torch.where`` becomes a tensor, one more op, at every call)."""
    return (torch.zeros((), dtype=dtype, device=device),
            torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device))


_HOST_READS = contextvars.ContextVar("host_reads", default=True)


def on_host(tensor: torch.Tensor) -> bool:
    """Reading this tensor's values costs no device synchronisation (and no
    ``without_host_reads`` block is running)."""
    return tensor.device.type == "cpu" and _HOST_READS.get()


@contextlib.contextmanager
def without_host_reads() -> Iterator[None]:
    """While the block runs the models take their off-CPU path on every device: no value is read
    on the host and no shape depends on the data. A stack whose members train on batches of
    their own runs under ``torch.vmap`` with the batch as a batched input, whose values vmap
    cannot expose (``nli_models.stacked``); tests/test_host_sync.py checks the two paths agree."""
    token = _HOST_READS.set(False)
    try:
        yield
    finally:
        _HOST_READS.reset(token)


_LENGTHS_CHECKED = contextvars.ContextVar("lengths_checked", default=False)


def lengths_checked() -> bool:
    """A ``checked_lengths`` block is running: the caller checked the batch's sentence lengths."""
    return _LENGTHS_CHECKED.get()


@contextlib.contextmanager
def checked_lengths() -> Iterator[None]:
    """While the block runs ``PairClassifier.forward`` skips ``check_lengths``: a stack whose
    members train on batches of their own checks every member's batch once, outside ``torch.vmap``
    (whose batched masks neither a host read nor ``torch._assert_async`` can take)."""
    token = _LENGTHS_CHECKED.set(True)
    try:
        yield
    finally:
        _LENGTHS_CHECKED.reset(token)


def distinct_words(*ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The distinct word ids of a batch, and per ``ids`` tensor each position's index into them.

    A layer applied to each word on its own (the lookup, decomposable attention's normalisation,
    a projection) then runs once per distinct word, ``gather_rows(table, index)`` gathering it
    back, instead of once per position: a batch of 32 SNLI pairs has ~1,500 positions, half of
    them padding, and ~400 distinct words. Each row is the same computation; the gather's
    backward sums a word's gradients before the layer's, which changes only the order of a float
    sum. On the CPU only: off it, unique's output size would need a host sync, and callers run
    their layer over every position instead (``per_word``).
    """
    flat = torch.cat([i.reshape(-1) for i in ids])
    words, inverse = torch.unique(flat, return_inverse=True)
    indices = inverse.split([i.numel() for i in ids])
    return words, [index.view_as(i) for index, i in zip(indices, ids, strict=True)]


def per_word(layer, *ids: torch.Tensor) -> list[torch.Tensor]:
    """``layer`` (word ids [N] -> [N, D]) at every position of each ids tensor -> [*ids.shape, D]
    each. On CPU it runs once per distinct word, gathered back (``distinct_words``); off the CPU,
    where the "distinct" words are every position's, its rows are split back as views instead of
    gathered through an identity index (no gather forward, no scatter backward)."""
    if on_host(ids[0]):
        words, indices = distinct_words(*ids)
        table = layer(words)
        return [gather_rows(table, index) for index in indices]
    rows = layer(torch.cat([i.reshape(-1) for i in ids]))
    return [part.view(*i.shape, -1) for part, i in zip(rows.split([i.numel() for i in ids]), ids, strict=True)]


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a [N, D] table, with a deterministic backward: ``table[index]``'s
    backward (index_put_ with accumulate) adds a row's gradients in a thread-dependent order on
    CPU with 2+ threads, so two runs of one seed drifted apart; the embedding backward used here
    sums them in a fixed order on CPU and CUDA."""
    return F.embedding(index, table)


class RealPositions:
    """The real (not padding) positions of a few batches of sentences, for a layer that acts on
    each word on its own (decomposable attention's F and G): ``apply`` runs it once over the real
    words of all the batches, stacked as [N, D], and puts each batch's back in its padded shape,
    zero at padding. The layer's result at a real position is the same; padding, about 45% of the
    positions of a random SNLI batch, costs no matmul and no dropout mask. Off the CPU (where
    finding the real positions, ``nonzero``, would need a host sync) the layer runs over every
    position and padding is set to zero after it."""

    def __init__(self, *masks: torch.Tensor):
        self.masks = masks
        self.dense = not all(on_host(mask) for mask in masks)
        if self.dense:  # both sentences of a pair are one batch off the CPU (SentencePair.parts)
            return
        # Per batch: the flat index (row * L + position) and the row of each real position.
        self.rows, self.flat = [], []
        for mask in masks:
            rows, positions = mask.nonzero(as_tuple=True)
            self.rows.append(rows)
            self.flat.append(rows * mask.shape[1] + positions)
        self.counts = [len(rows) for rows in self.rows]

    def _stacked(self, layer: nn.Module, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        words = torch.cat([
            v.reshape(-1, v.shape[-1]).index_select(0, flat)
            for v, flat in zip(values, self.flat, strict=True)
        ])
        return layer(words).split(self.counts)

    def _padded(self, layer: nn.Module, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The dense path: the layer over every position, zero at padding (a product with the
        bool mask: one kernel, where a fill needs the mask inverted first)."""
        return [layer(v) * mask.unsqueeze(-1) for v, mask in zip(values, self.masks, strict=True)]

    def apply(self, layer: nn.Module, *values: torch.Tensor) -> list[torch.Tensor]:
        """``layer`` on each batch's real words -> per batch [B, L, D_out], zero at padding."""
        if self.dense:
            return self._padded(layer, values)
        return [
            words.new_zeros(mask.numel(), words.shape[-1]).index_copy(0, flat, words).view(*mask.shape, -1)
            for words, mask, flat in zip(self._stacked(layer, values), self.masks, self.flat, strict=True)
        ]

    def summed(self, layer: nn.Module, *values: torch.Tensor) -> list[torch.Tensor]:
        """``layer`` on each batch's real words, summed over each sentence -> per batch [B, D_out]
        (``masked_sum`` of the padded result)."""
        if self.dense:
            return [words.sum(dim=1) for words in self._padded(layer, values)]
        return [
            words.new_zeros(mask.shape[0], words.shape[-1]).index_add(0, rows, words)
            for words, mask, rows in zip(self._stacked(layer, values), self.masks, self.rows, strict=True)
        ]


def same_length(a_ids: torch.Tensor, a_mask: torch.Tensor, b_ids: torch.Tensor, b_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Off the CPU, both sentences' ids and masks padded to the longer one's length (with
    ``PAD_INDEX`` and False), so that layers shared by both run as one batch (``on_both_sentences``)
    and nothing needs cutting back; on the CPU, as they are (padding would cost compute there)."""
    if on_host(a_mask):
        return a_ids, a_mask, b_ids, b_mask
    length = max(a_ids.shape[1], b_ids.shape[1])

    def pad(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        extra = length - ids.shape[1]
        if extra == 0:  # F.pad would still copy
            return ids, mask
        return F.pad(ids, (0, extra), value=PAD_INDEX), F.pad(mask, (0, extra), value=False)

    return (*pad(a_ids, a_mask), *pad(b_ids, b_mask))


def attention_at_lengths(weights: dict[str, torch.Tensor], lengths: dict[str, int]) -> dict[str, torch.Tensor]:
    """Attention maps cut back to the sentences' own lengths after ``same_length`` padded them
    (views: no kernel). A map "X_to_Y" is [B, L_X, L_Y]; a map "X_intra" has every axis after
    the batch over sentence X. ``lengths``: each sentence's length by name ("premise", ...)."""
    cut = {}
    for name, weight in weights.items():
        if name.endswith("_intra"):
            length = lengths[name.removesuffix("_intra")]
            cut[name] = weight[(slice(None), *(slice(length) for _ in weight.shape[1:]))]
        else:
            rows, columns = name.split("_to_")
            cut[name] = weight[:, : lengths[rows], : lengths[columns]]
    return cut


class SentencePair:
    """Values of both sentences of a batch ([B, L, ...] each). Off the CPU they are one [2B, L, ...]
    tensor (``same_length`` gave them one length): a layer shared by both runs once over both, half
    the kernel launches of two calls, where a step is launch-bound. On the CPU they are two tensors,
    each sentence at its own length, where padding would cost compute. The values are the same
    (tests/test_host_sync.py checks the two paths agree)."""

    def __init__(self, values: torch.Tensor | tuple[torch.Tensor, torch.Tensor], batch: int):
        self.values, self.batch = values, batch

    @classmethod
    def of(cls, first: torch.Tensor, second: torch.Tensor) -> SentencePair:
        if on_host(first):
            return cls((first, second), first.shape[0])
        if first.shape[1] != second.shape[1]:
            raise ValueError("on_both_sentences needs sentences of one length off the CPU (same_length)")
        return cls(torch.cat([first, second]), first.shape[0])

    def map(self, function, *others: SentencePair) -> tuple[SentencePair, ...]:
        """``function(values, *others' values)`` on each sentence, or once on both; it returns a
        tuple of tensors, one pair each."""
        if not isinstance(self.values, tuple):
            return tuple(SentencePair(out, self.batch)
                         for out in function(self.values, *(o.values for o in others)))
        each = [function(self.values[i], *(o.values[i] for o in others)) for i in (0, 1)]
        return tuple(SentencePair(pair, self.batch) for pair in zip(*each, strict=True))

    @property
    def parts(self) -> tuple[torch.Tensor, ...]:
        """The tensors held: each sentence's on the CPU, the one joint tensor off it (what
        ``RealPositions`` takes and returns)."""
        return self.values if isinstance(self.values, tuple) else (self.values,)

    def like(self, parts: Sequence[torch.Tensor]) -> SentencePair:
        """Tensors laid out as ``parts`` lays out this pair's, as a pair."""
        return SentencePair(tuple(parts) if isinstance(self.values, tuple) else parts[0], self.batch)

    def halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(first sentence's, second sentence's)."""
        if isinstance(self.values, tuple):
            return self.values
        # split, not two slices: its backward is one kernel, theirs two each.
        first, second = self.values.split(self.batch)
        return first, second

    def swapped(self) -> SentencePair:
        """Each sentence's partner's values."""
        first, second = self.halves()
        return SentencePair.of(second, first)


def on_both_sentences(function, a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]
                      ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """``function(*a)`` and ``function(*b)``: a layer shared by both sentences (its inputs, e.g.
    values and mask, are [B, L, ...] per sentence; it returns a tuple of [B, ...] tensors), run
    once over both off the CPU (``SentencePair``)."""
    first, *rest = (SentencePair.of(x, y) for x, y in zip(a, b, strict=True))
    halves = [out.halves() for out in first.map(function, *rest)]
    return tuple(h[0] for h in halves), tuple(h[1] for h in halves)


def sequence_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Real-token count per row. On CPU it also raises if a row is empty or its padding is not at
    the end; off the CPU that check would cost a host sync per call, and the trainer's batches
    need none: ``make_batch`` pads on the right and encoding turns an empty sentence into one
    <unk> (``nli_models.data.encode``)."""
    lengths = mask.sum(dim=1)
    if not on_host(mask):
        return lengths
    positions = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, positions.unsqueeze(0) < lengths.unsqueeze(1)):
        raise ValueError("masks must be right-padded: real tokens first, then padding")
    if bool((lengths == 0).any()):
        raise ValueError("every sentence needs at least one real token")
    return lengths


# On CUDA the held run's widened input weights are not nn.LSTM's flattened cuDNN buffer, so cuDNN
# packs the weights into one at every call and warns that it does: a copy of one LSTM's weights
# (under 6 MB at paper sizes), expected here, and small next to the step's kernels.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")

# A padding step's input gate pre-activation gets -PADDING_HOLD and its forget gate's +PADDING_HOLD,
# so the sigmoids are exactly 0 and 1 (they saturate beyond ~17 in float32, ~9 in float16): the cell
# state passes the step unchanged and the step passes no gradient to anything else. The rest of
# the pre-activation is W_ih x + b + W_hh h (x a padding word's vector, |h| < 1), far below 1e4
# unless the weights have blown up; 1e4 is finite in float16 and bfloat16, so 0 x PADDING_HOLD
# stays 0.
PADDING_HOLD = 1e4


def autocast_active(device_type: str) -> bool:
    """Autocast is on for this device type (False for a type autocast does not know, e.g. meta)."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


class recurrent_precision:  # noqa: N801 (a context manager, used like torch.autocast)
    """Runs an LSTM in float32 under autocast. Autocast's cuDNN RNN path casts an LSTM to float16
    whatever autocast's dtype (bf16 included), with no loss scaling: the recurrent layers would
    silently run in fp16. So under autocast they run with it disabled, inputs and state cast to
    float32 (the parameters are float32); their outputs are float32 and the layers after them
    autocast as usual. Word-by-word attention's recurrence does the same
    (``word_by_word_attention``)."""

    def __init__(self, inputs: torch.Tensor):
        device = inputs.device.type
        self.active = autocast_active(device)
        self.disabled = torch.autocast(device, enabled=False) if self.active else None

    def __enter__(self):
        if self.disabled is not None:
            self.disabled.__enter__()
        return self

    def __exit__(self, *exc):
        if self.disabled is not None:
            self.disabled.__exit__(*exc)

    def cast(self, *tensors):
        """The tensors in float32 under autocast (None stays None), as they are otherwise."""
        if not self.active:
            return tensors
        return tuple(None if t is None else _float32(t) for t in tensors)


def _float32(value):
    if isinstance(value, tuple):
        return tuple(_float32(v) for v in value)
    return value.float()


def run_lstm(
    lstm: nn.LSTM,
    inputs: torch.Tensor,
    mask: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    final_h: bool = True,
) -> tuple[torch.Tensor, tuple[torch.Tensor | None, torch.Tensor]]:
    """Run a batch_first LSTM over rows of different lengths (in float32 under autocast).

    The returned (h_n, c_n) is the state after each row's last real token (not after its
    padding), and the outputs at padding positions are zero. With ``final_h=False`` h_n may be
    None: off the CPU, reading it out of a held run costs ops that a caller who drops it saves.
    A one-layer unidirectional LSTM runs as one call over the padded rows with the padding steps
    held (``_run_held``): on CPU one oneDNN fused kernel, where a packed sequence runs a loop of small operators per time step (3x
    slower for Rocktäschel's attention model at SNLI lengths, batch 32); off the CPU no host
    sync, where packing needs the lengths on the host. Off the CPU a bidirectional LSTM from zeros
    runs held too (its reverse direction reads the padding first and stays exactly at zero through
    it); on CPU it runs packed, per real token, as CAM's BiLSTM always has. Anything else
    (stacked LSTMs, projections, a bidirectional LSTM from a given state) runs packed, with one
    host read of the lengths.
    """
    with recurrent_precision(inputs) as precision:
        inputs, state = precision.cast(inputs, state)
        if isinstance(lstm, StepwiseLSTM):  # a stack's copy of the model (nli_models.stacked)
            outputs, (h_n, c_n) = lstm.run(inputs, mask, state)
            return outputs, (h_n if final_h else None, c_n)
        # Off the CPU a held run that drops h_n needs no lengths (on CPU they check the mask).
        lengths = sequence_lengths(mask) if final_h or on_host(mask) else None
        bidirectional_held = state is None and not on_host(inputs)
        if lstm.num_layers == 1 and not lstm.proj_size and (not lstm.bidirectional or bidirectional_held):
            return _run_held(lstm, inputs, mask, lengths, state)
        packed = pack_padded_sequence(inputs, lengths.cpu(), batch_first=True, enforce_sorted=False)
        outputs, (h_n, c_n) = lstm(packed, state)
        outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=inputs.shape[1])
        return outputs, (h_n if final_h else None, c_n)


def run_lstm_outputs(
    lstm: nn.LSTM,
    inputs: torch.Tensor,
    mask: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A unidirectional LSTM's outputs (zero at padding) and the top layer's h after each row's
    last real token, as ``run_lstm`` gives them, for callers that need no final cell state: one
    LSTM call over the padded rows. Exact because the LSTM is causal: a real position never
    sees the padding after it, and h_n is the output at the last real token."""
    if lstm.bidirectional:
        raise ValueError("run_lstm_outputs needs a unidirectional LSTM")
    with recurrent_precision(inputs) as precision:
        inputs, state = precision.cast(inputs, state)
        if isinstance(lstm, StepwiseLSTM):  # a stack's copy of the model (nli_models.stacked)
            outputs, (h_n, _) = lstm.run(inputs, mask, state)
            return outputs, h_n[-1]
        lengths = sequence_lengths(mask)
        outputs, _ = lstm(inputs, state)
        # Zeroed in the LSTM's own (time-major) layout: word-by-word attention reads them per step.
        outputs = outputs * mask.unsqueeze(-1)
        return outputs, _at_last_token(outputs, lengths)


def _at_last_token(outputs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's output at its last real token, [B, D]."""
    last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, outputs.shape[-1])
    return outputs.gather(1, last).squeeze(1)


@functools.cache
def _hold_weights(hidden: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The held run's extra input column (see ``_run_held``): a constant, built once."""
    hold = torch.zeros(4 * hidden, 1, dtype=dtype, device=device)
    hold[:hidden], hold[hidden : 2 * hidden] = -PADDING_HOLD, PADDING_HOLD
    return hold


def _run_held(
    lstm: nn.LSTM,
    inputs: torch.Tensor,
    mask: torch.Tensor,
    lengths: torch.Tensor | None,
    state: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor | None, torch.Tensor]]:
    """A one-layer LSTM over right-padded rows in one call, as a packed run.

    The input gets one more feature, 1 at padding, whose input weights are -PADDING_HOLD into the
    input gate and +PADDING_HOLD into the forget gate (PyTorch's gate order: input, forget, cell,
    output). At a padding step i = 0 and f = 1 exactly, so c_t = c_{t-1}: the LSTM's final cell
    state is each row's state after its last real token. Backward, the saturated gates pass
    exactly dc_{t-1} = dc_t and nothing else, so gradients are a packed run's too. h after the
    padding is not held (o moves), so h_n is read at the last real token, as the outputs are.
    A reverse direction (bidirectional, from zeros) meets the padding first: c stays 0, so
    h = o tanh(0) = 0, and it reaches each row's last real token from exactly the zero state; its
    final state is after position 0, as a packed run's. The padding inputs themselves need no
    zeroing: with i = 0 they reach no state, and every gate's gradient there is exactly zero
    (σ' = 0 at ±PADDING_HOLD, di = dg = 0, and do = dh tanh(c) with dh = 0 after the last real
    token, c = 0 before a reverse direction's first), so neither they nor W_ih get any.
    """
    hidden = lstm.hidden_size
    directions = 2 if lstm.bidirectional else 1
    # 1.0 at padding, written as inputs' dtype by the one op.
    padding = torch.logical_not(mask, out=inputs.new_empty(mask.shape)).unsqueeze(-1)
    hold = _hold_weights(hidden, inputs.dtype, inputs.device)
    weights = []
    for suffix in ("_l0", "_l0_reverse")[:directions]:
        weights += [torch.cat([getattr(lstm, "weight_ih" + suffix), hold], dim=1),
                    getattr(lstm, "weight_hh" + suffix)]
        if lstm.bias:
            weights += [getattr(lstm, "bias_ih" + suffix), getattr(lstm, "bias_hh" + suffix)]
    if state is None:
        zeros = inputs.new_zeros(directions, inputs.shape[0], hidden)
        state = (zeros, zeros)
    held_inputs = torch.cat([inputs, padding], dim=-1)
    # nn.LSTM.forward's own call, with the widened input weights (one oneDNN kernel on CPU).
    outputs, h_n, c_n = torch._VF.lstm(
        held_inputs, state, weights, lstm.bias, 1, 0.0, lstm.training, lstm.bidirectional, True
    )
    # Zeroed at padding, the mask first: the product takes its (contiguous) layout, where the
    # LSTM's batch-first outputs are a transposed view that a matmul over them would copy first.
    outputs = mask.unsqueeze(-1) * outputs
    if lengths is None:  # h_n not wanted
        return outputs, (None, c_n)
    forward_h = _at_last_token(outputs[..., :hidden], lengths).unsqueeze(0)
    h_n = torch.cat([forward_h, h_n[1:]]) if lstm.bidirectional else forward_h
    return outputs, (h_n, c_n)


class AdditiveAttention(nn.Module):
    """M = tanh(W^y Y + W^h h ⊗ e_L), α = softmax(w^T M), r = Y α^T (Rocktäschel eq. 7-9).

    Word-by-word attention (eq. 11-13) reuses the three projections in
    ``nli_models.models.word_by_word``.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.w_y = nn.Linear(dim, dim, bias=False)
        self.w_h = nn.Linear(dim, dim, bias=False)
        self.w = nn.Linear(dim, 1, bias=False)

    def forward(
        self, memory: torch.Tensor, padding: torch.Tensor, query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """memory [B, L, D]; padding [B, L] or [B, 1, L] (``padding_bias``); query [B, D]
        -> (r [B, D], α [B, L])."""
        batch, length, dim = memory.shape
        m = torch.tanh(self.w_y(memory) + self.w_h(query).unsqueeze(1))
        # w^T M + the padding bias in one addmm: masked_softmax's scores.
        scores = torch.addmm(padding.reshape(-1, 1), m.view(-1, dim), self.w.weight.t())
        alpha = torch.softmax(scores.view(batch, length), dim=-1)
        return torch.bmm(alpha.unsqueeze(1), memory).squeeze(1), alpha
