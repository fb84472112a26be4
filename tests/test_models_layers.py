"""The shared model layers and the embedding table: behaviour the model contract tests do not see."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nli_models.embeddings import WordEmbeddings
from nli_models.models.layers import Dropout, RealPositions, distinct_words, masked_sum

pytestmark = pytest.mark.unit


def test_distinct_words_index_every_position_of_every_tensor():
    premise = torch.tensor([[5, 3, 0, 0], [3, 3, 9, 2]])
    hypothesis = torch.tensor([[9, 0], [7, 5]])
    words, (premise_index, hypothesis_index) = distinct_words(premise, hypothesis)
    assert words.tolist() == [0, 2, 3, 5, 7, 9]
    assert torch.equal(words[premise_index], premise) and torch.equal(words[hypothesis_index], hypothesis)
    assert premise_index.shape == premise.shape and hypothesis_index.shape == hypothesis.shape


def _ragged(batch: int, length: int, lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.randn(batch, length, width, dtype=torch.float64, requires_grad=True)
    return values, torch.arange(length) < torch.tensor(lengths)[:, None]


def test_real_positions_give_a_padded_run_s_values_and_gradients_at_real_words():
    """A per-word layer run on the real words of two batches at once: equal to running it on
    the padded batches (zero at padding; masked sums), values and every gradient (float64)."""
    torch.manual_seed(3)
    layer = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5)).double()
    a, a_mask = _ragged(3, 5, [5, 1, 3], 4)
    b, b_mask = _ragged(3, 2, [2, 2, 1], 4)
    words = RealPositions(a_mask, b_mask)
    applied = words.apply(layer, a, b)
    summed = words.summed(layer, a, b)
    expected = [layer(x) * m.unsqueeze(-1) for x, m in ((a, a_mask), (b, b_mask))]
    expected_sums = [masked_sum(layer(x), m) for x, m in ((a, a_mask), (b, b_mask))]
    for got, want in zip(applied + summed, expected + expected_sums, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    weights = [torch.randn_like(t) for t in expected + expected_sums]

    def loss(outputs):
        return sum((o * w).sum() for o, w in zip(outputs, weights, strict=True))

    inputs = [a, b, *layer.parameters()]
    got = torch.autograd.grad(loss(applied + summed), inputs)
    want = torch.autograd.grad(loss(expected + expected_sums), inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    assert (applied[0][~a_mask] == 0).all() and (applied[1][~b_mask] == 0).all()


def test_real_positions_under_vmap_are_each_members_own_run():
    """A stack that shares one batch runs RealPositions under vmap, its index shared by the
    members: values and gradients equal each member's own run exactly (a per-word layer of each
    member's own weight)."""
    torch.manual_seed(4)
    a, a_mask = _ragged(3, 5, [5, 1, 3], 4)
    b, b_mask = _ragged(3, 2, [2, 2, 1], 4)
    scale = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)  # each member's per-word layer
    words = RealPositions(a_mask, b_mask)

    def run(x_a, x_b, w):
        return (*words.apply(lambda x: torch.tanh(x * w), x_a, x_b), *words.summed(lambda x: x * w, x_a, x_b))

    # Each member's own values, [k, B, L, D].
    inputs = [(x.detach() * torch.randn(3, 1, 1, 4, dtype=torch.float64)).requires_grad_() for x in (a, b)]
    stacked = torch.vmap(run)(*inputs, scale)
    weights = [torch.randn_like(t) for t in stacked]
    got = torch.autograd.grad(sum((o * w).sum() for o, w in zip(stacked, weights, strict=True)), (*inputs, scale))
    for k in range(3):
        solo_inputs = [x.detach()[k].requires_grad_() for x in (*inputs, scale)]
        solo = run(*solo_inputs)
        for g, w in zip(stacked, solo, strict=True):
            assert torch.equal(g[k], w)
        grads = torch.autograd.grad(sum((o * w[k]).sum() for o, w in zip(solo, weights, strict=True)), solo_inputs)
        for g, w in zip(got, grads, strict=True):
            assert torch.equal(g[k], w)


def test_real_positions_never_show_padding_to_the_layer():
    seen = []
    a, a_mask = _ragged(2, 4, [1, 3], 2)
    with torch.no_grad():
        a[~a_mask] = float("nan")  # padding the layer must not read
    RealPositions(a_mask).apply(lambda x: seen.append(x) or x, a)
    assert seen[0].shape == (4, 2) and not seen[0].isnan().any()


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
