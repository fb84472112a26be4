"""Models registered by name; ``build_model(name, **config)`` maps a config onto a constructor.

Each model class declares its constructor arguments as one pydantic model (``Arguments``, a
subclass of nli_models.models.arguments.ModelArguments, whose ``variant`` field lists the
variants) and the paper configurations it reproduces (``PAPER_CONFIGS``). The constructor
validates its arguments against ``Arguments``, the one check of a model's config: a typo in a
YAML file fails with the list of valid choices instead of a TypeError deep in a constructor.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any

from torch import nn

_REGISTRY: dict[str, type[nn.Module]] = {}


@dataclass(frozen=True)
class PaperConfig:
    """One row of a paper's results table that a registered model reproduces."""

    model: str
    config: dict[str, Any]
    paper: str  # e.g. "rocktaschel2016"
    table_row: str  # e.g. "Table 1: Word-by-word attention, k=100"
    published_theta_m: int | None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def register_model(name: str):
    """Class decorator: ``@register_model("decomposable")``."""

    def decorator(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is registered twice")
        cls.registered_name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def _ensure_loaded() -> None:
    # Importing the model modules runs their @register_model decorators.
    from nli_models import models  # noqa: F401


def model_names() -> list[str]:
    _ensure_loaded()
    return sorted(_REGISTRY)


def model_class(name: str) -> type[nn.Module]:
    _ensure_loaded()
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; registered models: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def model_variants(name: str) -> tuple[str, ...]:
    return typing.get_args(model_class(name).Arguments.model_fields["variant"].annotation)


def model_arguments(name: str) -> dict[str, Any]:
    """Constructor arguments of a model with their defaults (inspect.Parameter.empty if required)."""
    return {
        argument: inspect.Parameter.empty if spec.is_required() else spec.default
        for argument, spec in model_class(name).Arguments.model_fields.items()
    }


def build_model(name: str, **config: Any) -> nn.Module:
    """Build a registered model; ``config`` holds vocab_size, embedding_dim, num_classes and the
    model's hyperparameters (including ``variant``), validated by the model's constructor."""
    return model_class(name)(**config)


def paper_configs() -> list[PaperConfig]:
    _ensure_loaded()
    rows: list[PaperConfig] = []
    for name in sorted(_REGISTRY):
        rows.extend(getattr(_REGISTRY[name], "PAPER_CONFIGS", ()))
    return rows


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(|θ|M, |θ|W+M): trainable parameters outside ``model.word_embeddings``, and those plus the
    tuned rows of the embedding table (rows kept fixed, e.g. pretrained vectors, do not count)."""
    embeddings = model.word_embeddings
    embedding_ids = {id(p) for p in embeddings.parameters()}
    theta_m = sum(
        p.numel() for p in model.parameters() if p.requires_grad and id(p) not in embedding_ids
    )
    return theta_m, theta_m + embeddings.num_trainable()
