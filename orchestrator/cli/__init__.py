"""The `orchestrate` command: its group and the one handler that turns bad input into
`error: MESSAGE`, exit 2 (orchestrate.py), the sub-commands' modules (*_commands.py), the options
several commands share (options.py, cluster_common.py) and the model catalog `orchestrate models`
prints (model_catalog.py). `main` is loaded on first use (PEP 562), so importing a light module of
this package, as the Ray adapter imports options.py, does not load every command.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("orchestrator.cli.orchestrate"), name)
    raise AttributeError(f"module 'orchestrator.cli' has no attribute {name!r}")
