"""A run's protocol fingerprint: what a reader needs to judge whether its numbers can stand beside
a paper's (corpus, the exact training file and every split's size, word vectors by their content
and their coverage of the vocabulary, budget, initialisation, optimiser, batch size). Values are plain str / int / bool / None, so they log as tags unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nli_models.config import RunConfig
from nli_models.data import PreparedData

DEFAULT_INIT = "default"  # the model's own: PyTorch's defaults unless the model documents others


def protocol_fingerprint(
    config: RunConfig, data: PreparedData, refit_on_train_dev: bool = False
) -> dict[str, Any]:
    train_info = data.info.get("train", {})
    vectors = config.data.vectors
    training = config.training
    identity = data.vectors_identity
    return {
        "corpus": data.corpus,
        "train_file": _file_name(train_info.get("source")),
        "train_size": len(data.splits["train"]),
        "train_subsampled_from": train_info.get("subsampled_from"),
        "dev_file": _file_name(data.info.get("dev", {}).get("source")),
        "dev_holdout": "holdout" in data.info.get("dev", {}),
        "dev_size": len(data.splits["dev"]) if "dev" in data.splits else None,
        "test_size": len(data.splits["test"]) if "test" in data.splits else None,
        "vectors": _file_name(vectors.source) if vectors else None,
        "vectors_dim": data.embedding_dim,
        # By content: a file's name does not say what it holds.
        "vectors_words": identity.words if identity else None,
        "vectors_sha256": identity.sha256 if identity else None,
        "vector_coverage": None if data.vector_coverage is None else round(data.vector_coverage, 4),
        "vectors_policy": vectors.oov if vectors else None,
        "vectors_tuned": vectors.tune if vectors else None,
        "extend_vocab": vectors.extend_vocab if vectors else None,
        "epochs": training.epochs,
        "max_steps": training.max_steps,
        "patience": training.patience,
        "layerwise": training.layerwise,
        "refit_on_train_dev": refit_on_train_dev,
        "init": config.model.args.get("init", DEFAULT_INIT),
        "optimizer": training.optimizer,
        "lr": training.lr,
        "batch_size": training.batch_size,
    }


def _file_name(source: str | None) -> str | None:
    # The file itself, not where this machine keeps it: two copies of SNLI train are one protocol.
    if source is None or "(" in source:  # generated corpora describe themselves, e.g. toy(...)
        return source
    return Path(source).name
