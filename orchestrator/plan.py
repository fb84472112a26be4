"""`orchestrate validate`: the resolved plan of a sweep, printed without running anything."""

from __future__ import annotations

from nli_models.data import prepare_data
from nli_models.errors import mask_secrets
from orchestrator.spec import SweepSpec


def describe_plan(spec: SweepSpec, read_data: bool = True) -> str:
    search = spec.search
    lines = [
        f"sweep {spec.name!r}: model {spec.model.name}"
        + (f"/{spec.model.variant}" if spec.model.variant else "")
        + f", corpus {spec.data.corpus}",
        f"  sampler {search.sampler}, scheduler {search.scheduler.type}, "
        f"metric {search.metric} ({search.mode})",
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
    if read_data:
        data = prepare_data(spec.data)
        lines.append(f"  data: {data.describe()}")
    return "\n".join(lines)
