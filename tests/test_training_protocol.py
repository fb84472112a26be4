"""Training protocols of the papers that the plain epoch loop cannot express: a step budget
(Parikh et al.: 50M steps, best-dev checkpoint), Parikh's N(0, 0.01) initialisation, layerwise
training of multi-block ABCNNs (Yin et al. §5.1.2) and the refit on train + dev."""

from __future__ import annotations

import pytest
import torch

from nli_models.config import RunConfig
from nli_models.data import prepare_data
from nli_models.registry import build_model
from nli_models.training import make_trainer

TOY = {"corpus": "toy", "toy": {"size": 300, "seed": 0}}
DECOMPOSABLE = {
    "name": "decomposable",
    "variant": "vanilla",
    "args": {"embedding_dim": 16, "projection_dim": 16, "hidden_size": 16, "dropout": 0.1},
}


def run_config(model=DECOMPOSABLE, **training) -> RunConfig:
    training = {"epochs": 3, "batch_size": 16, "lr": 0.01, **training}
    return RunConfig.model_validate(
        {"name": "test", "model": model, "data": TOY, "training": training}
    )


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return prepare_data(TOY, cache_dir=tmp_path_factory.mktemp("prepared"))


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
    assert float(model.attend[1].weight.std()) > 0.02  # Kaiming-uniform on a 200x200 layer


def test_parikh_paper_configs_use_the_gaussian_init():
    from nli_models.models.decomposable import DecomposableAttention

    assert {c.config["init"] for c in DecomposableAttention.PAPER_CONFIGS} == {"gaussian_0.01"}
