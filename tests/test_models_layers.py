"""The shared model layers and the embedding table: behaviour the model contract tests do not see."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nli_models.embeddings import WordEmbeddings
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


def _embedding_gradient(embeddings: WordEmbeddings) -> torch.Tensor | None:
    embeddings.zero_grad(set_to_none=True)
    downstream = torch.ones(1, requires_grad=True)  # a model parameter after the lookup
    (embeddings(torch.tensor([[1, 2, 3]])) * downstream).sum().backward()
    return embeddings.embedding.weight.grad


def test_embeddings_give_a_gradient_only_to_tuned_rows_and_none_when_all_are_frozen():
    embeddings = WordEmbeddings(5, 2)
    assert torch.equal(_embedding_gradient(embeddings)[1:4], torch.ones(3, 2))
    some = torch.tensor([False, False, True, False, False])
    embeddings.load(torch.randn(5, 2), some)
    assert torch.equal(_embedding_gradient(embeddings).abs().sum(1) != 0, some)
    embeddings.load(torch.randn(5, 2), torch.zeros(5, dtype=torch.bool))
    assert _embedding_gradient(embeddings) is None
    # The frozen state travels with the state dict (checkpoints, best-weight restores).
    restored = WordEmbeddings(5, 2)
    restored.load_state_dict(embeddings.state_dict())
    assert _embedding_gradient(restored) is None
    restored.load_state_dict(WordEmbeddings(5, 2).state_dict())
    assert _embedding_gradient(restored) is not None
