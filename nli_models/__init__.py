"""NLI models of four papers, their data pipeline and a plain PyTorch trainer (no Ray, no MLflow).

The registry's names are loaded on first use (PEP 562): importing a light submodule such as
nli_models.errors (`orchestrate --help` does) must not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "PaperConfig",
    "build_model",
    "count_parameters",
    "model_names",
    "model_variants",
    "paper_configs",
    "register_model",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("nli_models.registry"), name)
    raise AttributeError(f"module 'nli_models' has no attribute {name!r}")
