"""``nn.LSTM``'s equations one time step at a time, in ops that ``torch.vmap`` batches.

A stack of k members (``nli_models.stacked``) runs each member's modules under vmap with the
member's own weights. cuDNN's and oneDNN's LSTM kernels have no batching rule (pytorch#105982),
so the stack's copy of a model runs each ``nn.LSTM`` as a ``StepwiseLSTM``: the same parameters
(same names, so the stack's tensors replace them by name), the same gate equations (PyTorch's
order i, f, g, o)::

    i, f, g, o = σ(W_ii x_t + b_ii + W_hi h_{t-1} + b_hi), σ(·f), tanh(·g), σ(·o)
    c_t = f c_{t-1} + i g,    h_t = o tanh(c_t)

with the input projection of every step in one matmul before the loop and one matmul per step
for the recurrence; under vmap each is one batched matmul over the members.

Rows of different lengths are right-padded: at a padding step the state is held (c and h keep
their values), so each row's final state is the state after its last real token, as a packed
sequence gives it, and a reverse direction reaches each row's last real token from its initial
state. Outputs are zero at padding. ``run_lstm`` and ``run_lstm_outputs`` (``layers``) run a
StepwiseLSTM through ``run``: their results are the held/packed runs' to float rounding
(tests/test_stacked.py).
"""

from __future__ import annotations

import torch
from torch import nn


class StepwiseLSTM(nn.Module):
    """A one-layer ``nn.LSTM`` (either direction or both, no projection) run step by step."""

    def __init__(self, lstm: nn.LSTM):
        """Args:
            lstm: the LSTM whose parameters this module holds (the same Parameter objects).
        """
        super().__init__()
        if lstm.num_layers != 1 or lstm.proj_size or not lstm.batch_first:
            raise ValueError(f"StepwiseLSTM runs one-layer, batch-first LSTMs without projection; got {lstm}")
        self.hidden_size, self.bidirectional, self.bias = lstm.hidden_size, lstm.bidirectional, lstm.bias
        for name in lstm._flat_weights_names:
            setattr(self, name, getattr(lstm, name))

    def forward(self, *_: torch.Tensor) -> None:
        raise TypeError("a StepwiseLSTM runs through layers.run_lstm / run_lstm_outputs, which pass "
                        "it the padding mask (StepwiseLSTM.run)")

    def run(self, inputs: torch.Tensor, mask: torch.Tensor,
            state: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(outputs [B, L, directions x H], zero at padding; (h_n, c_n) [directions, B, H] after
        each row's last real token).

        Args:
            inputs: [B, L, D], right-padded rows.
            mask: [B, L], True at real tokens.
            state: (h_0, c_0), each [directions, B, H]; None: zeros.
        """
        directions = 2 if self.bidirectional else 1
        if state is None:
            zeros = inputs.new_zeros(directions, inputs.shape[0], self.hidden_size)
            state = (zeros, zeros)
        # [L, B, 1] once: the loop reads one step's rows at a time.
        keep = mask.transpose(0, 1).unsqueeze(-1)
        outputs, finals_h, finals_c = [], [], []
        for direction, suffix in enumerate(("_l0", "_l0_reverse")[:directions]):
            out, h, c = self._direction(inputs, keep, state[0][direction], state[1][direction], suffix)
            outputs.append(out)
            finals_h.append(h)
            finals_c.append(c)
        outputs = outputs[0] if directions == 1 else torch.cat(outputs, dim=-1)
        return outputs, (torch.stack(finals_h), torch.stack(finals_c))

    def _direction(self, inputs: torch.Tensor, keep: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                   suffix: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One direction over every step -> (outputs [B, L, H], h_n, c_n)."""
        weight_hh = getattr(self, "weight_hh" + suffix).t()
        projected = inputs @ getattr(self, "weight_ih" + suffix).t()  # W_i x_t of every step
        if self.bias:
            projected = projected + (getattr(self, "bias_ih" + suffix) + getattr(self, "bias_hh" + suffix))
        projected = projected.transpose(0, 1)  # [L, B, 4H]: one step's rows contiguous per index
        steps = range(inputs.shape[1])
        outputs = [None] * inputs.shape[1]
        for t in reversed(steps) if suffix.endswith("reverse") else steps:
            gates = torch.addmm(projected[t], h, weight_hh)
            i, f, g, o = gates.chunk(4, dim=-1)
            c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h_next = torch.sigmoid(o) * torch.tanh(c_next)
            outputs[t] = h_next * keep[t]
            # Held at padding: a packed run never steps there.
            c = torch.where(keep[t], c_next, c)
            h = torch.where(keep[t], h_next, h)
        return torch.stack(outputs, dim=1), h, c
