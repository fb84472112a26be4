"""Decomposable attention (Parikh et al. eq. 1-7) and Rocktäschel et al.'s conditional encoding,
attention and word-by-word attention (§2, eq. 1-14) against independent float64 loops: one
example and one word at a time, the LSTM written out gate by gate, no masking tricks. The models
run batched and padded; the loops see each example at its own length."""

from __future__ import annotations

import math

import pytest
import torch
from testkit.batches import random_batch

from nli_models.registry import build_model

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _float64():
    """Models and loops in float64, for this module's tests only."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _batch():
    return random_batch((6, 2, 4), (3, 4, 1), low=2, high=12, seed=3)


def _small_model(name: str, variant: str, vocab_size: int = 12, embedding_dim: int = 5,
                 hidden_size: int = 4, **args):
    """A small model in eval mode, its weights drawn from seed 0."""
    torch.manual_seed(0)
    return build_model(name, vocab_size=vocab_size, embedding_dim=embedding_dim, num_classes=3,
                       variant=variant, hidden_size=hidden_size, **args).eval()


def _assert_batch_matches(model, reference, atol: float) -> None:
    """The model on _batch() in float64 equals the reference loops within atol."""
    batch = _batch()
    got, want = model(*batch), reference(model, *batch)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()


def _softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    return [e / sum(exps) for e in exps]


# -- Parikh et al. 2016 -----------------------------------------------------------------------
def _decomposable_reference(model, premise, premise_mask, hypothesis, hypothesis_mask):
    def represent(ids):
        words = [model.word_embeddings(i.view(1))[0] for i in ids]
        words = [w / w.norm() for w in words]  # §5.1: unit ℓ2 norm
        return [model.projection(v) for v in [model.null_embedding, *words]]

    def intra(a):
        if model.intra is None:
            return a
        f = [model.intra.f_intra(x) for x in a]
        out = []
        for i in range(len(a)):
            scores = []
            for j in range(len(a)):
                d = i - j
                bucket = 21 if abs(d) > 10 else d + 10  # distances > 10 share one bias
                scores.append(float(f[i] @ f[j] + model.intra.distance_bias[bucket]))
            weights = _softmax(scores)
            out.append(torch.cat([a[i], sum(w * x for w, x in zip(weights, a, strict=True))]))
        return out  # eq. 6-7: ā_i = [a_i, a'_i]

    rows = []
    for k in range(premise.shape[0]):
        a = intra(represent(premise[k][premise_mask[k]]))
        b = intra(represent(hypothesis[k][hypothesis_mask[k]]))
        fa, fb = [model.attend(x) for x in a], [model.attend(x) for x in b]
        e = [[float(fa[i] @ fb[j]) for j in range(len(b))] for i in range(len(a))]  # eq. 1
        beta = [sum(w * x for w, x in zip(_softmax(e[i]), b, strict=True)) for i in range(len(a))]
        alpha = [
            sum(w * x for w, x in zip(_softmax([e[i][j] for i in range(len(a))]), a, strict=True))
            for j in range(len(b))
        ]  # eq. 2
        v1 = sum(model.compare(torch.cat([a[i], beta[i]])) for i in range(len(a)))  # eq. 3-4
        v2 = sum(model.compare(torch.cat([b[j], alpha[j]])) for j in range(len(b)))
        rows.append(model.output(model.aggregate(torch.cat([v1, v2]))))  # eq. 5
    return torch.stack(rows)


@pytest.mark.parametrize("variant", ["vanilla", "intra"])
@pytest.mark.parametrize("init", ["default", "gaussian_0.01"])
@torch.no_grad()
def test_decomposable_matches_its_equations(variant, init):
    model = _small_model("decomposable", variant, projection_dim=3, init=init)
    if model.intra is not None:  # distance biases of distinct values, so a wrong bucket shows
        model.intra.distance_bias.copy_(torch.linspace(-1, 1, 22))
    _assert_batch_matches(model, _decomposable_reference, atol=1e-10)


def test_decomposable_unit_norm_has_normalize_s_values_and_gradients():
    """The input representation's normalisation (§5.1) with its own backward: F.normalize's values
    and gradients, a zero row (the padding word's vector) included."""
    from nli_models.models.decomposable import unit_norm

    torch.manual_seed(0)
    x = torch.randn(5, 4, 6, dtype=torch.float64)
    x[0, 1] = 0.0
    x.requires_grad_(True)
    weights = torch.randn_like(x)
    got, want = unit_norm(x), torch.nn.functional.normalize(x, dim=-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    (got_grad,), (want_grad,) = (torch.autograd.grad((y * weights).sum(), x) for y in (got, want))
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=0)
    assert torch.autograd.gradcheck(unit_norm, torch.randn(3, 4, dtype=torch.float64, requires_grad=True))


def test_decomposable_intra_distance_buckets_beyond_ten_share_one_bias():
    model = _small_model("decomposable", "intra", vocab_size=30, embedding_dim=4, hidden_size=3,
                         projection_dim=3)
    with torch.no_grad():
        model.intra.distance_bias.copy_(torch.linspace(-1, 1, 22))
    ids = torch.arange(2, 16).unsqueeze(0)  # 14 words + NULL: distances up to 14
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        got = model(ids, mask, ids[:, :3], mask[:, :3])
        want = _decomposable_reference(model, ids, mask, ids[:, :3], mask[:, :3])
    assert torch.allclose(got, want, atol=1e-10)


# -- Rocktäschel et al. 2016 ------------------------------------------------------------------
def _lstm(lstm, inputs, h, c):
    """PyTorch's LSTM gate order (i, f, g, o), one step at a time -> (outputs, h, c)."""
    w_ih, w_hh = lstm.weight_ih_l0, lstm.weight_hh_l0
    b = lstm.bias_ih_l0 + lstm.bias_hh_l0
    outputs = []
    for x in inputs:
        i, f, g, o = (w_ih @ x + w_hh @ h + b).chunk(4)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return outputs, h, c


def _rocktaschel_read(model, premise_ids, hypothesis_ids):
    embed = [model.projection(model.word_embeddings(i.view(1))[0]) for i in premise_ids]
    k = model.projection.out_features
    y, _, c_premise = _lstm(model.premise_lstm, embed, torch.zeros(k), torch.zeros(k))
    words = [model.projection(model.word_embeddings(i.view(1))[0]) for i in hypothesis_ids]
    # §2.2.1: the second LSTM starts from h = 0 and the premise's last cell state
    outputs, h_n, _ = _lstm(model.hypothesis_lstm, words, torch.zeros(k), c_premise)
    if model.variant == "conditional":
        return h_n
    att = model.attention
    if model.variant == "attention":  # eq. 7-9
        scores = [
            float(att.w.weight[0] @ torch.tanh(att.w_y.weight @ yi + att.w_h.weight @ h_n))
            for yi in y
        ]
        r = sum(a * yi for a, yi in zip(_softmax(scores), y, strict=True))
    else:  # eq. 11-13
        r = torch.zeros(k)
        for h_t in outputs:
            query = att.w_h.weight @ h_t + model.w_r.weight @ r
            scores = [float(att.w.weight[0] @ torch.tanh(att.w_y.weight @ yi + query)) for yi in y]
            attended = sum(a * yi for a, yi in zip(_softmax(scores), y, strict=True))
            r = attended + torch.tanh(model.w_t.weight @ r)
    return torch.tanh(model.w_p.weight @ r + model.w_x.weight @ h_n)  # eq. 10 / 14


def _rocktaschel_reference(model, premise, premise_mask, hypothesis, hypothesis_mask):
    rows = []
    for k in range(premise.shape[0]):
        p, h = premise[k][premise_mask[k]], hypothesis[k][hypothesis_mask[k]]
        pair = _rocktaschel_read(model, p, h)
        if model.variant == "conditional":
            rows.append(torch.tanh(model.output(pair)))
            continue
        if model.two_way:  # §2.5: the same weights with the sentences swapped
            pair = torch.cat([pair, _rocktaschel_read(model, h, p)])
        rows.append(model.output(pair))
    return torch.stack(rows)


@pytest.mark.parametrize(
    "variant,options",
    [
        ("conditional", {}),
        ("conditional", {"shared_encoder": True}),
        ("attention", {}),
        ("attention", {"two_way": True}),
        ("word_by_word", {}),
        ("word_by_word", {"two_way": True, "shared_encoder": True}),
    ],
)
@torch.no_grad()
def test_rocktaschel_matches_its_equations(variant, options):
    model = _small_model("rocktaschel", variant, **options)
    _assert_batch_matches(model, _rocktaschel_reference, atol=1e-10)


# -- Yin et al. 2016 --------------------------------------------------------------------------
def _match(u, v):
    return 1 / (1 + (u - v).norm())  # eq. 2, Euclidean


def _wide_conv(block, columns):
    """Eq. 1: n input columns -> n + w - 1, zero columns outside the sentence."""
    w = block.width
    kernel, bias = block.conv.weight, block.conv.bias  # [out, in, w]
    n = len(columns)
    zero = torch.zeros_like(columns[0])
    padded = [zero] * (w - 1) + columns + [zero] * (w - 1)
    return [
        torch.tanh(sum(kernel[:, :, m] @ padded[t + m] for m in range(w)) + bias)
        for t in range(n + w - 1)
    ]


def _abcnn_block(block, x0, x1):
    if block.attention_weight is not None:  # eq. 3-4: F_0,a = W A^T, F_1,a = W A
        weight = block.attention_weight
        a = [[_match(u, v) for v in x1] for u in x0]
        f0 = [sum(a[i][j] * weight[:, j] for j in range(len(x1))) for i in range(len(x0))]
        f1 = [sum(a[i][j] * weight[:, i] for i in range(len(x0))) for j in range(len(x1))]
        x0 = [torch.cat([u, f]) for u, f in zip(x0, f0, strict=True)]
        x1 = [torch.cat([v, f]) for v, f in zip(x1, f1, strict=True)]
    c0, c1 = _wide_conv(block, x0), _wide_conv(block, x1)
    w = block.width
    if block.attention_pooling:  # §4.2: weights are row / column sums of A over conv columns
        a = [[_match(u, v) for v in c1] for u in c0]
        c0 = [sum(a[i]) * u for i, u in enumerate(c0)]
        c1 = [sum(a[i][j] for i in range(len(a))) * v for j, v in enumerate(c1)]
        scale = 1.0
    else:
        scale = 1.0 / w
    pooled0 = [scale * sum(c0[t : t + w]) for t in range(len(x0))]  # w-ap back to n columns
    pooled1 = [scale * sum(c1[t : t + w]) for t in range(len(x1))]
    summary = (sum(c0) / len(c0), sum(c1) / len(c1))  # all-ap over the n + w - 1 columns
    return pooled0, pooled1, summary


def _scores(u, v):
    return [float(u @ v / (u.norm() * v.norm())), float((u - v).norm())]  # §5.4.1


def _abcnn_reference(model, premise, premise_mask, hypothesis, hypothesis_mask):
    rows = []
    for k in range(premise.shape[0]):
        x0 = [model.word_embeddings(i.view(1))[0] for i in premise[k][premise_mask[k]]]
        x1 = [model.word_embeddings(i.view(1))[0] for i in hypothesis[k][hypothesis_mask[k]]]
        scores = _scores(sum(x0) / len(x0), sum(x1) / len(x1))  # block b_1: the word vectors
        for block in model.blocks[: model.active_blocks]:
            x0, x1, summary = _abcnn_block(block, x0, x1)
            scores += _scores(*summary)
        features = torch.tensor(scores)
        rows.append(model.output.weight[:, : len(scores)] @ features + model.output.bias)
    return torch.stack(rows)


@pytest.mark.parametrize("variant", ["bcnn", "abcnn1", "abcnn2", "abcnn3"])
@pytest.mark.parametrize("num_blocks", [1, 2])
@torch.no_grad()
def test_abcnn_matches_its_equations(variant, num_blocks):
    model = _small_model("abcnn", variant, filter_width=3, num_blocks=num_blocks, max_length=8)
    _assert_batch_matches(model, _abcnn_reference, atol=1e-9)


@torch.no_grad()
def test_abcnn_layerwise_phase_one_is_the_one_block_network():
    model = _small_model("abcnn", "abcnn3", num_blocks=2, max_length=8)
    model.train_blocks_up_to(1)
    _assert_batch_matches(model, _abcnn_reference, atol=1e-9)
    assert all(p.requires_grad for p in model.blocks[0].parameters())
    assert not any(p.requires_grad for p in model.blocks[1].parameters())
    model.train_blocks_up_to(2)
    assert not any(p.requires_grad for p in model.blocks[0].parameters())
    assert all(p.requires_grad for p in model.blocks[1].parameters())


def test_abcnn_match_scores_where_units_coincide_are_1_with_a_zero_gradient():
    """Eq. 2 at |x0_i - x1_j| = 0 (a word in both sentences, or two zero units): A = 1, and the
    gradient there is 0, not NaN (the distance's derivative is undefined at 0)."""
    from nli_models.models.abcnn import _similarity_scores, euclidean_match

    x0 = torch.tensor([[[1.0, 2.0], [0.5, -1.0]]], dtype=torch.float64, requires_grad=True)
    x1 = torch.tensor([[[1.0, 2.0], [3.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    match = euclidean_match(x0, x1, mask, mask)
    assert match[0, 0, 0] == 1.0
    expected = 1 / (1 + torch.cdist(x0.detach(), x1.detach()))
    torch.testing.assert_close(match.detach(), expected)
    match[0, 0, 0].backward()
    assert torch.equal(x0.grad, torch.zeros_like(x0)) and torch.equal(x1.grad, torch.zeros_like(x1))
    same = torch.ones(1, 3, dtype=torch.float64, requires_grad=True)
    _similarity_scores(same, same.detach().clone())[0, 1].backward()
    assert torch.equal(same.grad, torch.zeros_like(same))
