"""`orchestrate validate`: the resolved plan of a sweep, printed without running anything, and
the checks of a sweep's input that `validate` and `sweep` share."""

from __future__ import annotations

from nli_models.cpus import usable_cpus
from nli_models.data import PreparedData, prepare_data
from nli_models.errors import InputError, mask_secrets
from nli_models.training import check_fits_data
from orchestrator.cluster.ray_address import check_ray_address
from orchestrator.sweep.spec import SweepSpec, apply_hyperparameters
from results.tracking_uri import check_tracking_uri, unreachable_message, unreachable_store

# The GPU `validate` sizes packing for when it runs without one (an H100's 80 GiB).
REFERENCE_GPU_BYTES = 80 * 2**30


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


def largest_configurations(spec: SweepSpec) -> list[dict]:
    """Per configuration of the spec, every searched domain at its largest value (numbers; the
    first value of others): the trial that needs the most memory of each architecture."""
    def largest(values):
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        return max(numbers) if numbers else values[0]

    searched = {key: largest(domain.values) for key, domain in spec.search.space.items()}
    return [{**configuration, **searched} for configuration in spec.search.configurations or [{}]]


def describe_gpu_fit(spec: SweepSpec, data: PreparedData) -> str:
    """How many trials of the spec fit one GPU by memory, from the measured need of its largest
    trial (``nli_models.training.gpu_memory``), and what its ``resources.gpu`` packs."""
    import torch

    from nli_models.training import build_for_data
    from nli_models.training.gpu_memory import CUDA_CONTEXT_BYTES, training_step_memory

    train = data.splits["train"]
    lengths = int(train.premise_lengths.max()), int(train.hypothesis_lengths.max())
    needs = []
    for params in largest_configurations(spec):
        config = apply_hyperparameters(spec.base_config(), params)
        training = config.training
        needs.append(training_step_memory(build_for_data(config, data), training.optimizer,
                                          training.batch_size, *lengths))
    need = max(needs, key=lambda m: m.per_process)
    if torch.cuda.is_available():
        gpu_bytes, gpu = torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0)
    else:
        gpu_bytes, gpu = REFERENCE_GPU_BYTES, "an 80 GiB GPU (H100; no CUDA device here)"
    mib = 2**20
    lines = [
        f"  GPU memory per trial: {need.per_process / mib:,.0f} MiB (largest trial, measured: "
        f"weights {need.parameters / mib:,.0f}, gradients and optimizer state "
        f"{(need.gradients + need.optimizer_state) / mib:,.0f}, activations "
        f"{need.saved_activations / mib:,.0f} at lengths {lengths[0]}/{lengths[1]}; CUDA context "
        f"{CUDA_CONTEXT_BYTES // mib} assumed): {gpu_bytes // need.per_process} trials fit {gpu} by memory"
    ]
    share = spec.search.resources.gpu
    if 0 < share < 1:
        packed = round(1 / share, 6)
        verdict = "fits" if share * gpu_bytes >= need.per_process else "is TOO SMALL: raise resources.gpu"
        lines.append(f"  resources.gpu {share:g} packs {packed:g} trials per GPU, each capped at "
                     f"{share * gpu_bytes / mib:,.0f} MiB: {verdict}")
    return "\n".join(lines)


def check_local_capacity(spec: SweepSpec) -> None:
    """InputError when one trial asks for more than this machine gives a local sweep's Ray (the
    CPUs this process may use, the CUDA devices): `validate`, and `sweep` without --address before
    it starts Ray or creates a store (ray_runtime.check_resources, from Ray's nodes, would refuse
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


def describe_stacking(spec: SweepSpec, slots: int | None = None) -> str | None:
    """How search.stack trains the sweep's trials (None: it is off): on `slots` trial slots
    (SweepSpec.trial_slots) where they are known (a sweep's start), else as `validate` can say it."""
    size, why = spec.stacking(slots)
    if why is not None:
        return f"search.stack {spec.search.stack}: one configuration per trial ({why})"
    if size == 1:
        return None
    notes = []
    if spec.search.stack == "auto":
        notes.append(f"auto, for {slots} trial slot{'s' * (slots != 1)}" if slots else
                     "auto: fewer where the sweep's stacks would leave trial slots idle, at least 2")
    if not spec.stacks_seeds() and len(spec.search.seeds) > 1:
        notes.append("seeds apart: stacks of several seeds pay on GPUs, not on CPUs")
    noted = f" ({'; '.join(notes)})" if notes else ""
    sampler = spec.search.sampler
    drawn = "" if sampler == "grid" else (
        f"; the {sampler} sampler draws a stack's members together, before it is told their results")
    return (f"search.stack {spec.search.stack}: configurations that differ only in "
            f"{', '.join(spec.stacked_fields())} train as stacks of up to {size} members{noted}, one Tune trial "
            f"each; every member is its own trial and run{drawn}")


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
    if stacking := describe_stacking(spec):
        lines.append(f"  {stacking}")
    if data is not None:
        lines.append(f"  data: {data.describe()}")
    return "\n".join(lines)
