"""Sweep specs: a training config (nli_models.config.RunConfig) plus a `search` block.

Everything is validated before Ray starts (as Hydra does): every grid value and range endpoint is
applied to the training config and checked by the same typed models that `orchestrate train` uses,
so `lr: {grid: [0.1, -1]}` fails with `search.space.lr.grid[1]` before any trial launches.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, field_validator, model_validator

from nli_models.config import (
    ConfigError,
    Overrides,
    RunConfig,
    TrainingConfig,
    read_config_mapping,
    source_name,
    validate_config,
)
from nli_models.files import expand_user
from nli_models.models.arguments import ModelArgumentError
from nli_models.registry import model_arguments
from nli_models.stacked import MEMBER_FIELDS, stack_refusal
from nli_models.strict import StrictModel, check_finite
from results import run_schema as rs
from results.run_schema import OBJECTIVE_METRICS
from results.tracking_uri import resolve_tracking_uri

# How a trial runs, not what it trains: neither searched nor logged as a hyperparameter.
EXECUTION_KEYS = frozenset({"device", "num_threads", "cuda_graphs"})
TRAINING_KEYS = frozenset(TrainingConfig.model_fields) - EXECUTION_KEYS - {"seed"}
RESERVED_KEYS = frozenset({"seed", "model", "vocab_size", "num_classes"})
# search.stack: auto's largest stack, the size benchmarks/stacking.py measures on a CPU; smaller
# where fewer stacks would leave trial slots idle (benchmarks/README.md, "stacked_sweep").
AUTO_STACK_SIZE = 8
# The models whose stacks of one seed measured more configurations per CPU-hour than separate
# trials (benchmarks/README.md, "stacking": ABCNN-3 1.72x; decomposable attention 0.79x,
# word-by-word attention 0.69x, CAM 0.74x): where trials have no GPU, auto stacks only these.
CPU_STACKED_MODELS = ("abcnn",)


class Domain(StrictModel):
    """One hyperparameter's values: exactly one of grid / choice / uniform / loguniform / randint."""


    grid: list[Any] | None = None
    choice: list[Any] | None = None
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Domain:
        given = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of grid, choice, uniform, loguniform, randint "
                f"(got {', '.join(given) or 'none'})"
            )
        values = getattr(self, given[0])
        check_finite(list(values), given[0])
        if given[0] in ("grid", "choice") and not values:
            raise ValueError(f"{given[0]} must list at least one value")
        if given[0] in ("uniform", "loguniform", "randint") and not values[0] < values[1]:
            raise ValueError(f"{given[0]} needs [low, high] with low < high (got {list(values)})")
        if given[0] == "loguniform" and values[0] <= 0:
            raise ValueError(f"loguniform needs low > 0 (got {values[0]})")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in type(self).model_fields if getattr(self, k) is not None)

    @property
    def values(self) -> list[Any]:
        """Values that stand for the domain when it is checked against the training config."""
        return list(getattr(self, self.kind))


class SchedulerConfig(StrictModel):

    type: Literal["fifo", "asha", "median"] = "fifo"
    grace_period: int = Field(1, ge=1, description="epochs before ASHA/median may stop a trial")
    reduction_factor: float = Field(3.0, gt=1)


class Resources(StrictModel):

    cpu: float = Field(1.0, gt=0)
    gpu: float = Field(0.0, ge=0, description="fractional GPUs pack trials: 0.25 = 4 per GPU")


class ProtocolConfig(StrictModel):
    """How the selected configuration is tested."""

    refit_on_train_dev: bool = Field(
        False,
        description="retrain the selected configuration on train + dev for its best epoch count, "
        "then test once on the final weights (Yin et al. §5.4); default: test the best-dev weights",
    )


