"""The shared model layers whose behaviour is not visible through the model contract tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nli_models.models.layers import Dropout


@pytest.mark.parametrize("p", [0.1, 0.4, 0.7])
def test_dropout_drops_a_fraction_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(200_000)
    y = Dropout(p).train()(x)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(p, abs=0.005)
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - p)))
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)


def test_dropout_gradient_is_the_scaled_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 7, 5, requires_grad=True)
    y = Dropout(0.3).train()(x)
    y.sum().backward()
    expected = torch.where(y != 0, torch.tensor(1 / 0.7), torch.tensor(0.0))
    assert torch.allclose(x.grad, expected)


def test_dropout_is_identity_in_eval_and_at_p_zero():
    x = torch.randn(8, 3)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)


def test_dropout_is_reproducible_under_a_seed_and_keeps_nn_dropout_state():
    x = torch.randn(32, 10)
    torch.manual_seed(3)
    first = Dropout(0.2).train()(x)
    torch.manual_seed(3)
    second = Dropout(0.2).train()(x)
    assert torch.equal(first, second)
    module = Dropout(0.2)
    assert isinstance(module, nn.Dropout) and module.state_dict() == {} and "p=0.2" in repr(module)
