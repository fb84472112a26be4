"""The base of every config block, and the one YAML loader for configs and specs.

Pydantic's lax mode would take `epochs: true` as 1 and `l2: .inf` as a number, and PyYAML's
YAML 1.1 rules read `labels: [yes, no]` as booleans and keep the last of two equal keys; each of
these trains something other than what the file says, so each is refused or read as written.
"""

from __future__ import annotations

import math
import re
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _accepts(annotation: Any, kind: type) -> bool:
    if annotation is Any or annotation is kind:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_accepts(arg, kind) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return any(isinstance(arg, kind) for arg in typing.get_args(annotation))
    return False


class StrictModel(BaseModel):
    """Unknown keys, non-finite numbers and booleans where a number is expected are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool):
            annotation = cls.model_fields[info.field_name].annotation
            if not _accepts(annotation, bool):
                raise ValueError(
                    "expected a number or text, got a boolean (true/false/yes/no); "
                    "quote it if you mean the text"
                )
        return value


def check_finite(value: Any, path: str) -> None:
    """Raise ValueError naming `path` if `value` (or anything inside it) is NaN or infinite."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: must be a finite number (got {value})")
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_finite(item, f"{path}[{i}]")


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (only true/false) and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key].line + 1}); "
                    "each key may appear once", key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads yes/no/on/off (any case) as booleans: `labels: [yes, no]` would become
# [True, False]. Only true/false are booleans here; everything else stays the text written.
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _first in "tTfF":
    _ConfigLoader.yaml_implicit_resolvers.setdefault(_first, []).append(
        ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"))
    )


def load_yaml(text: str) -> Any:
    """Parse config/spec YAML: safe (no object construction), YAML 1.2 booleans, unique keys."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
