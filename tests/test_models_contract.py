"""The contract every registered model meets, checked for each model x variant (and each option
a model takes, one non-default value at a time). Cases come from the registry, so a newly
registered model is covered without touching this file."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from testkit.batches import random_batch

from nli_models import build_model, model_names, model_variants
from nli_models.embeddings import PAD_INDEX
from nli_models.registry import model_arguments, model_class

pytestmark = pytest.mark.unit

VOCAB = 24
TINY = {"vocab_size": VOCAB, "embedding_dim": 8, "hidden_size": 8, "dropout": 0.0}
# Model-specific widths, made tiny where a model has them.
TINY_OPTIONAL = {"projection_dim": 8}
# Options tried one at a time (each non-default value) wherever a model takes them.
OPTIONS = {
    "shared_encoder": (True,),
    "two_way": (True,),
    "delimiter_id": (VOCAB - 1,),
    "num_blocks": (2,),
    "intra_output": ("scale",),
}
# Integer sizes that must be >= 1, checked wherever a model takes them.
POSITIVE_ARGS = ("hidden_size", "projection_dim", "filter_width", "num_blocks", "max_length")

PREMISE_LENGTHS = (7, 3, 5, 2, 6, 4, 7, 5)
HYPOTHESIS_LENGTHS = (4, 6, 2, 5, 3, 6, 3, 4)


def _build(name: str, config: dict, num_classes: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    arguments = model_arguments(name)
    optional = {k: v for k, v in TINY_OPTIONAL.items() if k in arguments}
    return build_model(name, **{**TINY, **optional, "num_classes": num_classes, **config})


def _is_valid(name: str, config: dict) -> bool:
    try:
        _build(name, config)
    except ValueError:
        return False  # e.g. two_way with the conditional variant
    return True


def _cases():
    for name in model_names():
        arguments = model_arguments(name)
        for variant in model_variants(name) or (None,):
            base = {} if variant is None else {"variant": variant}
            yield pytest.param(name, base, id=f"{name}-{variant}")
            for option, values in OPTIONS.items():
                for value in values if option in arguments else ():
                    config = {**base, option: value}
                    if _is_valid(name, config):
                        yield pytest.param(name, config, id=f"{name}-{variant}-{option}={value}")


CASES = list(_cases())


def _batch(seed: int = 0):
    # Ids below VOCAB - 1: that one is rocktaschel's delimiter.
    return random_batch(PREMISE_LENGTHS, HYPOTHESIS_LENGTHS, low=1, high=VOCAB - 1, seed=seed)


def _pad(ids, mask, extra: int):
    return F.pad(ids, (0, extra), value=PAD_INDEX), F.pad(mask, (0, extra), value=False)


@pytest.mark.parametrize("num_classes", [2, 3])
@pytest.mark.parametrize("name, config", CASES)
def test_output_shape_and_attention(name, config, num_classes):
    model = _build(name, config, num_classes).eval()
    inputs = _batch()
    logits = model(*inputs)
    assert logits.shape == (len(PREMISE_LENGTHS), num_classes)
    assert torch.isfinite(logits).all()
    with_attention, attention = model(*inputs, return_attention=True)
    torch.testing.assert_close(with_attention, logits)
    assert isinstance(attention, dict)
    for key, weights in attention.items():
        assert weights.shape[0] == len(PREMISE_LENGTHS), key
        assert torch.isfinite(weights).all(), key


@pytest.mark.parametrize("name, config", CASES)
def test_padding_columns_change_no_logit(name, config):
    model = _build(name, config).eval()
    premise, premise_mask, hypothesis, hypothesis_mask = _batch()
    with torch.no_grad():
        logits = model(premise, premise_mask, hypothesis, hypothesis_mask)
        padded = model(*_pad(premise, premise_mask, 3), *_pad(hypothesis, hypothesis_mask, 2))
    torch.testing.assert_close(padded, logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name, config", CASES)
def test_gradient_reaches_every_parameter(name, config):
    model = _build(name, config).train()
    labels = torch.arange(len(PREMISE_LENGTHS)) % 3
    F.cross_entropy(model(*_batch()), labels).backward()
    for param_name, param in model.named_parameters():
        if param.requires_grad:
            assert param.grad is not None, f"{param_name} got no gradient"
            assert param.grad.abs().sum() > 0, f"{param_name} got an all-zero gradient"
    padding_grad = model.word_embeddings.embedding.weight.grad[PAD_INDEX]
    assert torch.equal(padding_grad, torch.zeros_like(padding_grad))


@pytest.mark.parametrize("name, config", CASES)
def test_overfits_a_tiny_batch(name, config):
    model = _build(name, config).train()
    inputs = _batch()
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 1, 0])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(300):
        logits = model(*inputs)
        if bool((logits.argmax(dim=-1) == labels).all()):
            break
        optimizer.zero_grad()
        F.cross_entropy(logits, labels).backward()
        optimizer.step()
    accuracy = (model(*inputs).argmax(dim=-1) == labels).float().mean().item()
    assert accuracy == 1.0


@pytest.mark.parametrize("name, config", CASES)
def test_state_dict_round_trip(name, config, tmp_path):
    model = _build(name, config, seed=0).eval()
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    fresh = _build(name, config, seed=1).eval()
    fresh.load_state_dict(torch.load(path))
    inputs = _batch()
    with torch.no_grad():
        assert torch.equal(fresh(*inputs), model(*inputs))


def test_unknown_model_lists_registered_names():
    with pytest.raises(ValueError) as error:
        build_model("no_such_model", **TINY, num_classes=3)
    for name in model_names():
        assert name in str(error.value)


@pytest.mark.parametrize("name", model_names())
def test_unknown_variant_lists_valid_variants(name):
    assert model_variants(name), f"{name} declares no VARIANTS"
    for build in (
        lambda: build_model(name, **TINY, num_classes=3, variant="no_such_variant"),
        lambda: model_class(name)(**TINY, num_classes=3, variant="no_such_variant"),
    ):
        with pytest.raises(ValueError) as error:
            build()
        for variant in model_variants(name):
            assert variant in str(error.value)


@pytest.mark.parametrize("name", model_names())
def test_unknown_argument_lists_allowed_arguments(name):
    with pytest.raises(ValueError, match="no_such_argument") as error:
        build_model(name, **TINY, num_classes=3, no_such_argument=1)
    for argument in model_arguments(name):
        assert argument in str(error.value)


@pytest.mark.parametrize("name", model_names())
def test_invalid_values_are_rejected_by_name(name):
    arguments = model_arguments(name)
    bad = [("dropout", 1.0), ("dropout", -0.1), ("num_classes", 0)]
    bad += [(argument, 0) for argument in POSITIVE_ARGS if argument in arguments]
    for argument, value in bad:
        with pytest.raises(ValueError, match=argument):
            model_class(name)(**{**TINY, "num_classes": 3, argument: value})


@pytest.mark.parametrize("name", model_names())
def test_arguments_are_not_coerced(name):
    """Text is not a number and a boolean is neither a size nor a rate (strict schema)."""
    for argument, value in [("hidden_size", "8"), ("hidden_size", True), ("dropout", False)]:
        with pytest.raises(ValueError, match=f"{argument} must be .*; got {value!r}"):
            build_model(name, **{**TINY, "num_classes": 3, argument: value})


def test_a_flag_takes_only_a_boolean():
    with pytest.raises(ValueError, match="two_way must be one of False, True; got 1"):
        _build("rocktaschel", {"two_way": 1})


@pytest.mark.parametrize(
    "name, config, argument",
    [
        ("rocktaschel", {"variant": "conditional", "two_way": True}, "two_way"),
        ("rocktaschel", {"delimiter_id": PAD_INDEX}, "delimiter_id"),
        ("rocktaschel", {"delimiter_id": VOCAB}, "delimiter_id"),
        ("cam", {"intra_output": "no_such_output"}, "intra_output"),
        ("cam", {"variant": "inter_only", "intra_output": "scale"}, "intra_output"),
    ],
)
def test_invalid_combinations_are_rejected(name, config, argument):
    with pytest.raises(ValueError, match=argument):
        _build(name, config)


def test_abcnn_rejects_sentences_longer_than_max_length():
    model = _build("abcnn", {"variant": "abcnn1", "max_length": 6})
    with pytest.raises(ValueError, match="max_length"):
        model(*_batch())  # the longest premise has 7 tokens
    premise, premise_mask, hypothesis, hypothesis_mask = _batch()
    short = premise[:, :6], premise_mask[:, :6]
    model(*_pad(*short, 4), hypothesis, hypothesis_mask)  # padding beyond max_length is fine


@pytest.mark.parametrize("name", model_names())
def test_embedding_matrix_of_wrong_shape_is_rejected(name):
    embeddings = _build(name, {}).word_embeddings
    with pytest.raises(ValueError, match="shape"):
        embeddings.load(torch.zeros(VOCAB, 9), torch.ones(VOCAB, dtype=torch.bool))
    with pytest.raises(ValueError, match="trainable_rows"):
        embeddings.load(torch.zeros(VOCAB, 8), torch.ones(VOCAB + 1, dtype=torch.bool))


def test_left_padded_masks_are_rejected():
    premise, premise_mask, hypothesis, hypothesis_mask = _batch()
    model = _build("rocktaschel", {})
    with pytest.raises(ValueError, match="right-padded"):
        model(premise.flip(1), premise_mask.flip(1), hypothesis, hypothesis_mask)
