"""Word-by-word attention (Rocktäschel et al. eq. 11-13) as one autograd function.

    M_t = tanh(W^y Y + (W^h h_t + W^r r_{t-1}) ⊗ e_L)
    α_t = softmax(w^T M_t)
    r_t = Y α_t^T + tanh(W^t r_{t-1})

r_t depends on r_{t-1}, so the loop over hypothesis words cannot be vectorized. Written with
autograd, each step keeps its [B, Lp, k] tanh output (80 MB at 80 tokens, batch 32, k=100,
written to fresh memory and read back in backward) and the backward builds the
gradients of the [B, Lp, k] terms from outer-product matmuls: at 80 tokens the loop cost 3.9x the
whole conditional-encoding model. Here the forward keeps only the step's query W^h h_t + W^r r_{t-1}
and the attention weights; the backward recomputes M_t into one cache-resident buffer, turns it
into dM_t in place, and accumulates d(W^y Y) in place. The gradients that do not feed the
recurrence (dY through the attention sums, dW^r, dW^t) are one matmul each over all steps at the
end. tests/test_models_word_by_word.py checks it against eq. 11-13 written with autograd and with
torch.autograd.gradcheck.
"""

from __future__ import annotations

import torch

from nli_models.models.layers import autocast_active, on_host


class _WordByWord(torch.autograd.Function):
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
        ended = _ended_steps(query_mask)
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


def _ended_steps(query_mask: torch.Tensor) -> list[bool]:
    """Per step: does some row's hypothesis end before it? A step where none has ended skips
    the masked update. Off the CPU every step takes it (the same values): knowing which steps
    need it would take a host sync per batch."""
    if not on_host(query_mask):
        return [True] * query_mask.shape[1]
    return (~query_mask).any(dim=0).tolist()


def word_by_word_attention(
    memory: torch.Tensor,
    projected_memory: torch.Tensor,
    memory_mask: torch.Tensor,
    projected_queries: torch.Tensor,
    query_mask: torch.Tensor,
    w_r: torch.Tensor,
    w_t: torch.Tensor,
    w: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """memory Y and projected_memory W^y Y [B, Lp, k], memory_mask [B, Lp]; projected_queries
    W^h h_t [B, Lh, k], query_mask [B, Lh]; w_r, w_t [k, k]; w [1, k]
    -> (r_N [B, k], α [B, Lh, Lp], zero on padded hypothesis words)."""
    device = memory.device.type
    if autocast_active(device):
        # The function writes into float buffers it allocates; under autocast it runs in float32.
        with torch.autocast(device, enabled=False):
            args = [x.float() if x.is_floating_point() else x for x in
                    (memory, projected_memory, memory_mask, projected_queries, query_mask, w_r, w_t, w)]
            return _WordByWord.apply(*args)
    return _WordByWord.apply(memory, projected_memory, memory_mask, projected_queries, query_mask, w_r, w_t, w)
