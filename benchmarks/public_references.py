"""Minimal models in the style of the public PyTorch implementations that issue 17's numbers come
from, for timing only (benchmarks/public_setup.py runs them interleaved with ours).

Each is what such code typically does, not a copy of one repository: ``nn.Embedding`` frozen,
``nn.Dropout``, padded (unpacked) ``nn.LSTM``s, a Python loop over hypothesis words stepping an
``nn.LSTMCell`` for word-by-word attention, ABCNN with a 2-D convolution over a (d × w) kernel and
w-ap pooling as a loop over positions, and the optimizer as ``torch.optim.X(model.parameters())``
(torch's per-tensor CPU loop). Where public code leaves a paper detail out (decomposable
attention: the unit-norm scaling and the NULL token), the reference leaves it out too: it does a
little less work than ours, so the ratio errs on the side of the reference.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


def _last(outputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The output at each row's last real token of a padded [B, L, K] LSTM output."""
    index = (mask.sum(1) - 1).view(-1, 1, 1).expand(-1, 1, outputs.shape[2])
    return outputs.gather(1, index).squeeze(1)


class Decomposable(nn.Module):
    """Parikh et al. as e.g. libowen2121/SNLI-decomposable-attention and AllenNLP write it."""

    def __init__(self, vectors: torch.Tensor, hidden: int = 200, dropout: float = 0.2):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=0)
        self.proj = nn.Linear(vectors.shape[1], hidden, bias=False)

        def mlp(width: int) -> nn.Sequential:
            return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.ReLU(),
                                 nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU())

        self.f, self.g, self.h = mlp(hidden), mlp(2 * hidden), mlp(2 * hidden)
        self.out = nn.Linear(hidden, 3)

    def forward(self, p, pm, h, hm):
        a, b = self.proj(self.embed(p)), self.proj(self.embed(h))
        e = torch.bmm(self.f(a), self.f(b).transpose(1, 2))
        beta = torch.bmm(_masked_softmax(e, hm.unsqueeze(1)), b)
        alpha = torch.bmm(_masked_softmax(e.transpose(1, 2), pm.unsqueeze(1)), a)
        v1 = (self.g(torch.cat([a, beta], -1)) * pm.unsqueeze(-1)).sum(1)
        v2 = (self.g(torch.cat([b, alpha], -1)) * hm.unsqueeze(-1)).sum(1)
        return self.out(self.h(torch.cat([v1, v2], -1)))


class Rocktaschel(nn.Module):
    """Conditional encoding with attention (eq. 7-10) or word-by-word attention (eq. 11-14), the
    hypothesis stepped token by token with an LSTMCell when word_by_word."""

    def __init__(self, vectors: torch.Tensor, k: int = 100, word_by_word: bool = False,
                 dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=0)
        self.proj = nn.Linear(vectors.shape[1], k)
        self.drop = nn.Dropout(dropout)
        self.premise = nn.LSTM(k, k, batch_first=True)
        self.hypothesis = nn.LSTMCell(k, k) if word_by_word else nn.LSTM(k, k, batch_first=True)
        self.w_y, self.w_h = nn.Linear(k, k, bias=False), nn.Linear(k, k, bias=False)
        self.w_r, self.w_t = nn.Linear(k, k, bias=False), nn.Linear(k, k, bias=False)
        self.w = nn.Linear(k, 1, bias=False)
        self.w_p, self.w_x = nn.Linear(k, k, bias=False), nn.Linear(k, k, bias=False)
        self.out = nn.Linear(k, 3)
        self.word_by_word = word_by_word

    def _attend(self, y, wy, pm, query):
        m = torch.tanh(wy + query.unsqueeze(1))
        alpha = _masked_softmax(self.w(m).squeeze(-1), pm)
        return torch.bmm(alpha.unsqueeze(1), y).squeeze(1)

    def forward(self, p, pm, h, hm):
        y, (_, c) = self.premise(self.drop(self.proj(self.embed(p))))
        c = c.squeeze(0)  # after the padding, as unpacked public code has it
        wy = self.w_y(y)
        x = self.drop(self.proj(self.embed(h)))
        if not self.word_by_word:
            outputs, _ = self.hypothesis(x, (torch.zeros_like(c).unsqueeze(0), c.unsqueeze(0)))
            h_n = _last(outputs, hm)
            r = self._attend(y, wy, pm, self.w_h(h_n))
        else:
            state, r = (torch.zeros_like(c), c), torch.zeros_like(c)
            for t in range(x.shape[1]):
                h_t, c_t = self.hypothesis(x[:, t], state)
                r_t = self._attend(y, wy, pm, self.w_h(h_t) + self.w_r(r)) + torch.tanh(self.w_t(r))
                real = hm[:, t].unsqueeze(1)
                state = (torch.where(real, h_t, state[0]), torch.where(real, c_t, state[1]))
                r = torch.where(real, r_t, r)
            h_n = state[0]
        return self.out(self.drop(torch.tanh(self.w_p(r) + self.w_x(h_n))))


class ABCNN3(nn.Module):
    """One ABCNN-3 block (attention feature map + attention pooling), as galsang/ABCNN writes it:
    Conv2d over a (d × w) window with 2 input channels, w-ap as a loop over positions."""

    def __init__(self, vectors: torch.Tensor, max_length: int, filters: int = 50, width: int = 3):
        super().__init__()
        d = vectors.shape[1]
        self.embed = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=0)
        self.attention_weight = nn.Parameter(torch.empty(max_length, d).uniform_(-0.1, 0.1))
        self.conv = nn.Conv2d(2, filters, (width, d), padding=(width - 1, 0))
        self.out = nn.Linear(4, 3)
        self.width = width

    @staticmethod
    def _match(x0, x1):
        return 1.0 / (1.0 + torch.cdist(x0, x1))

    def _pool(self, c, weights):
        c = c * weights.unsqueeze(-1)
        return torch.stack([c[:, i:i + self.width].sum(1) for i in range(c.shape[1] - self.width + 1)], 1)

    def forward(self, p, pm, h, hm):
        x0 = self.embed(p) * pm.unsqueeze(-1)
        x1 = self.embed(h) * hm.unsqueeze(-1)
        scores = [self._similarity(x0.mean(1), x1.mean(1))]
        a = self._match(x0, x1)
        f0 = a @ self.attention_weight[: x1.shape[1]]
        f1 = a.transpose(1, 2) @ self.attention_weight[: x0.shape[1]]
        c0 = torch.tanh(self.conv(torch.stack([x0, f0], 1))).squeeze(-1).transpose(1, 2)
        c1 = torch.tanh(self.conv(torch.stack([x1, f1], 1))).squeeze(-1).transpose(1, 2)
        a = self._match(c0, c1)
        pooled0, pooled1 = self._pool(c0, a.sum(2)), self._pool(c1, a.sum(1))
        scores.append(self._similarity(pooled0.mean(1), pooled1.mean(1)))
        return self.out(torch.cat(scores, -1))

    @staticmethod
    def _similarity(u0, u1):
        return torch.stack([F.cosine_similarity(u0, u1, dim=-1), (u0 - u1).norm(dim=-1)], -1)
