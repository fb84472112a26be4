"""`orchestrate validate`: the resolved plan of a sweep, printed without running anything, and
the checks of a sweep's input that `validate` and `sweep` share."""

from __future__ import annotations

from nli_models.cpus import usable_cpus
from nli_models.data import PreparedData, prepare_data
from nli_models.errors import InputError, mask_secrets
from nli_models.training import check_fits_data
from orchestrator.ray_address import check_ray_address
from orchestrator.spec import SweepSpec, apply_hyperparameters
from results.tracking_uri import check_tracking_uri, unreachable_message, unreachable_store


def check_input(spec: SweepSpec, address: str | None = None) -> PreparedData:
    """Every check of a loaded spec's input that writes nothing, as `sweep` runs it before its
    first write and `validate` runs it too: the Ray address (--address or RAY_ADDRESS) answers,
    the data and vectors are read, and the model of every configuration and searched value fits
    them (e.g. model.args.embedding_dim against the vectors' dimension), and the tracking store
    answers (probed without creating it: a new local store is created by `sweep` only). Returns
    the data."""
    check_ray_address(address)
    check_tracking_uri(spec.tracking_uri)
    unreachable = unreachable_store(spec.tracking_uri)
    if unreachable is not None:
        raise InputError(unreachable_message(spec.tracking_uri, unreachable))
    data = prepare_data(spec.data)
    base = spec.base_config()
    searched = [{key: value} for key, domain in spec.search.space.items() for value in domain.values]
    for configuration in spec.search.configurations or [{}]:
        for params in [{}, *searched]:
            check_fits_data(apply_hyperparameters(base, {**configuration, **params}), data)
    return data


def check_local_capacity(spec: SweepSpec) -> None:
    """InputError when one trial asks for more than this machine gives a local sweep's Ray (the
    CPUs this process may use, the CUDA devices): `validate`, and `sweep` without --address before
    it starts Ray or creates a store (ray_adapter.check_resources, from Ray's nodes, would refuse
    it after). Torch loads only when a trial asks for GPUs."""
    resources = spec.search.resources
    cpus = usable_cpus()
    gpus = 0
    if resources.gpu:
        import torch

        gpus = torch.cuda.device_count()
    if resources.cpu > cpus or resources.gpu > gpus:
        raise InputError(
            f"search.resources: a trial asks for {resources.cpu:g} CPU and {resources.gpu:g} GPU, "
            f"but this machine gives a local sweep {cpus} CPU and {gpus} GPU; lower "
            "search.resources, or run it on a cluster: a Ray cluster (`sweep --address`, or "
            "RAY_ADDRESS) or SLURM (`submit --slurm`; `validate --slurm-nodes/--slurm-cpus-per-task/"
            "--slurm-gpus-per-node` checks an allocation)"
        )


def describe_plan(spec: SweepSpec, data: PreparedData | None = None) -> str:
    """The plan; with ``data`` (check_input's), its split sizes and vectors too."""
    search = spec.search
    lines = [
        f"sweep {spec.name!r}: model {spec.model.name}"
        + (f"/{spec.model.variant}" if spec.model.variant else "")
        + f", corpus {spec.data.corpus}",
        f"  sampler {search.sampler}, scheduler {search.scheduler.type}, "
        + (
            "objectives " + ", ".join(f"{name} ({d})" for name, d in search.objective_directions)
            if search.objectives else f"metric {search.metric} ({search.mode})"
        ),
    ]
    if search.sampler == "grid":
        sizes = " x ".join(f"{k}[{len(d.values)}]" for k, d in search.space.items()) or "1"
        if search.configurations:
            sizes = f"configurations[{len(search.configurations)}] x {sizes}"
        lines.append(f"  grid: {sizes} = {spec.grid_size()} configurations")
    else:
        space = ", ".join(f"{k} {d.kind}{d.values}" for k, d in search.space.items())
        lines.append(f"  {search.num_samples} sampled configurations from: {space}")
    lines += [
        f"  seeds {search.seeds} -> {spec.num_trials()} trials",
        f"  resources per trial: {search.resources.cpu} CPU, {search.resources.gpu} GPU; "
        f"max concurrent: {search.max_concurrent_trials or 'as resources allow'}",
        f"  epochs per trial: {spec.training.epochs}; time budget: "
        f"{search.time_budget_s or 'none'}; retries from checkpoint: {search.max_failures}",
        f"  tracking: {mask_secrets(spec.tracking_uri)}; storage: {spec.storage_path}",
    ]
    if data is not None:
        lines.append(f"  data: {data.describe()}")
    return "\n".join(lines)
