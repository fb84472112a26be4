"""Small configs on the generated toy corpus, shared by the trainer, CLI and sweep tests.

The fixtures that go with them (`toy`, the prepared corpus of TOY; `one_thread`) are in conftest.py.
"""

from __future__ import annotations

TOY = {"corpus": "toy", "toy": {"size": 300, "seed": 0}}


def toy_data(size: int) -> dict:
    return {"corpus": "toy", "toy": {"size": size, "seed": 0}}


def decomposable(dim: int = 16, dropout: float = 0.0) -> dict:
    """A vanilla decomposable-attention model block, every layer `dim` wide."""
    return {
        "name": "decomposable",
        "variant": "vanilla",
        "args": {"embedding_dim": dim, "projection_dim": dim, "hidden_size": dim, "dropout": dropout},
    }


def tiny_config(name: str = "tiny", dropout: float = 0.0, **training) -> dict:
    """A training config that runs in seconds: an 8-wide model on 150 toy pairs, one epoch on one
    thread (tiny models gain nothing from two, and lose much when the cores are busy)."""
    return {
        "name": name,
        "model": decomposable(dim=8, dropout=dropout),
        "data": toy_data(150),
        "training": {"epochs": 1, "batch_size": 16, "lr": 0.01, "num_threads": 1, **training},
    }


def toy_run_config(model: dict, data: dict = TOY, **training):
    """A validated RunConfig of 3 epochs, batch 16, lr 0.01 unless `training` says otherwise."""
    from nli_models.config import RunConfig

    training = {"epochs": 3, "batch_size": 16, "lr": 0.01, **training}
    return RunConfig.model_validate({"name": "test", "model": model, "data": data, "training": training})
