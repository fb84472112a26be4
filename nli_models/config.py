"""The YAML training config of `orchestrate train` (a sweep spec adds a `search` block).

Every block maps one-to-one onto a typed object; validation errors name the file and the field
path (e.g. ``quickstart.yaml: training.lr: must be > 0 (got -0.1)``).
"""

from __future__ import annotations

import copy
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from nli_models.data.data_config import DataConfig
from nli_models.data.encode import BUCKET_CHUNK_BATCHES
from nli_models.errors import InputError, mask_secrets
from nli_models.registry import build_model, model_class
from nli_models.strict import StrictModel, check_finite, load_yaml


class ConfigError(InputError):
    """A config file is unreadable or invalid; the message names the file and the field."""


class ModelConfig(StrictModel):
    name: str
    variant: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_model(self) -> ModelConfig:
        model_class(self.name)  # the model's own arguments are checked by check()
        check_finite(self.args, "args")
        for reserved in ("vocab_size", "num_classes", "variant"):
            if reserved in self.args:
                raise ValueError(
                    f"args.{reserved} is set from the data (or model.variant); remove it"
                )
        return self

    def build_kwargs(self, vocab_size: int, num_classes: int, embedding_dim: int) -> dict[str, Any]:
        kwargs = dict(self.args)
        kwargs.update(vocab_size=vocab_size, num_classes=num_classes, embedding_dim=embedding_dim)
        if self.variant is not None:
            kwargs["variant"] = self.variant
        return kwargs

    def check(self) -> None:
        """Build the model on a 10-word vocabulary: its argument schema (variant, names, values)
        and the dimension checks of its constructor run, in milliseconds, before any data is
        read. Raises ModelArgumentError (a ValueError) or the constructor's ValueError."""
        build_model(self.name, **self.build_kwargs(10, 3, self.args.get("embedding_dim", 300)))


class TrainingConfig(StrictModel):
    optimizer: Literal["adam", "adagrad"] = "adam"
    adagrad_accumulator: float = Field(
        0.1,
        ge=0,
        description="Adagrad's initial accumulator: 0.1 (TensorFlow's default, Parikh et al.'s "
        "setup) or 0 (Duchi et al.'s Adagrad, which Yin et al. cite: the first step of a parameter "
        "is lr * sign(gradient), and small gradients are not damped by the 0.1)",
    )
    lr: float = Field(1e-3, gt=0)
    l2: float = Field(0.0, ge=0)
    batch_size: int = Field(32, ge=1)
    epochs: int = Field(10, ge=1)
    max_steps: int | None = Field(
        None,
        ge=1,
        description="optimizer steps (batches) in all; training ends at epochs or max_steps, "
        "whichever comes first; a last partial epoch is evaluated on dev like a whole one",
    )
    patience: int | None = Field(None, ge=1, description="early stopping on dev accuracy")
    layerwise: bool = Field(
        False,
        description="multi-block models (abcnn): train block 1, freeze it, add and train block 2, "
        "... (Yin et al. §5.1.2); epochs and patience apply to each phase",
    )
    grad_clip: float | None = Field(None, gt=0, description="max gradient norm")
    batching: Literal["bucketed", "random"] = Field(
        "bucketed",
        description="order of the training batches each epoch. bucketed: the shuffled examples "
        "are cut into pools of bucket_pool_batches batches, each pool is sorted by length and cut "
        "into batches, and the batch order is shuffled (AllenNLP's bucket sampler; little "
        "padding); random: the shuffled examples are cut into batches as they are",
    )
    bucket_pool_batches: int = Field(
        BUCKET_CHUNK_BATCHES, ge=1, description="batches per length-sorted pool (bucketed only)"
    )
    seed: int = 1
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="bf16: autocast to bfloat16 on any device, the recurrent layers (LSTMs, "
        "word-by-word attention's recurrence) kept in float32. fp32 on CUDA: matmuls, "
        "convolutions and RNNs use TF32 tensor cores (Ampere and newer: float32 range and "
        "accumulation, 10-bit mantissa inputs)",
    )
    deterministic: bool = Field(
        False,
        description="deterministic algorithms only (torch.use_deterministic_algorithms, cuDNN "
        "deterministic and no benchmark, CUBLAS_WORKSPACE_CONFIG): bit-identical runs for a seed "
        "on CUDA as well; an op without a deterministic implementation then raises",
    )
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads")
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="the training step (forward, backward, optimizer) captured as one CUDA graph "
        "per batch shape and replayed: one launch instead of hundreds of kernels per step. Batches "
        "are then padded to a few fixed lengths. auto: on CUDA, eager where capture fails "
        "(said once); on: CUDA required, a failed capture is an error; off: eager",
    )

    @field_validator("precision", mode="before")
    @classmethod
    def _fp16_is_not_offered(cls, value: Any) -> Any:
        if value == "fp16":
            # Not only loss scaling: the models' small constants (clamps, eps) underflow in
            # fp16's 5-bit exponent; ABCNN's dev loss was NaN after 2 steps under fp16 autocast.
            raise ValueError(
                "'fp16' is not offered (it needs loss scaling, which the trainer does not do, and "
                "the models' small constants underflow in it); use 'bf16' (fp32's range, no "
                "scaling needed) or 'fp32'"
            )
        return value


