"""Word-by-word attention (Rocktäschel et al. eq. 11-13) as an autograd function.

    M_t = tanh(W^y Y + (W^h h_t + W^r r_{t-1}) ⊗ e_L)
    α_t = softmax(w^T M_t)
    r_t = Y α_t^T + tanh(W^t r_{t-1})

r_t depends on r_{t-1}, so the loop over hypothesis words cannot be vectorized. Written with
autograd, each step keeps its [B, Lp, k] tanh output and the backward builds the gradients of the
[B, Lp, k] terms from outer-product matmuls: at 80 tokens the loop cost 3.9x the whole
conditional-encoding model. Two functions replace it, one per cost model; both are tested against
eq. 11-13 written with autograd and with torch.autograd.gradcheck
(tests/test_models_word_by_word.py), and tests/test_host_sync.py checks they agree.

On CPU a step is bound by one core's cache bandwidth (``_Recomputed``): the forward keeps only the
step's query W^h h_t + W^r r_{t-1} and the attention weights; the backward recomputes M_t into one
cache-resident buffer, turns it into dM_t in place, and accumulates d(W^y Y) in place. The
gradients that do not feed the recurrence (dY through the attention sums, dW^r, dW^t) are one
matmul each over all steps at the end.

On a GPU a step is bound by kernel launches (``_Kept``): everything not recurrent is moved out of
the loop, and the loop is ten ops per hypothesis word where the CPU function has twenty-odd. The
forward is six ops on one buffer X_t = [q_t; u_t; M_t] ([B, 2 + Lp, k]):
- one matmul with [W^r; W^t] stacked writes q_t = W^h h_t + W^r r_{t-1} and W^t r_{t-1} into its
  first two rows (W^y Y and W^h h_t are one matmul each before the loop);
- W^y Y + q_t ⊗ e_L goes into the M_t rows, and one tanh over rows 1.. gives u_t = tanh(W^t r_{t-1})
  and M_t at once;
- w^T X_t with a padding bias (the dtype's minimum at the two leading rows and at premise padding,
  as in masked_softmax: a fully masked row stays finite), its softmax α_t (exactly zero there), and
  r_t = u_t + [0; 0; Y]^T α_t as one ``baddbmm``.
The backward is four per step: the softmax's backward of dα_t, du_t (tanh's backward), dq_t
(dscores_t against w ⊙ (1 - M_t²) of the kept M_t, computed once for all steps), and one matmul
of [dq_t, du_t] against [W^r; W^t] and [W^r; W^t] [0; 0; Y]^T side by side, which adds to dr_{t-1}
and to dα_{t-1} = [0; 0; Y] dr_{t-1} at once (the same sums, associated differently). The
gradients that do not feed the recurrence are one op or two over all steps at the end. X_t is kept
for every step ([steps, B, 2 + Lp, k], about 6 MB at SNLI lengths, batch 32, k=100). A row whose
hypothesis has ended keeps going over the padding, and r is read at each row's last word: the same
r_N as holding r through the padding, without a masked update per step; backward, those steps get
exactly zero gradient. On CPU this function is slower (its kept tensors leave the cache, and the
side-by-side matmul is a batched matrix-vector product): 10.6 ms against 7.5 ms forward and
backward at batch 32, 13 x 11 tokens, k=100.

Neither function can run under ``torch.vmap`` (they write into buffers they allocate). A stack of
members (``nli_models.stacked``) runs the model's ``WordByWordAttention`` module as
``WordByWordEquations``: eq. 11-13 as written, with autograd (``word_by_word_equations``, the
reference both functions are tested against), which vmap batches over the members.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from nli_models.models.layers import autocast_active, masked_softmax, on_host

_SLOTS = 2  # the leading rows of X_t: q_t and u_t


class _Recomputed(torch.autograd.Function):
    """The CPU's: M_t recomputed in backward into one cache-resident buffer."""

    @staticmethod
    def forward(ctx, memory, projected_memory, memory_mask, projected_queries, query_mask, w_r, w_t, w):
        batch, length, dim = memory.shape
        steps = projected_queries.shape[1]
        queries = memory.new_empty(steps, batch, dim)  # W^h h_t + W^r r_{t-1}, kept for backward
        m = memory.new_empty(batch, length, dim)  # M_t, one step at a time: backward recomputes it
        alphas = memory.new_empty(steps, batch, length)
        r = memory.new_zeros(steps + 1, batch, dim)  # r_0 = 0, r_1 ... r_N
        u = memory.new_empty(steps, batch, dim)  # tanh(W^t r_{t-1})
        # As masked_softmax: padding scores become the dtype's minimum (a fully masked row stays
        # finite), added to w^T M_t by the same matrix-vector op.
        padding = torch.zeros(batch * length, dtype=memory.dtype, device=memory.device)
        padding.masked_fill_(~memory_mask.reshape(-1), torch.finfo(memory.dtype).min)
        w_vector = w.reshape(-1)
        ended = (~query_mask).any(dim=0).tolist()  # per step: has some row's hypothesis ended?
        for t in range(steps):
            torch.addmm(projected_queries[:, t], r[t], w_r.t(), out=queries[t])
            torch.add(projected_memory, queries[t].unsqueeze(1), out=m).tanh_()
            scores = torch.addmv(padding, m.view(-1, dim), w_vector).view(batch, length)
            alphas[t] = torch.softmax(scores, dim=-1)
            attended = torch.bmm(alphas[t].unsqueeze(1), memory).squeeze(1)
            torch.mm(r[t], w_t.t(), out=u[t]).tanh_()
            if ended[t]:  # rows whose hypothesis already ended keep their r
                torch.where(query_mask[:, t, None], attended + u[t], r[t], out=r[t + 1])
            else:
                torch.add(attended, u[t], out=r[t + 1])
        ctx.save_for_backward(memory, projected_memory, query_mask, w_r, w_t, w, queries, alphas, r, u)
        ctx.ended = ended
        weights = (alphas.permute(1, 0, 2) * query_mask.unsqueeze(-1)).contiguous()
        ctx.mark_non_differentiable(weights)
        return r[steps].clone(), weights

    @staticmethod
    def backward(ctx, grad_r, _grad_weights):
        memory, projected_memory, query_mask, w_r, w_t, w, queries, alphas, r, u = ctx.saved_tensors
        steps, batch, dim = queries.shape
        w_vector = w.reshape(-1)
        grad_projected_memory = torch.zeros_like(memory)
        grad_w = torch.zeros_like(w_vector)
        grad_attended = memory.new_empty(steps, batch, dim)
        grad_query = memory.new_empty(steps, batch, dim)
        grad_u_pre = 1 - u * u  # becomes the gradient through tanh(W^t r_{t-1}), step by step
        memory_t = memory.transpose(1, 2).contiguous()  # row vector x matrix: 4x faster bmm on CPU
        m_t = memory.new_empty(memory.shape)
        scratch = memory.new_empty(memory.shape)
        live = query_mask.to(memory.dtype).t().unsqueeze(-1)  # [steps, B, 1]
        ended = ctx.ended
        grad = grad_r if grad_r is not None else memory.new_zeros(batch, dim)
        for t in reversed(range(steps)):
            if ended[t]:  # rows whose hypothesis ended get no gradient through this step
                grad_new = torch.mul(grad, live[t], out=grad_attended[t])
            else:
                grad_new = grad
                grad_attended[t] = grad
            grad_u_pre[t].mul_(grad_new)
            grad_alpha = torch.bmm(grad_new.unsqueeze(1), memory_t).squeeze(1)
            grad_scores = torch._softmax_backward_data(grad_alpha, alphas[t], -1, alphas.dtype)
            torch.add(projected_memory, queries[t].unsqueeze(1), out=m_t).tanh_()
            grad_w.addmv_(m_t.view(-1, dim).t(), grad_scores.view(-1))
            torch.mul(grad_scores.unsqueeze(-1), w_vector, out=scratch)
            grad_pre = torch.ops.aten.tanh_backward.grad_input(scratch, m_t, grad_input=m_t)  # dM_t in place
            grad_projected_memory.add_(grad_pre)
            torch.sum(grad_pre, dim=1, out=grad_query[t])
            through = torch.mm(grad_query[t], w_r).addmm_(grad_u_pre[t], w_t)
            grad = through.add_(grad - grad_new) if ended[t] else through  # ended rows pass r through
        # The parts that do not feed the recurrence: one matmul each over all steps.
        grad_memory = torch.bmm(alphas.permute(1, 2, 0), grad_attended.transpose(0, 1))
        previous = r[:-1].reshape(-1, dim)
        grad_w_r = grad_query.reshape(-1, dim).t() @ previous
        grad_w_t = grad_u_pre.reshape(-1, dim).t() @ previous
        return (grad_memory, grad_projected_memory, None, grad_query.transpose(0, 1), None,
                grad_w_r, grad_w_t, grad_w.view_as(w))