class SearchConfig(StrictModel):

    sampler: Literal["grid", "random", "tpe", "cmaes", "nsga2"] = "grid"
    space: dict[str, Domain] = Field(default_factory=dict)
    configurations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="model-argument sets crossed with the space (e.g. k=116 two LSTMs, k=100 shared)",
    )
    seeds: list[int] = Field(default_factory=lambda: [1], min_length=1)
    num_samples: int = Field(1, ge=1, description="configurations drawn by random/tpe/cmaes")
    sampler_seed: int = 0
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    # The Tune result key the search optimises and its schedulers compare (ray_trial.epoch_metrics).
    metric: Literal[rs.METRIC_DEV_ACCURACY, rs.METRIC_DEV_LOSS] = rs.METRIC_DEV_ACCURACY
    mode: Literal["max", "min"] = "max"
    objectives: list[Any] = Field(
        default_factory=list,
        description="two or more NAME: max|min searched together (a Pareto front), e.g. "
        "[dev_accuracy: max, theta_m: min]; the test evaluation still follows the one dev rule "
        "(results.selection.SELECTION_RULE)",
    )
    max_concurrent_trials: int | None = Field(None, ge=1)
    time_budget_s: float | None = Field(None, gt=0)
    resources: Resources = Field(default_factory=Resources)
    max_failures: int = Field(1, ge=0, description="retries of a failed trial from its checkpoint")
    tracking_uri: str | None = None
    storage_path: str | None = None
    protocol: ProtocolConfig = Field(default_factory=ProtocolConfig)
    stack: Literal["off", "auto"] | int = Field(
        "off",
        description="train configurations that differ only in lr, l2, adagrad_accumulator, "
        "dropout or seed as one stacked model per trial (nli_models.stacked: a grid's points, or an "
        "Optuna sampler's proposals drawn a stack at a time; where trials have no GPU "
        "'auto' stacks only ABCNN, whose stacks measured faster there, and keeps seeds apart): 'auto' stacks up to "
        f"{AUTO_STACK_SIZE} where the model and training allow it, N up to N (refused where they "
        "do not), 'off' one configuration per trial",
    )

    @field_validator("stack", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false

    @field_validator("stack")
    @classmethod
    def _stack_size(cls, value: str | int) -> str | int:
        if isinstance(value, int) and value < 2:
            raise ValueError(f"a stack has 2 or more members (got {value}); use off for one per trial")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SearchConfig:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct (got {self.seeds})")
        for name, domain in self.space.items():
            if self.sampler == "grid" and domain.kind != "grid":
                raise ValueError(
                    f"space.{name}: sampler 'grid' takes only grid values; "
                    f"use sampler random, tpe or cmaes for {domain.kind}"
                )
            if self.sampler != "grid" and domain.kind == "grid":
                raise ValueError(
                    f"space.{name}: grid values need sampler: grid (Tune's grid_search cannot be "
                    f"combined with Optuna); use choice: [...] with sampler {self.sampler!r}"
                )
        if self.objectives:
            self._check_objectives()
        return self

    @property
    def objective_directions(self) -> list[tuple[str, str]]:
        """search.objectives as (name, max|min) pairs, in the spec's order (empty: one metric)."""
        return [next(iter(item.items())) for item in self.objectives]

    def _check_objectives(self) -> None:
        allowed = ", ".join(OBJECTIVE_METRICS)
        for i, item in enumerate(self.objectives):
            if not isinstance(item, dict) or len(item) != 1:
                raise ValueError(
                    f"objectives[{i}]: write one NAME: max|min per entry, e.g. "
                    f"[dev_accuracy: max, theta_m: min] (got {item!r})"
                )
            name, direction = next(iter(item.items()))
            if name not in OBJECTIVE_METRICS:
                raise ValueError(f"objectives[{i}]: unknown objective {name!r}; allowed: {allowed}")
            if direction not in ("max", "min"):
                raise ValueError(f"objectives[{i}].{name}: direction {direction!r}; allowed: max, min")
        names = [name for name, _ in self.objective_directions]
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(
                f"objectives: give two or more distinct objectives (got {names}); one objective "
                "is search.metric and search.mode"
            )
        if {"metric", "mode"} & self.model_fields_set:
            raise ValueError("metric/mode: give either search.metric and search.mode or search.objectives")
        if self.sampler == "cmaes":
            raise ValueError(
                "sampler: 'cmaes' (Optuna's CMA-ES) optimises one objective; with objectives use "
                "grid, random, tpe or nsga2"
            )
        if self.scheduler.type != "fifo":
            raise ValueError(
                f"scheduler.type: {self.scheduler.type!r} stops trials on one metric; with "
                "objectives use fifo (every trial runs to its end, so each objective is its final value)"
            )
        if self.sampler != "grid" and len(self.seeds) > 1:
            raise ValueError(
                f"seeds: with objectives, sampler {self.sampler!r} takes one seed (Ray Tune's "
                "Repeater, which runs a sampled configuration once per seed, averages one metric); "
                f"give one seed, or use sampler grid (got {self.seeds})"
            )


class SweepSpec(RunConfig):
    search: SearchConfig = Field(default_factory=SearchConfig)
    # The command's --tracking-uri: where the sweep is recorded, not what it computes, so it is
    # kept out of the spec's fields (and of spec_hash, the spec artifact and the overrides).
    _tracking_uri_option: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _device_within_resources(self) -> SweepSpec:
        # A trial sees only the GPUs Ray gives it (ray_trial.trial_device).
        if self.training.device.startswith("cuda") and not self.search.resources.gpu:
            raise ValueError(
                f"training.device {self.training.device!r} needs search.resources.gpu > 0: a trial "
                "sees only the GPUs Ray gives it; set resources.gpu (e.g. 1, or 0.25 to pack 4 "
                "trials per GPU) or leave training.device: auto"
            )
        return self

    @property
    def tracking_uri(self) -> str:
        return resolve_tracking_uri(self._tracking_uri_option, self.search.tracking_uri)

    @property
    def storage_path(self) -> str:
        return self.search.storage_path or str(Path("ray_results").resolve())

    def base_config(self) -> RunConfig:
        # exclude_unset: validators that ask which fields a file set (model_fields_set) must
        # see the same fields again.
        return RunConfig.model_validate(self.model_dump(exclude={"search"}, exclude_unset=True))

    def spec_hash(self) -> str:
        """What the sweep searches, as nli.spec_hash: a --resume under another hash is warned
        about. Not the time budget: each run of the driver applies the one it is given (a resume
        may give more time; the hint after a budget too short for an epoch says to)."""
        text = json.dumps(self.model_dump(mode="json", exclude={"search": {"time_budget_s"}}), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def grid_size(self) -> int:
        """Configurations before seeds (grid: the product of the grids; else num_samples)."""
        per_arch = max(len(self.search.configurations), 1)
        if self.search.sampler == "grid":
            return per_arch * math.prod(len(d.values) for d in self.search.space.values())
        return self.search.num_samples

    def num_trials(self) -> int:
        return self.grid_size() * len(self.search.seeds)

    def trial_slots(self, cpus: float, gpus: float) -> int:
        """The Tune trials (a stack is one) that run at once on `cpus` CPUs and `gpus` GPUs: what
        one asks for (search.resources) against them, capped by max_concurrent_trials."""
        resources, slots = self.search.resources, math.floor(cpus / self.search.resources.cpu)
        slots = min(slots, math.floor(gpus / resources.gpu)) if resources.gpu > 0 else slots
        return min(slots, self.search.max_concurrent_trials or slots)

    def stacking(self, slots: int | None = None) -> tuple[int, str | None]:
        """The most configurations one trial trains as a stack (search.stack; 1: one per trial)
        and, where search.stack asked for stacks that this sweep cannot have, why. With `slots`
        (trial_slots where the sweep runs), auto's stacks are no larger than fills them all:
        ceil(trials / slots), at least 2, at most AUTO_STACK_SIZE."""
        asked = self.search.stack
        if asked == "off":
            return 1, None
        why = stack_refusal(self.model.name, self.training)
        if why is None and (apart := self.sampled_apart()):
            why = (f"sampler {self.search.sampler!r} searches {', '.join(apart)}, which a stack's members "
                   f"cannot differ in (they differ only in {', '.join(MEMBER_FIELDS)}; a grid over it stacks "
                   "each of its values apart)")
        if why is None and asked == "auto" and not self.trains_on_gpus() and self.model.name not in CPU_STACKED_MODELS:
            why = (f"trials without a GPU: of the models, only {', '.join(CPU_STACKED_MODELS)} trains faster "
                   "stacked on a CPU (benchmarks/README.md, stacking); set search.stack: N to stack anyway")
        if why is not None:
            return 1, why
        if asked != "auto":
            return asked, None
        return (max(2, min(AUTO_STACK_SIZE, math.ceil(self.num_trials() / slots))) if slots else AUTO_STACK_SIZE), None

    def sampled_apart(self) -> list[str]:
        """What an Optuna sampler's proposals may differ in that a stack's members cannot: the
        names it searches (search.space, and those whose values differ between
        search.configurations) but MEMBER_FIELDS. A sampler's stacks take its proposals as it
        draws them (ray_adapter.stacks.StackProposals), so it stacks only where this is empty.
        Empty for the grid, whose points are grouped by what they share."""
        if self.search.sampler == "grid":
            return []
        configurations = self.search.configurations
        names = set(self.search.space) | {
            name for configuration in configurations for name in configuration
            if len({json.dumps(c.get(name), sort_keys=True) for c in configurations}) > 1}
        return sorted(names - set(MEMBER_FIELDS))

    def trains_on_gpus(self) -> bool:
        """Whether the sweep's trials train on GPUs (resources.gpu > 0, training.device not cpu)."""
        return self.search.resources.gpu > 0 and self.training.device != "cpu"

    def stacks_seeds(self) -> bool:
        """Whether a configuration's seeds join one stack. Members of several seeds train on
        batches of their own, which run the models' off-CPU path (padded, dense): on a GPU the
        padding costs few launches (not yet measured there: gpu_check's stacking rows), on a CPU
        it measured 0.51x (decomposable) and 0.86x (ABCNN-3) of separate trials where one seed's
        stack measured 0.79x and 1.72x (benchmarks/README.md, stacking). So ``auto`` stacks seeds
        where the trials train on GPUs (``trains_on_gpus``), and ``N`` always."""
        if self.search.stack != "auto":
            return True
        return self.trains_on_gpus()

    def stacked_fields(self) -> tuple[str, ...]:
        """The flat hyperparameters a stack's members may differ in (``stacks_seeds``: the seed
        among them or not)."""
        return tuple(name for name in MEMBER_FIELDS if name != "seed" or self.stacks_seeds())


def apply_hyperparameters(
    base: RunConfig, params: dict[str, Any], source: str = "trial config"
) -> RunConfig:
    """The training config of one trial: `lr`, `l2`, ... go to training, `variant` to the model,
    everything else to the model's constructor arguments. Validated like a config file."""
    raw = base.model_dump(exclude_unset=True)
    for key, value in params.items():
        if key in TRAINING_KEYS or key == "seed":
            raw.setdefault("training", {})[key] = value
        elif key == "variant":
            raw["model"]["variant"] = value
        else:
            raw["model"].setdefault("args", {})[key] = value
    return validate_config(RunConfig, raw, source)


def _check_space(spec: SweepSpec, source: str) -> None:
    base = spec.base_config()
    allowed_model_args = set(model_arguments(base.model.name)) - {"vocab_size", "num_classes"}
    allowed = sorted(TRAINING_KEYS | allowed_model_args)
    named = [(f"search.space.{k}", k) for k in spec.search.space]
    for i, configuration in enumerate(spec.search.configurations):
        named += [(f"search.configurations[{i}].{k}", k) for k in configuration]
    for path, key in named:
        if key in RESERVED_KEYS:
            raise ConfigError(f"{source}: {path}: {key!r} cannot be searched here (seeds go in search.seeds)")
        if key not in TRAINING_KEYS and key not in allowed_model_args:
            raise ConfigError(
                f"{source}: {path}: unknown hyperparameter {key!r} for model "
                f"{base.model.name!r}; allowed: {', '.join(allowed)}"
            )
    try:  # the file's own model block first, so its errors are reported under model(.args)
        base.model.check()
    except ValueError as exc:
        variant = isinstance(exc, ModelArgumentError) and exc.argument == "variant"
        raise ConfigError(f"{source}: {'model' if variant else 'model.args'}: {exc}") from None
    checks: list[tuple[str, dict[str, Any]]] = []
    for key, domain in spec.search.space.items():
        for i, value in enumerate(domain.values):
            checks.append((f"search.space.{key}.{domain.kind}[{i}]", {key: value}))
    for i, configuration in enumerate(spec.search.configurations):
        checks.append((f"search.configurations[{i}]", configuration))
    for seed in spec.search.seeds[:1]:
        checks.append(("search.seeds", {"seed": seed}))
    for path, params in checks:
        try:
            apply_hyperparameters(base, params, source=f"{source}: {path} ->").model.check()
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{source}: {path}: {exc}") from None


def load_spec(
    path: str | Path, overrides: Overrides | None = None, tracking_uri: str | None = None
) -> SweepSpec:
    """Read, override (`--set`, `--data-dir`) and validate a spec. `tracking_uri` (the CLI's
    --tracking-uri) must agree with search.tracking_uri when the spec names one."""
    raw = read_config_mapping(path, overrides)
    source = source_name(path, overrides)
    spec = validate_config(SweepSpec, raw, source)
    resolve_tracking_uri(tracking_uri, spec.search.tracking_uri, source)  # a conflict is bad input
    spec._tracking_uri_option = tracking_uri
    if spec.data.data_dir is not None and not spec.data.data_dir.is_absolute():
        # Relative to where the sweep is started; trial configs saved with checkpoints are
        # read back from elsewhere.
        spec.data.data_dir = expand_user(spec.data.data_dir, f"{source}: data.data_dir").resolve()
    _check_space(spec, source)
    size, why = spec.stacking()
    if isinstance(spec.search.stack, int) and why is not None:
        raise ConfigError(f"{source}: search.stack: {spec.search.stack} asks for stacks, but {why}; "
                          "use auto (stacks where the sweep allows) or off")
    return spec


def effective_spec_text(path: str | Path, overrides: Overrides | None = None) -> str:
    """The spec a sweep runs, as YAML: the file as written, or with the overrides applied (what
    is logged as the parent run's spec artifact, so the artifact reproduces the sweep)."""
    if not overrides:
        return Path(path).read_text()
    return yaml.safe_dump(read_config_mapping(path, overrides), sort_keys=False, allow_unicode=True)


def grid_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every grid configuration (for `validate` and tests; the sweep itself uses Tune's grid)."""
    keys = list(spec.search.space)
    combos = list(itertools.product(*(spec.search.space[k].values for k in keys)))
    architectures = spec.search.configurations or [{}]
    return [{**arch, **dict(zip(keys, combo, strict=True))} for arch in architectures for combo in combos]


def logged_params(config: RunConfig) -> dict[str, Any]:
    """Every hyperparameter of a trial under one flat, model-independent naming (lr, dropout, l2,
    hidden_size, batch_size, model, variant, seed, ...), constructor defaults filled in."""
    defaults = {
        k: v
        for k, v in model_arguments(config.model.name).items()
        if k not in ("vocab_size", "num_classes") and v is not inspect.Parameter.empty
    }
    training = config.training.model_dump(exclude=EXECUTION_KEYS)
    return {
        "model": config.model.name,
        "variant": config.model.variant or defaults.pop("variant", None),
        **defaults,
        **config.model.args,
        **training,
    }


def config_key(params: dict[str, Any]) -> str:
    """Identifies a hyperparameter configuration across its seeds."""
    text = json.dumps({k: v for k, v in params.items() if k != "seed"}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