class RunConfig(StrictModel):
    """A training config: `orchestrate train` runs exactly this."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    model: ModelConfig
    data: DataConfig
    training: TrainingConfig = Field(default_factory=TrainingConfig)


def _block_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The config block (model class) that holds the key at `loc` (its last element)."""
    keyed = False  # the previous field was a dict: this element is one of its keys
    for part in loc[:-1]:
        if keyed or isinstance(part, int):
            keyed = False
            continue
        field = cls.model_fields.get(str(part)) if cls is not None else None
        if field is None:
            return None
        keyed = typing.get_origin(field.annotation) is dict
        cls = _model_in(field.annotation)
    return cls


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):  # Optional[...], list[...], dict[str, ...]
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def format_validation_error(
    source: str, error: ValidationError, cls: type[BaseModel] | None = None
) -> str:
    lines = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
            block = _block_at(cls, item["loc"]) if cls is not None else None
            if block is not None:
                message += f"; allowed: {', '.join(block.model_fields)}"
        # A whole block's validator (unknown model, data consistency) names the values itself;
        # echoing the block's dict would only bury the message.
        elif "input" in item and item["type"] != "missing" and not isinstance(item["input"], dict):
            message = f"{message} (got {item['input']!r})"
        lines.append(f"{source}: {path}: {message}")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        raw = load_yaml(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as a YAML file ({exc})") from None
    except yaml.MarkedYAMLError as exc:
        line = f"line {exc.problem_mark.line + 1}: " if exc.problem_mark else ""
        raise ConfigError(f"{path}: {line}not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    return raw


def validate_config(cls: type[BaseModel], raw: dict[str, Any], source: str) -> Any:
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, cls)) from None


class _ValueLoader(yaml.SafeLoader):
    """YAML scalars of `--set`, with `1e-3` a float as YAML 1.2 reads it (PyYAML's 1.1 resolver
    wants `1.0e-3` and would hand the string '1e-3' on)."""


_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


@dataclass(frozen=True)
class Overrides:
    """`--set dotted.key=value` (repeatable) and `--data-dir DIR` of the CLI: applied to the YAML
    mapping before validation, so a bad value fails like the same value in the file."""

    assignments: tuple[str, ...] = ()
    data_dir: str | None = None

    def __bool__(self) -> bool:
        return bool(self.assignments) or self.data_dir is not None

    def pairs(self) -> list[tuple[str, Any]]:
        """(dotted key, value) in the order given; --data-dir last, as data.data_dir."""
        pairs = []
        for assignment in self.assignments:
            key, sep, text = assignment.partition("=")
            key = key.strip()
            if not sep or not re.fullmatch(r"[A-Za-z_][\w\-]*(\.[A-Za-z_0-9][\w\-]*)*", key):
                raise ConfigError(
                    f"--set {assignment!r}: expected dotted.key=value, e.g. training.lr=0.01 or "
                    "search.space.lr.grid=[1.0e-3,3.0e-3]"
                )
            try:
                value = yaml.load(text, Loader=_ValueLoader) if text.strip() else None
            except yaml.YAMLError as exc:
                raise ConfigError(f"--set {key}: value {text!r} is not valid YAML: {exc}") from None
            pairs.append((key, value))
        if self.data_dir is not None:
            pairs.append(("data.data_dir", self.data_dir))
        return pairs

    def describe(self) -> list[str]:
        """One `key=value` per override, values as YAML flow text (printed, recorded with a run),
        passwords in URIs masked."""
        return [
            mask_secrets(f"{key}={yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix('...').strip()}")
            for key, value in self.pairs()
        ]

    def apply(self, raw: dict[str, Any]) -> dict[str, Any]:
        """A copy of `raw` with every override set (missing blocks created)."""
        raw = copy.deepcopy(raw)
        for key, value in self.pairs():
            *parents, leaf = key.split(".")
            node = raw
            for depth, part in enumerate(parents):
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    where = ".".join(parents[: depth + 1])
                    raise ConfigError(
                        f"--set {key}: {where} is {child!r}, not a mapping that could hold {leaf!r}"
                    )
                node = child
            node[leaf] = value
        return raw


def source_name(path: str | Path, overrides: Overrides | None) -> str:
    """What error messages call the config: the file, plus the overrides when there are any."""
    if not overrides:
        return str(path)
    return f"{path} (with overrides {', '.join(overrides.describe())})"


def read_config_mapping(path: str | Path, overrides: Overrides | None = None) -> dict[str, Any]:
    """The YAML mapping of a config file with the CLI's overrides applied: the one loader of
    `train`, `validate`, `sweep` and `submit`."""
    raw = read_yaml(path)
    return overrides.apply(raw) if overrides else raw


def load_run_config(path: str | Path, overrides: Overrides | None = None) -> RunConfig:
    raw = read_config_mapping(path, overrides)
    raw.pop("search", None)  # a sweep spec is also a valid training config
    return validate_config(RunConfig, raw, source_name(path, overrides))
