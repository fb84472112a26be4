"""Pieces shared by the model modules: masking, pooling, LSTM packing and the
additive attention that Rocktäschel et al. (eq. 7-9) and CAM (eq. 3-5) both use.

Masks are bool tensors, True for a real token, and right-padded (a row is real tokens, then
padding); ``sequence_lengths`` checks the latter because packing an LSTM relies on it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


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
        keep_scaled = torch.rand_like(x).ge_(self.p).mul_(1.0 / (1.0 - self.p))
        return x * keep_scaled


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


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(dim=1)


def sequence_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Real-token count per row; raises if a row is empty or its padding is not at the end."""
    lengths = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, positions.unsqueeze(0) < lengths.unsqueeze(1)):
        raise ValueError("masks must be right-padded: real tokens first, then padding")
    if bool((lengths == 0).any()):
        raise ValueError("every sentence needs at least one real token")
    return lengths


def run_lstm(
    lstm: nn.LSTM,
    inputs: torch.Tensor,
    mask: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Run a batch_first LSTM over rows of different lengths.

    The returned (h_n, c_n) is the state after each row's last real token (not after its
    padding), and the outputs at padding positions are zero. A bidirectional LSTM runs packed.
    A unidirectional one runs in segments of time instead (``_run_segments``): the same
    recurrence, row by row, but each segment is one call of the LSTM on a padded tensor, which
    on CPU is oneDNN's fused kernel, where a packed sequence runs a loop of small operators per
    time step (3x slower for Rocktäschel's attention model at SNLI lengths, batch 32).
    """
    lengths = sequence_lengths(mask)
    if lstm.bidirectional:
        packed = pack_padded_sequence(
            inputs, lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        outputs, final_state = lstm(packed, state)
        outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=inputs.shape[1])
        return outputs, final_state
    return _run_segments(lstm, inputs, lengths, state)


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
    lengths = sequence_lengths(mask)
    outputs, _ = lstm(inputs, state)
    outputs = outputs * mask.unsqueeze(-1).to(outputs.dtype)
    rows = torch.arange(outputs.shape[0], device=outputs.device)
    return outputs, outputs[rows, lengths - 1]


def _run_segments(
    lstm: nn.LSTM,
    inputs: torch.Tensor,
    lengths: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """A unidirectional LSTM over right-padded rows, one LSTM call per distinct length.

    Rows are sorted by length, longest first. With distinct lengths l_1 < ... < l_k, segment j
    runs time steps [l_{j-1}, l_j) for the rows still running (a prefix of the sorted rows),
    starting from their state at the end of segment j - 1; the rows of length l_j end there, and
    their state is their final state. No row ever reads a padding step, so outputs and states are
    those of a packed run.
    """
    batch, steps = inputs.shape[:2]
    shape = (lstm.num_layers, batch, lstm.hidden_size)
    if state is None:
        state = (inputs.new_zeros(shape), inputs.new_zeros(shape))
    lengths_cpu = lengths.cpu()
    if bool((lengths_cpu == steps).all()):  # no padding: one call
        return lstm(inputs, state)
    sorted_lengths, order = torch.sort(lengths_cpu, descending=True, stable=True)
    order = order.to(inputs.device)
    x = inputs.index_select(0, order)
    h, c = (s.index_select(1, order) for s in state)
    ends = sorted(set(sorted_lengths.tolist()))
    running = [int((sorted_lengths >= end).sum()) for end in ends]  # rows of segment j
    outputs, final_h, final_c = [], [], []
    start = 0
    for j, (end, rows) in enumerate(zip(ends, running, strict=True)):
        out, (h, c) = lstm(x[:rows, start:end], (h, c))
        outputs.append(nn.functional.pad(out, (0, 0, 0, 0, 0, batch - rows)))
        still = running[j + 1] if j + 1 < len(ends) else 0
        final_h.append(h[:, still:])  # rows of length `end`, in sorted order, last first
        final_c.append(c[:, still:])
        h, c = h[:, :still], c[:, :still]
        start = end
    outputs.append(inputs.new_zeros(batch, steps - start, lstm.hidden_size))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(batch, device=order.device)
    sorted_outputs = torch.cat(outputs, dim=1)
    h_n = torch.cat(final_h[::-1], dim=1).index_select(1, inverse)
    c_n = torch.cat(final_c[::-1], dim=1).index_select(1, inverse)
    return sorted_outputs.index_select(0, inverse), (h_n, c_n)


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
        self, memory: torch.Tensor, mask: torch.Tensor, query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """memory [B, L, D]; mask [B, L]; query [B, D] -> (r [B, D], α [B, L])."""
        m = torch.tanh(self.w_y(memory) + self.w_h(query).unsqueeze(1))
        alpha = masked_softmax(self.w(m).squeeze(-1), mask)
        return torch.bmm(alpha.unsqueeze(1), memory).squeeze(1), alpha