class _Kept(torch.autograd.Function):
    """The GPU's: M_t of every step kept, the fewest ops per step."""

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
        # w ⊙ (1 - M_t²) for every step: dscores_t against it sums to dq_t. It fills the first
        # half of [steps, B, Lp, 2k] rows, so that the product is a whole [dq_t, ·] row (a strided
        # half-row output is 4x slower on CPU); du_t overwrites the other half of it.
        m = x[:, :, _SLOTS:]
        slope = m.new_empty(*m.shape[:-1], 2 * dim)
        torch.ops.aten.tanh_backward.grad_input(w.reshape(-1).expand_as(m), m, grad_input=slope[..., :dim])
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
            torch.bmm(grad_scores[t, :, None, _SLOTS:], slope[t], out=grad_query_u[t].unsqueeze(1))
            torch.ops.aten.tanh_backward.grad_input(grad[t + 1, :, :dim], x[t, :, 1],
                                                    grad_input=grad_query_u[t, :, dim:])
            grad[t].unsqueeze(1).baddbmm_(grad_query_u[t].unsqueeze(1), through)
        grad_r = grad[:, :, :dim]
        # d(W^y Y) = the sum over steps of dscores_t ⊗ w ⊙ (1 - M_t²).
        grad_projected = slope[..., :dim].mul_(grad_scores[:, :, _SLOTS:, None]).sum(dim=0)
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
        # The functions write into float buffers they allocate; under autocast they run in float32.
        with torch.autocast(device, enabled=False):
            return _attention(*(x.float() if x.is_floating_point() else x for x in args))
    return _attention(*args)


