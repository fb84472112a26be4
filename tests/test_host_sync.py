"""No host synchronisation in any model's training step off the CPU (issue 24).

On CUDA, reading a tensor's values on the host (.item(), .tolist(), .cpu(), bool(t), the
data-dependent shapes of unique and nonzero) waits for every queued kernel: a few per step stall
the GPU. The meta device has shapes but no values, and takes the models' off-CPU branches: a
forward and backward of every registered model variant there, with those reads made to raise,
proves the step reads nothing. The off-CPU branches must compute what the CPU's shortcuts do:
checked on CPU in float64 by routing the CPU through them. Evaluation reads the device once per
split, not once per batch.
"""

from __future__ import annotations

import pytest
import torch
from test_models_contract import CASES, _batch, _build
from testkit.toy import decomposable, toy_run_config

from nli_models.data import batch_indices, iterate_batches
from nli_models.models import abcnn, layers, word_by_word
from nli_models.registry import paper_configs
from nli_models.training.metrics import evaluate
from nli_models.training.trainer import build_for_data

pytestmark = pytest.mark.unit

HOST_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "unique", "__bool__", "__int__",
              "__float__", "__index__")


def _paper_cases():
    """Every paper configuration of the registry (tiny widths; the paper's dropout, variant and
    options), e.g. ABCNN with NONOVER on, as every shipped SICK spec trains it."""
    for paper in paper_configs():
        config = {k: v for k, v in paper.config.items()
                  if k not in ("embedding_dim", "num_classes", "hidden_size", "projection_dim")}
        yield pytest.param(paper.model, config, id=f"paper-{paper.model}-{paper.table_row}")


STEP_CASES = [*CASES, *_paper_cases()]


@pytest.fixture
def host_reads_raise(monkeypatch):
    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"a host read ({name}) in the training step")
        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
    for name in ("unique", "nonzero", "equal"):
        monkeypatch.setattr(torch, name, refuse(f"torch.{name}"))


@pytest.mark.parametrize("name, config", STEP_CASES)
def test_a_training_step_reads_nothing_on_the_host(name, config, host_reads_raise):
    model = _build(name, config).train().to("meta")
    inputs = [t.to("meta") for t in _batch()]
    logits = model(*inputs)
    loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device="meta"))
    loss.backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and p.grad.device.type == "meta" for p in trained)


def _logits_and_gradients(name, config):
    model = _build(name, config).double().train()
    logits, attention = model(*_batch(), return_attention=True)
    weights = torch.linspace(-1, 1, logits.numel(), dtype=torch.float64).view_as(logits)
    (logits * weights).sum().backward()
    gradients = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), gradients, {k: a.detach() for k, a in attention.items()}


@pytest.mark.parametrize("name, config", STEP_CASES)
def test_the_off_cpu_path_computes_what_the_cpu_path_does(name, config, monkeypatch):
    if "dropout" in config:  # the two paths draw their masks differently
        config = {**config, "dropout": 0.0}
    logits, grads, attention = _logits_and_gradients(name, config)
    for module in (layers, word_by_word):
        monkeypatch.setattr(module, "on_host", lambda tensor: False)
    monkeypatch.setattr(abcnn, "convolves_copies_apart", lambda tensor: False)  # the GPU's grouped convolution
    dense_logits, dense_grads, dense_attention = _logits_and_gradients(name, config)
    torch.testing.assert_close(dense_logits, logits, rtol=0, atol=1e-10)
    # The attention maps too, at the sentences' own lengths (the GPU path may pad them).
    assert dense_attention.keys() == attention.keys()
    for key, value in attention.items():
        torch.testing.assert_close(dense_attention[key], value, rtol=0, atol=1e-10, msg=key)
    assert dense_grads.keys() == grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(dense_grads[key], grad, rtol=0, atol=1e-10, msg=key)


def test_evaluation_reads_the_device_a_fixed_number_of_times_not_per_batch(toy, monkeypatch):
    model = build_for_data(toy_run_config(decomposable(dim=8)), toy)
    examples = toy.splits["dev"]

    def evaluate_counting_reads(batch_size):
        reads = []
        for name in ("cpu", "item", "__float__"):
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _original=original, _name=name, **kwargs):
                reads.append(_name)
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)
        rows = batch_indices(examples, batch_size, shuffle=False, seed=0)
        result = evaluate(model, iterate_batches(examples, rows), toy.labels, torch.device("cpu"))
        monkeypatch.undo()
        return reads, len(rows), result

    few_reads, few_batches, few = evaluate_counting_reads(64)
    many_reads, many_batches, many = evaluate_counting_reads(4)
    assert many_batches > 4 * few_batches
    assert many_reads == few_reads and len(few_reads) <= 3
    assert many.accuracy == few.accuracy and len(many.predictions) == len(examples.labels)
    assert many.loss == pytest.approx(few.loss, rel=1e-6)
