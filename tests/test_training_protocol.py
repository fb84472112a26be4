"""Training protocols of the papers that the plain epoch loop cannot express: a step budget
(Parikh et al.: 50M steps, best-dev checkpoint), Parikh's N(0, 0.01) initialisation, layerwise
training of multi-block ABCNNs (Yin et al. §5.1.2) and the refit on train + dev."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testkit.toy import decomposable, toy_run_config

from nli_models.config import RunConfig
from nli_models.registry import build_model
from nli_models.training import make_trainer

DECOMPOSABLE = decomposable(dropout=0.1)
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def run_config(model=DECOMPOSABLE, **training) -> RunConfig:
    return toy_run_config(model, **training)


def steps_per_epoch(toy, batch_size=16):
    return -(-len(toy.splits["train"]) // batch_size)


def test_max_steps_ends_training_mid_epoch_and_evaluates_the_partial_epoch(toy):
    per_epoch = steps_per_epoch(toy)
    limit = per_epoch + 3  # one whole epoch, then 3 steps of the second
    trainer = make_trainer(run_config(epochs=10, max_steps=limit), toy)
    state = trainer.fit()
    assert state.steps == limit
    assert state.epoch == 2 and len(state.history) == 2  # the partial epoch is evaluated too
    assert state.best_epoch in (1, 2) and trainer.best_model_state is not None


def test_epochs_bind_when_they_come_before_max_steps(toy):
    trainer = make_trainer(run_config(epochs=2, max_steps=10_000), toy)
    state = trainer.fit()
    assert state.epoch == 2 and state.steps == 2 * steps_per_epoch(toy)


def test_resume_after_the_step_budget_trains_nothing(toy, tmp_path):
    config = run_config(epochs=10, max_steps=5)
    trainer = make_trainer(config, toy)
    trainer.fit(lambda t, _: t.save_checkpoint(tmp_path))
    resumed = make_trainer(config, toy)
    resumed.load_checkpoint(tmp_path)
    before = {k: v.clone() for k, v in resumed.model.state_dict().items()}
    state = resumed.fit()
    assert state.steps == 5 and state.epoch == 1
    assert all(torch.equal(before[k], v) for k, v in resumed.model.state_dict().items())


def test_max_steps_is_validated():
    with pytest.raises(ValueError, match="max_steps"):
        run_config(max_steps=0)


def test_parikh_gaussian_init_has_the_papers_std():
    torch.manual_seed(0)
    model = build_model(
        "decomposable", vocab_size=50, embedding_dim=300, num_classes=3, init="gaussian_0.01"
    )
    embedding_ids = {id(p) for p in model.word_embeddings.parameters()}
    values = torch.cat(
        [p.detach().flatten() for p in model.parameters() if id(p) not in embedding_ids]
    )
    assert len(values) > 300_000
    assert abs(float(values.std()) - 0.01) < 2e-4
    assert abs(float(values.mean())) < 1e-4
    for name, parameter in model.named_parameters():  # every matrix, not only on average
        if id(parameter) not in embedding_ids and parameter.numel() >= 1000:
            assert 0.009 < float(parameter.detach().std()) < 0.011, name


def test_parikh_default_init_is_pytorchs_and_wider():
    torch.manual_seed(0)
    model = build_model("decomposable", vocab_size=50, embedding_dim=300, num_classes=3)
    assert float(model.attend[1].weight.detach().std()) > 0.02  # Kaiming-uniform on a 200x200 layer


def test_parikh_paper_configs_use_the_gaussian_init():
    from nli_models.models.decomposable import DecomposableAttention

    assert {c.config["init"] for c in DecomposableAttention.PAPER_CONFIGS} == {"gaussian_0.01"}


ABCNN_TWO_BLOCKS = {
    "name": "abcnn",
    "variant": "abcnn3",
    "args": {"embedding_dim": 8, "hidden_size": 6, "num_blocks": 2, "max_length": 40},
}


def _block_weights(trainer, index):
    return {k: v.detach().clone() for k, v in trainer.model.blocks[index].state_dict().items()}


def test_layerwise_training_freezes_block_one_while_block_two_trains(toy):
    config = run_config(ABCNN_TWO_BLOCKS, epochs=2, layerwise=True, lr=0.05)
    trainer = make_trainer(config, toy)
    initial_block1, initial_block2 = _block_weights(trainer, 0), _block_weights(trainer, 1)
    snapshots = {}

    def record(trainer, result):
        snapshots[result.epoch] = (
            trainer.state.phase,
            _block_weights(trainer, 0),
            _block_weights(trainer, 1),
            trainer.model.active_blocks,
        )

    state = trainer.fit(record)
    assert state.epoch == 4 and state.phase == 2 and trainer.finished()
    assert [snapshots[e][0] for e in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert [snapshots[e][3] for e in (1, 2, 3, 4)] == [1, 1, 2, 2]
    # Phase 1: block 1 learns, block 2 is not part of the network.
    assert any(not torch.equal(initial_block1[k], v) for k, v in snapshots[1][1].items())
    assert all(torch.equal(initial_block2[k], v) for k, v in snapshots[2][2].items())
    # Phase 2: block 1 keeps the weights it ended phase 1 with (its best-dev ones), block 2 moves.
    block1_phase2_start = snapshots[3][1]
    for epoch in (3, 4):
        assert all(torch.equal(block1_phase2_start[k], v) for k, v in snapshots[epoch][1].items())
    assert any(not torch.equal(initial_block2[k], v) for k, v in snapshots[4][2].items())
    assert all(not p.requires_grad for p in trainer.model.blocks[0].parameters())


def test_layerwise_phase_two_starts_from_phase_ones_best_dev_weights(toy):
    config = run_config(ABCNN_TWO_BLOCKS, epochs=3, layerwise=True, lr=0.05)
    trainer = make_trainer(config, toy)
    best_block1 = {}

    def record(trainer, result):
        if trainer.state.phase == 1 and result.is_best:
            best_block1.update(_block_weights(trainer, 0))
        if trainer.state.phase == 2:
            assert all(torch.equal(best_block1[k], v) for k, v in _block_weights(trainer, 0).items())

    trainer.fit(record)
    assert trainer.state.phase == 2


def test_layerwise_on_a_model_without_blocks_is_an_error(toy):
    with pytest.raises(ValueError, match="layerwise"):
        make_trainer(run_config(layerwise=True), toy)


def test_refit_trains_on_train_plus_dev_for_the_given_epochs_and_tests_once(toy):
    from nli_models.training import refit_and_test, train_plus_dev

    combined = train_plus_dev(toy)
    train, dev = toy.splits["train"], toy.splits["dev"]
    assert len(combined.splits["train"]) == len(train) + len(dev)
    last = len(combined.splits["train"]) - 1
    assert np.array_equal(combined.splits["train"].premise(last), dev.premise(len(dev) - 1))
    assert np.array_equal(combined.splits["train"].premise(0), train.premise(0))
    assert toy.splits["train"] is train  # the prepared data is not changed

    config = run_config(epochs=20, patience=1)
    trainer, test = refit_and_test(config, toy, epochs=2)
    assert trainer.state.epoch == 2  # the given epochs, no early stopping
    assert trainer.config.patience is None
    assert len(test.gold) == len(toy.splits["test"])
    assert test.accuracy == trainer.evaluate("test").accuracy  # final weights, not best-on-dev
    steps = -(-(len(train) + len(dev)) // 16)
    assert trainer.state.steps == 2 * steps


def test_train_recipe_shows_the_layerwise_phase(toy):
    from nli_models.training.recipe import train_and_test

    lines = []
    config = run_config(ABCNN_TWO_BLOCKS, epochs=1, layerwise=True)
    trainer, test = train_and_test(config, data=toy, echo=lines.append)
    epochs = [line for line in lines if line.startswith("epoch")]
    assert len(epochs) == 2
    assert epochs[0].startswith("epoch   1/2") and epochs[0].endswith("[block 1/2]")
    assert epochs[1].startswith("epoch   2/2") and "[block 2/2]" in epochs[1]
    assert "running acc" in epochs[0]
    assert test is not None and trainer.model.active_blocks == 2