def _attention(memory, memory_mask, queries, query_mask, w_y, w_h, w_r, w_t, w):
    if on_host(memory):
        return _Recomputed.apply(memory, F.linear(memory, w_y), memory_mask, F.linear(queries, w_h), query_mask,
                                 w_r, w_t, w)
    return _Kept.apply(memory, memory_mask, queries, query_mask, w_y, w_h, w_r, w_t, w)


def word_by_word_equations(
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
    """Eq. 11-13 as written, one autograd op at a time -> (r_N [B, k], α [B, Lh, Lp], zero on
    padded hypothesis words). r is held where a row's hypothesis has ended.

    Args:
        memory: the premise's outputs Y [B, Lp, k].
        memory_mask: [B, Lp], True at real premise words.
        queries: the hypothesis' outputs h_t [B, Lh, k].
        query_mask: [B, Lh], True at real hypothesis words.
        w_y: W^y [k, k].
        w_h: W^h [k, k].
        w_r: W^r [k, k].
        w_t: W^t [k, k].
        w: w [1, k].
    """
    r = memory.new_zeros(memory.shape[0], memory.shape[2])
    projected_memory = memory @ w_y.t()
    alphas = []
    for t in range(queries.shape[1]):
        m = torch.tanh(projected_memory + (queries[:, t] @ w_h.t() + r @ w_r.t()).unsqueeze(1))
        alpha = masked_softmax((m @ w.t()).squeeze(-1), memory_mask)
        new = torch.bmm(alpha.unsqueeze(1), memory).squeeze(1) + torch.tanh(r @ w_t.t())
        r = torch.where(query_mask[:, t, None], new, r)
        alphas.append(alpha)
    return r, torch.stack(alphas, dim=1) * query_mask.unsqueeze(-1)


class WordByWordAttention(nn.Module):
    """``word_by_word_attention`` as a module (no parameters: the model passes its weights), so
    that a stack's copy of the model can run it as ``WordByWordEquations``."""

    def forward(self, *arguments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``word_by_word_attention``'s arguments and results."""
        return word_by_word_attention(*arguments)


class WordByWordEquations(WordByWordAttention):
    """The stack's formulation: ``word_by_word_equations``, which vmap batches."""

    def forward(self, *arguments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``word_by_word_attention``'s arguments and results."""
        return word_by_word_equations(*arguments)
