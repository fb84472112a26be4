"""run_lstm runs a one-layer unidirectional LSTM in one call with its padding steps held (and off
the CPU, where it avoids a host read of the lengths, a bidirectional one from zeros too): outputs,
final states and every gradient must equal a packed run's (float64, ragged rows, a given initial
state, with and without biases, bidirectional through the off-CPU branch), and the held cell state must not move by one bit however
much padding follows (float32)."""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nli_models.models import layers
from nli_models.models.layers import run_lstm, run_lstm_outputs

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("lengths", [[3, 9, 1, 9, 4, 4, 7], [5, 5, 5]])
@pytest.mark.parametrize(("with_state", "bidirectional"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("bias", [True, False])
def test_held_run_equals_a_packed_run(lengths, with_state, bidirectional, bias, monkeypatch):
    if bidirectional:  # held only off the CPU: take that branch here
        monkeypatch.setattr(layers, "on_host", lambda tensor: False)
    torch.manual_seed(0)
    lstm = nn.LSTM(6, 5, bias=bias, batch_first=True, bidirectional=bidirectional).double()
    lengths = torch.tensor(lengths)
    batch, steps = len(lengths), int(lengths.max())
    x = torch.randn(batch, steps, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.arange(steps) < lengths[:, None]
    state = tuple(torch.randn(1, batch, 5, dtype=torch.float64) for _ in range(2)) if with_state else None
    lstm.forward = None  # run_lstm must not fall back to a packed run (nn.LSTM.forward) here

    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, (h, c) = nn.LSTM.forward(lstm, packed, state)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=steps)
    held_out, (held_h, held_c) = run_lstm(lstm, x, mask, state)

    for a, b in ((out, held_out), (h, held_h), (c, held_c)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert (held_out[~mask] == 0).all()
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)

    def loss(o, hh, cc):
        return (o * weights).sum() + hh.pow(2).sum() + 3 * cc.sum()

    expected = torch.autograd.grad(loss(out, h, c), [x, *lstm.parameters()])
    got = torch.autograd.grad(loss(held_out, held_h, held_c), [x, *lstm.parameters()])
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_held_cell_state_ignores_what_follows_the_last_real_token():
    """Saturation is exact: 40 more padding steps of large, random inputs leave every row's
    final state bit-identical (float32, the dtype training runs in)."""
    torch.manual_seed(2)
    lstm = nn.LSTM(8, 16, batch_first=True)
    lengths = torch.tensor([7, 2, 5, 7, 1])
    x = torch.randn(5, 7, 8)
    longer = torch.cat([x, 50 * torch.randn(5, 40, 8)], dim=1)
    state = tuple(torch.randn(1, 5, 16) for _ in range(2))
    out, (h, c) = run_lstm(lstm, x, torch.arange(7) < lengths[:, None], state)
    long_out, (long_h, long_c) = run_lstm(lstm, longer, torch.arange(47) < lengths[:, None], state)
    assert torch.equal(c, long_c) and torch.equal(h, long_h)
    assert torch.equal(out, long_out[:, :7]) and (long_out[:, 7:] == 0).all()


@pytest.mark.parametrize("layers", [1, 2])
def test_outputs_and_last_h_in_one_call_equal_a_packed_run(layers):
    torch.manual_seed(1)
    lstm = nn.LSTM(4, 3, num_layers=layers, batch_first=True).double()
    lengths = torch.tensor([2, 6, 1, 5])
    x = torch.randn(4, 6, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.arange(6) < lengths[:, None]
    state = tuple(torch.randn(layers, 4, 3, dtype=torch.float64) for _ in range(2))
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, (h, _) = lstm(packed, state)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=6)
    got_out, got_h = run_lstm_outputs(lstm, x, mask, state)
    torch.testing.assert_close(got_out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_h, h[-1], rtol=0, atol=1e-12)
    expected = torch.autograd.grad(out.pow(2).sum() + h[-1].sum(), [x, *lstm.parameters()])
    got = torch.autograd.grad(got_out.pow(2).sum() + got_h.sum(), [x, *lstm.parameters()])
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
