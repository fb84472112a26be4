"""The CUDA-graph training step's CPU-testable parts (``training.cuda_graphs``); the capture itself
and its losses against eager training are checked on a GPU by ``make gpu-check``.

- Static shapes: padding a batch to ``STATIC_LENGTHS`` changes no model's logits or gradients
  (every registered variant and every paper configuration).
- Warm-up leaves nothing behind: after the snapshot is restored, the next step is the step a
  fresh model and optimizer would take (Adam's lazily built state included).
- Where capture is impossible the step stays eager and says so once (``auto``), or raises
  (``on``); ``on`` without CUDA is a config error, exit 2 through the CLI; ``auto`` on CPU trains
  eagerly on unpadded batches.
"""

from __future__ import annotations

import pytest
import torch
from test_host_sync import STEP_CASES
from test_models_contract import _batch, _build
from testkit.cli import orchestrate
from testkit.toy import decomposable, toy_run_config

from nli_models.config import TrainingConfig
from nli_models.data.batch import LONG_LENGTH_STEP, STATIC_LENGTHS, Batch, static_length
from nli_models.training import make_trainer
from nli_models.training.cuda_graphs import (
    GraphCaptureFailed,
    GraphedTrainingStep,
    restore_state,
    snapshot_state,
)
from nli_models.training.optimizers import make_optimizer
from nli_models.training.trainer import DeviceUnavailable


def test_static_lengths_hold_each_length_in_at_most_half_again():
    for length in range(1, 3 * STATIC_LENGTHS[-1]):
        padded = static_length(length)
        assert padded >= length
        assert padded in STATIC_LENGTHS or padded % LONG_LENGTH_STEP == 0
        if length > STATIC_LENGTHS[0]:
            assert padded <= 1.5 * length + 1e-9, (length, padded)


def _full_batch() -> Batch:
    premise, premise_mask, hypothesis, hypothesis_mask = _batch()
    return Batch(premise, premise_mask, hypothesis, hypothesis_mask, torch.arange(len(premise)) % 3)


@pytest.mark.parametrize("name, config", STEP_CASES)
def test_static_padding_changes_no_logit_or_gradient(name, config):
    if "dropout" in config:
        config = {**config, "dropout": 0.0}
    batch = _full_batch()
    padded = batch.padded_to_static_lengths()
    assert padded.premise.shape[1] == static_length(batch.premise.shape[1]) > batch.premise.shape[1]
    results = []
    for inputs in (batch, padded):
        model = _build(name, config).double().train()
        logits = model(*inputs.inputs())
        torch.nn.functional.cross_entropy(logits, inputs.label).backward()
        results.append((logits.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}))
    (logits, grads), (padded_logits, padded_grads) = results
    torch.testing.assert_close(padded_logits, logits, rtol=0, atol=1e-10)
    assert padded_grads.keys() == grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(padded_grads[key], grad, rtol=0, atol=1e-10, msg=key)


def _step_function(model, optimizer):
    def step(batch):
        logits = model(*batch.inputs())
        loss = torch.nn.functional.cross_entropy(logits, batch.label)
        loss.backward()
        optimizer.step()
        return loss, logits
    return step


@pytest.mark.parametrize("optimizer_name", ["adam", "adagrad"])
def test_warm_up_steps_are_undone_by_the_restore(optimizer_name):
    config = TrainingConfig(optimizer=optimizer_name, lr=0.05, l2=1e-3)
    batch = _full_batch()
    warmed, fresh = (_build("cam", {"variant": "full"}, seed=5) for _ in range(2))
    warmed_optimizer, fresh_optimizer = make_optimizer(warmed, config), make_optimizer(fresh, config)
    saved = snapshot_state(warmed, warmed_optimizer)
    step = _step_function(warmed, warmed_optimizer)
    for _ in range(3):
        warmed_optimizer.zero_grad(set_to_none=True)
        step(batch)
    assert any(not torch.equal(a, b) for a, b in zip(warmed.parameters(), fresh.parameters(), strict=True))
    restore_state(warmed, warmed_optimizer, saved)
    for model, optimizer in ((warmed, warmed_optimizer), (fresh, fresh_optimizer)):
        optimizer.zero_grad(set_to_none=True)
        _step_function(model, optimizer)(batch)
    for a, b in zip(warmed.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    for p_warm, p_fresh in zip(warmed.parameters(), fresh.parameters(), strict=True):
        for key, value in fresh_optimizer.state[p_fresh].items():
            assert torch.equal(warmed_optimizer.state[p_warm][key], value), key


def test_a_step_that_cannot_be_captured_runs_eagerly_and_says_so_once(capsys):
    batch = _full_batch()
    models = [_build("decomposable", {"variant": "intra"}, seed=2) for _ in range(2)]
    optimizers = [make_optimizer(m, TrainingConfig(optimizer="adam")) for m in models]
    graphed = GraphedTrainingStep(_step_function(models[0], optimizers[0]), models[0], optimizers[0],
                                  required=False)
    eager = _step_function(models[1], optimizers[1])
    for _ in range(2):  # no CUDA here: capture fails, both steps run eagerly
        loss, _ = graphed(batch)
        optimizers[1].zero_grad(set_to_none=True)
        expected, _ = eager(batch)
        assert torch.equal(loss, expected)
    assert capsys.readouterr().err.count("runs eagerly: CUDA graph capture failed") == 1
    required = GraphedTrainingStep(_step_function(models[0], optimizers[0]), models[0], optimizers[0],
                                   required=True)
    before = [p.detach().clone() for p in models[0].parameters()]
    with pytest.raises(GraphCaptureFailed, match="cuda_graphs: on"):
        required(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, models[0].parameters(), strict=True))


def test_auto_on_cpu_trains_eagerly_on_unpadded_batches(toy):
    trainer = make_trainer(toy_run_config(decomposable(dim=8), epochs=1, device="cpu", max_steps=2), toy)
    assert trainer.config.cuda_graphs == "auto"
    trainer.fit()
    assert trainer._graphed is None and trainer.state.steps == 2
    for batch in trainer._batches("train", shuffle=True, epoch=1):  # no column of padding alone
        assert batch.premise_mask[:, -1].any() and batch.hypothesis_mask[:, -1].any()


def test_on_without_cuda_is_refused(toy, tmp_path):
    with pytest.raises(DeviceUnavailable, match="cuda_graphs='on' needs a CUDA device"):
        make_trainer(toy_run_config(decomposable(dim=8), device="cpu", cuda_graphs="on"), toy)
    config = tmp_path / "run.yaml"
    config.write_text(
        "name: graphs\nmodel: {name: decomposable, args: {hidden_size: 8, projection_dim: 8}}\n"
        "data: {corpus: toy, toy: {size: 60}}\n"
        "training: {epochs: 1, device: cpu, cuda_graphs: 'on'}\n")
    done = orchestrate("train", str(config), "--checkpoint-dir", str(tmp_path / "ckpt"), cwd=tmp_path)
    assert done.returncode == 2, done.output
    assert "cuda_graphs='on' needs a CUDA device" in done.stderr
    assert not (tmp_path / "ckpt" / "checkpoint.pt").exists()

