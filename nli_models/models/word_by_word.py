"""Word-by-word attention (Rocktäschel et al. eq. 11-13) as one autograd function.

    M_t = tanh(W^y Y + (W^h h_t + W^r r_{t-1}) ⊗ e_L)
    α_t = softmax(w^T M_t)
    r_t = Y α_t^T + tanh(W^t r_{t-1})

r_t depends on r_{t-1}, so the loop over hypothesis words cannot be vectorized; everything else
is moved out of it, because a step is a handful of small ops and each is a kernel launch on a GPU
(an operator call on CPU). W^y Y and W^h h_t (every t) are one matmul each before the loop.

Per step, the forward is six ops on one buffer X_t = [q_t; u_t; M_t] ([B, 2 + Lp, k]):
- one matmul with [W^r; W^t] stacked writes q_t = W^h h_t + W^r r_{t-1} and W^t r_{t-1} into its
  first two rows;
- W^y Y + q_t ⊗ e_L goes into the M_t rows, and one tanh over rows 1.. gives u_t = tanh(W^t r_{t-1})
  and M_t at once;
- w^T X_t with a padding bias (the dtype's minimum at the two leading rows and at premise padding,
  as in masked_softmax: a fully masked row stays finite), its softmax α_t (exactly zero there), and
  r_t = u_t + [0; 0; Y]^T α_t as one ``baddbmm``.
The backward is four per step: the softmax's backward of dα_t, du_t (tanh's backward), dq_t
(dscores_t against w ⊙ (1 - M_t²) of the kept M_t, computed once for all steps), and one matmul
of [dq_t, du_t] against [W^r; W^t] and [W^r; W^t] [0; 0; Y]^T side by side, which adds to dr_{t-1}
and to dα_{t-1} = [0; 0; Y] dr_{t-1} at once (the same sums, associated differently). The
gradients that do not feed the recurrence (dY, dW^y, dW^h, dw, dW^r, dW^t) are one op or two
over all steps at the end. X_t is kept for every step ([steps, B, 2 + Lp, k], about 6 MB at SNLI
lengths, batch 32, k=100), so the backward neither recomputes a tanh nor walks a [B, Lp, k]
tensor per step.

A row whose hypothesis has ended keeps going over the padding, and r is read at each row's last
word: the same r_N as holding r through the padding, without a masked update per step; backward,
those steps get exactly zero gradient. tests/test_models_word_by_word.py checks the function
against eq. 11-13 written with autograd and with torch.autograd.gradcheck.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from nli_models.models.layers import autocast_active

_SLOTS = 2  # the leading rows of X_t: q_t and u_t


class _WordByWord(torch.autograd.Function):
    @staticmethod
    def forward(ctx, memory, memory_mask, queries, query_mask, w_y, w_h, w_r, w_t, w):
        batch, length, dim = memory.shape
        steps = queries.shape[1]
        memory = memory.contiguous()  # the matmuls below read it as [B * Lp, k]
        queries = queries.transpose(0, 1).contiguous()  # step-major, as the loop reads them
        # [W^h h_t, 0]: the matmul's bias that leaves W^t r_{t-1} alone.
        query_bias = (queries.view(-1, dim) @ F.pad(w_h, (0, 0, 0, dim)).t()).view(steps, batch, 2 * dim)
        w_rt = torch.cat([w_r, w_t])
        # [0; 0; Y]^T, for r_t's sum and (backward) dα_t; its transpose feeds the forward's baddbmm.
        memory_t = F.pad(memory.transpose(1, 2), (_SLOTS, 0))
        projected = (memory.view(-1, dim) @ w_y.t()).view(batch, length, dim)  # W^y Y
        x = memory.new_empty(steps, batch, _SLOTS + length, dim)
        alphas = memory.new_empty(steps, batch, _SLOTS + length)
        r = memory.new_zeros(steps + 1, batch, dim)  # r_0 = 0, r_1 ... r_N
        padding = torch.full((batch, _SLOTS + length), torch.finfo(memory.dtype).min, dtype=memory.dtype,
                             device=memory.device)
        padding[:, _SLOTS:].masked_fill_(memory_mask, 0.0)
        padding = padding.view(-1)
        w_vector = w.reshape(-1)
        for t in range(steps):
            torch.addmm(query_bias[t], r[t], w_rt.t(), out=x[t, :, :_SLOTS].view(batch, -1))
            torch.add(projected, x[t, :, :1], out=x[t, :, _SLOTS:])  # W^y Y + q_t ⊗ e_L
            x[t, :, 1:].tanh_()
            scores = torch.addmv(padding, x[t].view(-1, dim), w_vector).view(batch, -1)
            torch.softmax(scores, -1, out=alphas[t])
            torch.baddbmm(x[t, :, 1:2], alphas[t].unsqueeze(1), memory_t.transpose(1, 2),
                          out=r[t + 1].unsqueeze(1))
        last = query_mask.sum(dim=1).view(1, batch, 1).expand(1, batch, dim)  # r_{length} per row
        ctx.save_for_backward(memory, queries, memory_t, x, alphas, r, last, w_y, w_h, w_rt, w)
        weights = torch.mul(alphas[:, :, _SLOTS:].transpose(0, 1), query_mask.unsqueeze(-1),
                            out=memory.new_empty(batch, steps, length))
        ctx.mark_non_differentiable(weights)
        return r.gather(0, last).squeeze(0), weights

    @staticmethod
    def backward(ctx, grad_r_final, _grad_weights):
        memory, queries, memory_t, x, alphas, r, last, w_y, w_h, w_rt, w = ctx.saved_tensors
        steps, batch, rows, dim = x.shape
        # w ⊙ (1 - M_t²) for every step: dscores_t against it sums to dq_t.
        m = x[:, :, _SLOTS:]
        slope = torch.ops.aten.tanh_backward(w.reshape(-1).expand_as(m), m)
        # [W^r; W^t] and [W^r; W^t] [0; 0; Y]^T side by side: one matmul of [dq_t, du_t] against
        # it adds to dr_{t-1} and, with it, to dα_{t-1} = [0; 0; Y] dr_{t-1}, which step t-1 needs.
        through = memory.new_empty(batch, 2 * dim, dim + rows)
        through[:, :, :dim] = w_rt
        torch.bmm(w_rt.expand(batch, -1, -1), memory_t, out=through[:, :, dim:])
        # grad[i] = [dr_i, dα_{i-1}], complete once step i is done; first r_N's upstream gradient.
        grad = memory.new_zeros(steps + 1, batch, dim + rows)
        if grad_r_final is not None:
            grad[:, :, :dim].scatter_(0, last, grad_r_final.unsqueeze(0))
            torch.bmm(grad[:, :, :dim].transpose(0, 1), memory_t, out=grad[:, :, dim:].transpose(0, 1))
        grad_query_u = memory.new_empty(steps, batch, 2 * dim)  # [dq_t, du_t]
        grad_scores = memory.new_empty(steps, batch, rows)
        for t in reversed(range(steps)):
            torch._softmax_backward_data(grad[t + 1, :, dim:], alphas[t], -1, alphas.dtype,
                                         grad_input=grad_scores[t])
            torch.ops.aten.tanh_backward.grad_input(grad[t + 1, :, :dim], x[t, :, 1],
                                                    grad_input=grad_query_u[t, :, dim:])
            torch.bmm(grad_scores[t, :, None, _SLOTS:], slope[t], out=grad_query_u[t, :, None, :dim])
            grad[t].unsqueeze(1).baddbmm_(grad_query_u[t].unsqueeze(1), through)
        grad_r = grad[:, :, :dim]
        # d(W^y Y) = the sum over steps of dscores_t ⊗ w ⊙ (1 - M_t²).
        grad_projected = slope.mul_(grad_scores[:, :, _SLOTS:, None]).sum(dim=0)
        grad_memory = torch.baddbmm(grad_projected @ w_y, alphas[:, :, _SLOTS:].permute(1, 2, 0),
                                    grad_r[1:].transpose(0, 1))
        grad_w_y = grad_projected.view(-1, dim).t() @ memory.view(-1, dim)
        grad_queries = grad_query_u[:, :, :dim].reshape(-1, dim)
        grad_w_h = grad_queries.t() @ queries.view(-1, dim)
        grad_queries = (grad_queries @ w_h).view(steps, batch, dim).transpose(0, 1)
        grad_w = grad_scores.view(1, -1) @ x.view(-1, dim)
        grad_w_r, grad_w_t = (grad_query_u.view(-1, 2 * dim).t() @ r[:-1].view(-1, dim)).split(dim)
        return grad_memory, None, grad_queries, None, grad_w_y, grad_w_h, grad_w_r, grad_w_t, grad_w


def word_by_word_attention(
    memory: torch.Tensor,
    memory_mask: torch.Tensor,
    queries: torch.Tensor,
    query_mask: torch.Tensor,
    w_y: torch.Tensor,
    w_h: torch.Tensor,
    w_r: torch.Tensor,
    w_t: torch.Tensor,
    w: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """memory Y [B, Lp, k], memory_mask [B, Lp]; queries h_t [B, Lh, k], query_mask [B, Lh];
    w_y, w_h, w_r, w_t [k, k]; w [1, k] -> (r_N [B, k], α [B, Lh, Lp], zero on padded hypothesis
    words)."""
    args = (memory, memory_mask, queries, query_mask, w_y, w_h, w_r, w_t, w)
    device = memory.device.type
    if autocast_active(device):
        # The function writes into float buffers it allocates; under autocast it runs in float32.
        with torch.autocast(device, enabled=False):
            return _WordByWord.apply(*(x.float() if x.is_floating_point() else x for x in args))
    return _WordByWord.apply(*args)
