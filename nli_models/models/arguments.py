"""A model's constructor arguments, declared once as a pydantic model (AllenNLP style: a config
maps one-to-one onto the constructor) and validated once, when the constructor runs.

Every way of building a model (a YAML config's dry build, a sweep's trial, a direct call) goes
through ``ModelArguments.parse``, so the checks and their messages are the same everywhere. A
message names the argument, the value and what is allowed: ``hidden_size must be an integer >= 1;
got 0``, ``unknown variant 'deep' for model 'decomposable'; valid variants: vanilla, intra``.
Strict mode: no number is read from text, and a boolean is neither a number nor a token id.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo

from nli_models.errors import InputError


class ModelArgumentError(InputError):
    """A model's arguments break its schema; ``argument`` is the first one at fault (None for
    unknown or missing names and for rules over several arguments)."""

    def __init__(self, message: str, argument: str | None = None):
        super().__init__(message)
        self.argument = argument


def _size(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{info.field_name} must be an integer >= 1; got {value!r}")
    return value


def _rate(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{info.field_name} must be a number in [0, 1); got {value!r}")
    return value


Size = Annotated[int, BeforeValidator(_size)]
"""A width, a count or a length: an integer >= 1."""
Rate = Annotated[float, BeforeValidator(_rate)]
"""A dropout probability in [0, 1)."""


def _same(value: Any, choice: Any) -> bool:
    return type(value) is type(choice) and value == choice  # 1 is not True, 1.0 is not 1


def one_of(*choices: Any) -> Any:
    """The type of an argument that takes one of ``choices``."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if not any(_same(value, choice) for choice in choices):
            allowed = ", ".join(map(repr, choices))
            raise ValueError(f"{info.field_name} must be one of {allowed}; got {value!r}")
        return value

    return Annotated[Literal[choices], BeforeValidator(check)]


def variant_of(*variants: str) -> Any:
    """The type of a model's ``variant`` argument; the registry lists ``variants`` from it."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if not any(_same(value, variant) for variant in variants):
            model = (info.context or {}).get("model")
            raise ValueError(
                f"unknown variant {value!r} for model {model!r}; "
                f"valid variants: {', '.join(variants)}"
            )
        return value

    return Annotated[Literal[variants], BeforeValidator(check)]


class ModelArguments(BaseModel):
    """The arguments every model takes from the data; each model's subclass adds its own."""

    model_config = ConfigDict(extra="forbid", strict=True)

    vocab_size: Size
    embedding_dim: Size
    num_classes: Size

    @classmethod
    def parse(cls, arguments: dict[str, Any], model: str) -> Any:
        """The validated arguments of ``model`` (its registered name), or ModelArgumentError."""
        try:
            return cls.model_validate(arguments, context={"model": model})
        except ValidationError as exc:
            raise _argument_error(cls, model, exc) from None


def _argument_error(cls: type[ModelArguments], model: str, exc: ValidationError) -> ModelArgumentError:
    errors = exc.errors()
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return ModelArgumentError(
            f"model {model!r} got unknown argument(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(cls.model_fields))}"
        )
    missing = sorted(str(e["loc"][0]) for e in errors if e["type"] == "missing")
    if missing:
        return ModelArgumentError(
            f"model {model!r} is missing required argument(s): {', '.join(missing)}"
        )
    messages = []
    for error in errors:
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] != "value_error":  # pydantic's own check: name the argument and value
            message = f"{error['loc'][0]}: {message}; got {error['input']!r}"
        messages.append(message)
    first = errors[0]["loc"]
    return ModelArgumentError("; ".join(messages), str(first[0]) if first else None)
