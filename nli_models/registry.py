"""Models registered by name; ``build_model(name, **config)`` maps a config onto a constructor.

Each model class declares its variants (``VARIANTS``) and the paper configurations it reproduces
(``PAPER_CONFIGS``); the registry checks names and arguments before anything is built, so a typo
in a YAML file fails with the list of valid choices instead of a TypeError deep in a constructor.
"""

from __future__ import annotations

import inspect
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
    return tuple(getattr(model_class(name), "VARIANTS", ()))


def model_arguments(name: str) -> dict[str, Any]:
    """Constructor arguments of a model with their defaults (inspect.Parameter.empty if required)."""
    signature = inspect.signature(model_class(name).__init__)
    return {
        p.name: p.default
        for p in signature.parameters.values()
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def check_config(name: str, config: dict[str, Any]) -> None:
    """Raise ValueError naming the bad key or value; builds nothing."""
    variants = model_variants(name)
    if variants and "variant" in config:
        variant = config["variant"]
        if variant not in variants:
            raise ValueError(
                f"unknown variant {variant!r} for model {name!r}; valid variants: {', '.join(variants)}"
            )
    allowed = model_arguments(name)
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(
            f"model {name!r} got unknown argument(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    missing = sorted(k for k, v in allowed.items() if v is inspect.Parameter.empty and k not in config)
    if missing:
        raise ValueError(f"model {name!r} is missing required argument(s): {', '.join(missing)}")


def build_model(name: str, **config: Any) -> nn.Module:
    """Build a registered model; ``config`` holds vocab_size, embedding_dim, num_classes and the
    model's hyperparameters (including ``variant`` where the model has variants)."""
    check_config(name, config)
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
