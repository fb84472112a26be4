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


def _gradients(embeddings: WordEmbeddings, ids: list[int]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(gradient of the [V, D] table, gradient of tuned_weight) after one lookup of ids."""
    embeddings.zero_grad(set_to_none=True)
    downstream = torch.ones(1, requires_grad=True)  # a model parameter after the lookup
    (embeddings(torch.tensor([ids])) * downstream).sum().backward()
    return embeddings.embedding.weight.grad, embeddings.tuned_weight.grad


SOME = torch.tensor([False, False, True, False, True])


def test_all_rows_tuned_is_an_ordinary_embedding():
    embeddings = WordEmbeddings(5, 2)
    table, tuned = _gradients(embeddings, [1, 2, 3])
    assert torch.equal(table[1:4], torch.ones(3, 2)) and tuned is None
    assert not embeddings.tuned_weight.requires_grad and embeddings.tuned_weight.numel() == 0


def test_no_row_tuned_gives_no_gradient_at_all():
    embeddings = WordEmbeddings(5, 2)
    weight = torch.randn(5, 2)
    embeddings.load(weight, torch.zeros(5, dtype=torch.bool))
    assert _gradients(embeddings, [1, 2, 3]) == (None, None)
    assert torch.equal(embeddings(torch.tensor([[3, 1]])), weight[torch.tensor([[3, 1]])])


def test_some_rows_tuned_get_a_gradient_of_their_own_only():
    embeddings = WordEmbeddings(5, 2)
    weight = torch.randn(5, 2)
    embeddings.load(weight, SOME)
    ids = [1, 2, 4, 4, 3]
    assert torch.equal(embeddings(torch.tensor([ids])), weight[torch.tensor([ids])])
    table, tuned = _gradients(embeddings, ids)
    assert table is None  # no [V, D] gradient
    assert torch.equal(tuned, torch.tensor([[1.0, 1.0], [2.0, 2.0]]))  # row 2 once, row 4 twice
    assert [p.shape for p in embeddings.parameters() if p.requires_grad] == [torch.Size([2, 2])]


def test_trained_rows_fold_into_one_table_and_split_again_on_load():
    embeddings = WordEmbeddings(5, 2)
    weight = torch.randn(5, 2)
    embeddings.load(weight, SOME)
    with torch.no_grad():
        embeddings.tuned_weight += 1.0  # what an optimizer step does
    expected = weight.clone()
    expected[SOME] += 1.0
    assert torch.equal(embeddings.full_weight(), expected)
    state = embeddings.state_dict()
    assert set(state) == {"embedding.weight", "trainable_rows"}  # one [V, D] table in checkpoints
    assert torch.equal(state["embedding.weight"], expected)
    restored = WordEmbeddings(5, 2)
    restored.load_state_dict(state)
    assert torch.equal(restored.tuned_weight, expected[SOME])
    assert torch.equal(restored(torch.tensor([[4, 0, 1]])), expected[torch.tensor([[4, 0, 1]])])
    assert _gradients(restored, [2])[0] is None
    # Loading a fully tuned table makes it an ordinary embedding again.
    restored.load_state_dict(WordEmbeddings(5, 2).state_dict())
    assert _gradients(restored, [2])[0] is not None and restored.tuned_weight.numel() == 0
