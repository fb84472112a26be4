"""The fused word-by-word attention functions (the CPU's and the GPU path's) against Rocktäschel et
al. eq. 11-13 written with plain autograd (``word_by_word_equations``, which stacks run), on ragged premises and
hypotheses."""

from __future__ import annotations

import pytest
import torch

from nli_models.models import word_by_word
from nli_models.models.word_by_word import word_by_word_attention, word_by_word_equations

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, params=["cpu function", "gpu path function"])
def path(request, monkeypatch):
    """Every test runs both functions: the GPU path's is taken off the CPU (on_host False)."""
    if request.param == "gpu path function":
        monkeypatch.setattr(word_by_word, "on_host", lambda tensor: False)
    return request.param


reference = word_by_word_equations  # eq. 11-13 as written, with autograd (the stack's formulation)


def inputs(batch=4, premise=6, hypothesis=5, dim=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    premise_lengths = torch.tensor([premise, 1, 3, premise - 1][:batch])
    hypothesis_lengths = torch.tensor([2, hypothesis, 1, hypothesis - 2][:batch])
    memory_mask = torch.arange(premise) < premise_lengths.unsqueeze(1)
    query_mask = torch.arange(hypothesis) < hypothesis_lengths.unsqueeze(1)

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    return (leaf(batch, premise, dim), memory_mask, leaf(batch, hypothesis, dim), query_mask,
            leaf(dim, dim), leaf(dim, dim), leaf(dim, dim), leaf(dim, dim), leaf(1, dim))


def differentiable(args):
    return [a for a in args if a.requires_grad]


def test_matches_the_autograd_equations_in_value_and_gradient():
    args = inputs()
    r, alphas = word_by_word_attention(*args)
    r_ref, alphas_ref = reference(*args)
    assert torch.allclose(r, r_ref) and torch.allclose(alphas, alphas_ref)
    upstream = torch.randn_like(r)
    grads = torch.autograd.grad((r * upstream).sum(), differentiable(args))
    grads_ref = torch.autograd.grad((r_ref * upstream).sum(), differentiable(args))
    for got, want in zip(grads, grads_ref, strict=True):
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-10), (got - want).abs().max()


def test_passes_gradcheck():
    args = inputs(batch=3, premise=4, hypothesis=3, dim=2, seed=1)
    assert torch.autograd.gradcheck(lambda *x: word_by_word_attention(*x)[0], args)


def test_padding_gets_no_weight_and_does_not_change_r():
    args = list(inputs())
    args[3] = args[3] & (torch.arange(5) < 3)  # hypotheses of at most 3 words, padded to 5
    r, alphas = word_by_word_attention(*args)
    memory_mask, query_mask = args[1], args[3]
    assert torch.all(alphas[~query_mask] == 0)
    assert torch.all(alphas.masked_select(~memory_mask.unsqueeze(1)) == 0)
    cut = list(args)
    cut[2], cut[3] = args[2][:, :3], args[3][:, :3]
    assert torch.allclose(word_by_word_attention(*cut)[0], r)
    longer = list(args)  # two more padded premise positions holding arbitrary values
    longer[0] = torch.cat([args[0], torch.randn(4, 2, 3, dtype=args[0].dtype)], 1)
    longer[1] = torch.cat([args[1], torch.zeros(4, 2, dtype=torch.bool)], 1)
    assert torch.allclose(word_by_word_attention(*longer)[0], r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_and_float64(dtype):
    args = inputs(dtype=dtype)
    r, alphas = word_by_word_attention(*args)
    assert r.dtype == dtype and alphas.dtype == dtype
    r.sum().backward()
    assert all(a.grad is not None and torch.isfinite(a.grad).all() for a in differentiable(args))


def test_runs_in_float32_under_autocast():
    args = inputs(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r, _ = word_by_word_attention(*args)
    assert r.dtype == torch.float32
    assert torch.allclose(r, reference(*args)[0], atol=1e-5)
