"""Search efficiency on real data: ASHA + TPE against the full grid — the trial-epochs each needs
to come within 0.5 points of the grid's best dev accuracy. Opt-in (`--with-search` or name it):
~23 minutes on 2 CPUs when the machine is quiet.

Data: SNLI dev minus a 10% premise holdout as train (8,861 pairs), the holdout as dev (981, used
for selection and for ASHA), SNLI test (9,824) for the selected configuration; GloVe 6B 50d,
fixed. Model: decomposable attention (vanilla), projection = hidden.

Grid (FIFO, every trial to the last epoch): lr {3e-4, 6e-4, 1e-3, 2e-3} x dropout {0, 0.1, 0.2,
0.3} x hidden {50, 100} = 32 configurations x 10 epochs = 320 trial-epochs (~7 min here).
ASHA + TPE: the same values as choices, 32 TPE samples, ASHA (grace 1 epoch, reduction factor 3,
max 10 epochs), 2 concurrent trials; repeated with sampler seeds 0-4, and the median is reported.
(An earlier 18-point grid, lr {3e-4, 1e-3, 3e-3} x dropout {0, 0.1, 0.2} x hidden {50, 100}, had a
single configuration within 0.5 points of its best: whether a search found that one needle
decided the result, and three sampler seeds gave a median of 13% in one run and 39% in the next.) Trial-epochs are
counted in the order the driver received the epoch results; "needed" is the count when the best
dev accuracy seen so far first reaches grid best - 0.5 points. The grid's own count (in its run
order) is given for reference. The grid's per-epoch dev accuracies also drive a replay
(`search_replay.py`) of the same ASHA + TPE for 100 sampler seeds, with and without skipping
repeated proposals and with grace periods 1-3. --quick: the toy corpus, a 4-point grid, 3 epochs,
one seed.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import Context, log, md_table, median, snli_data_block, target
from benchmarks.search_replay import epochs_to_reach, recorded_curves, replay
from benchmarks.sweeps import run_instrumented_sweep

NAME = "search_efficiency"
TITLE = "ASHA + TPE vs full grid on SNLI (decomposable attention)"
THRESHOLD = 0.005  # 0.5 points of accuracy
REPLAY_SEEDS = 100
AS_RUN = "grace 1, repeats skipped (as run)"
REPLAYS = {  # label -> (ASHA settings, repeated proposals skipped)
    AS_RUN: ({}, True),
    "grace 1, repeats trained": ({}, False),
    "grace 2, repeats skipped": ({"grace_period": 2}, True),
    "grace 3, repeats skipped": ({"grace_period": 3}, True),
}


def specs(ctx: Context) -> tuple[dict, dict, list[int]]:
    if ctx.quick:
        data = {"corpus": "toy", "toy": {"size": 900, "seed": 0}}
        args = {"embedding_dim": 16}
        space = {"lr": [0.001, 0.01], "hidden_size": [16, 32]}
        epochs, seeds = 3, [0]
    else:
        data = snli_data_block(ctx.require_snli())
        args = {}
        space = {"lr": [0.0003, 0.0006, 0.001, 0.002], "dropout": [0.0, 0.1, 0.2, 0.3],
                 "hidden_size": [50, 100]}
        epochs, seeds = 10, [0, 1, 2, 3, 4]
    base = {
        "model": {"name": "decomposable", "variant": "vanilla", "args": {**args, "dropout": 0.0}},
        "data": data,
        "training": {"optimizer": "adam", "lr": 0.001, "batch_size": 32, "epochs": epochs},
    }
    # hidden_size and projection_dim move together: configurations pair them.
    configurations = [{"hidden_size": h, "projection_dim": h} for h in space["hidden_size"]]
    other = {k: v for k, v in space.items() if k != "hidden_size"}
    common = {"seeds": [1], "max_concurrent_trials": 2, "resources": {"cpu": 1}}
    grid = {**base, "name": "bench-search-grid", "search": {
        "sampler": "grid", "space": {k: {"grid": v} for k, v in other.items()},
        "configurations": configurations, "scheduler": {"type": "fifo"}, **common}}
    n_points = len(configurations) * len([1 for _ in _product(other)])
    asha = {**base, "name": "bench-search-asha-tpe", "search": {
        "sampler": "tpe", "space": {k: {"choice": v} for k, v in other.items()},
        "configurations": configurations, "num_samples": n_points,
        "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 3}, **common}}
    return grid, asha, seeds


def _seeded(asha_spec: dict, seed: int, scheduler: dict | None = None) -> dict:
    search = {**asha_spec["search"], "sampler_seed": seed,
              "scheduler": {**asha_spec["search"]["scheduler"], **(scheduler or {})}}
    return {**asha_spec, "name": f"{asha_spec['name']}-{seed}", "search": search}


def _product(space: dict[str, list]) -> list[tuple]:
    import itertools

    return list(itertools.product(*space.values()))


def progress_curve(m: dict[str, Any]) -> list[tuple[int, float, float]]:
    """(cumulative trial-epochs, best dev accuracy so far, seconds since the sweep started) per
    epoch result, in the order the driver received them."""
    results = sorted((e for e in m["events"] if e["event"] == "result"), key=lambda e: e["time"])
    best, curve = -1.0, []
    for i, e in enumerate(results, start=1):
        best = max(best, float(e["dev_accuracy"] or 0.0))
        curve.append((i, best, e["time"] - m["started"]))
    return curve


def needed(curve: list[tuple[int, float, float]], threshold: float) -> tuple[int | None, float | None]:
    for epochs, best, seconds in curve:
        if best >= threshold:
            return epochs, seconds
    return None, None


def _selected_test(m: dict[str, Any]) -> float | None:
    """The sweep's test accuracy: the paper protocol's selected configuration (parent run)."""
    return (m.get("summary") or {}).get("test_accuracy")


def _compact(m: dict[str, Any]) -> dict[str, Any]:
    keep = ("wall_s", "phases_s", "training_s", "efficiency", "trials", "summary")
    out = {k: m[k] for k in keep}
    out["trials_detail"] = [{k: t[k] for k in ("params", "best_dev_accuracy", "test_accuracy", "early_stopped",
                                                 "epoch_time_s")} for t in m["mlflow_trials"]]
    return out


def run(ctx: Context) -> dict[str, Any]:
    grid_spec, asha_spec, seeds = specs(ctx)
    log(f"search_efficiency: grid sweep ({grid_spec['data']['corpus']}, {grid_spec['training']['epochs']} epochs)")
    grid = run_instrumented_sweep(grid_spec, ctx.work_dir("search-grid"))
    grid_curve = progress_curve(grid)
    grid_best = max(b for _, b, _ in grid_curve)
    grid_epochs = grid_curve[-1][0]
    threshold = grid_best - THRESHOLD
    grid_needed, grid_needed_s = needed(grid_curve, threshold)
    log(f"search_efficiency: grid best dev {grid_best:.4f} after {grid_epochs} trial-epochs, {grid['wall_s']:.0f} s")

    curves = recorded_curves(grid["events"])
    replayed = {
        label: [epochs_to_reach(replay(_seeded(asha_spec, seed, asha), curves, skip), threshold)
                for seed in range(REPLAY_SEEDS)]
        for label, (asha, skip) in REPLAYS.items()
    }
    log(f"search_efficiency: replayed ASHA+TPE over the grid's curves for {REPLAY_SEEDS} sampler seeds")

    runs = []
    for seed in seeds:
        spec = _seeded(asha_spec, seed)
        m = run_instrumented_sweep(spec, ctx.work_dir(f"search-asha-{seed}"))
        curve = progress_curve(m)
        epochs_needed, seconds_needed = needed(curve, threshold)
        runs.append({
            "sampler_seed": seed,
            "trial_epochs_total": curve[-1][0] if curve else 0,
            "trial_epochs_needed": epochs_needed,
            "seconds_needed": seconds_needed,
            "best_dev_accuracy": max((b for _, b, _ in curve), default=None),
            "selected_test_accuracy": _selected_test(m),
            "replayed_needed": replayed[AS_RUN][seed],
            "early_stopped": sum(t["early_stopped"] == "true" for t in m["mlflow_trials"]),
            "distinct_configs": len({tuple(sorted(t["params"].items())) for t in m["mlflow_trials"]}),
            "wall_s": m["wall_s"],
            "curve": curve,
            "sweep": _compact(m),
        })
        log(f"search_efficiency: ASHA+TPE seed {seed}: best dev {runs[-1]['best_dev_accuracy']:.4f}, "
            f"{runs[-1]['trial_epochs_total']} trial-epochs in {m['wall_s']:.0f} s, needed {epochs_needed}")

    result = {
        "grid_spec": grid_spec,
        "asha_spec": asha_spec,
        "grid": {**_compact(grid), "curve": grid_curve, "best_dev_accuracy": grid_best, "threshold": threshold,
                 "selected_test_accuracy": _selected_test(grid), "trial_epochs": grid_epochs,
                 "trial_epochs_needed": grid_needed, "seconds_needed": grid_needed_s},
        "asha_tpe": runs,
        "replay": {"sampler_seeds": REPLAY_SEEDS, "trial_epochs_needed": replayed},
    }
    result.update(render(result))
    return result


def render(result: dict[str, Any]) -> dict[str, Any]:
    """Targets, median fraction and the Markdown summary (also re-renders a stored JSON)."""
    grid, runs, grid_spec = result["grid"], result["asha_tpe"], result["grid_spec"]
    grid_epochs, grid_best = grid["trial_epochs"], grid["best_dev_accuracy"]
    reached = [r["trial_epochs_needed"] for r in runs]
    # A run that never came within 0.5 points counts as needing more than all its epochs.
    as_fraction = [(n / grid_epochs) if n is not None else float("inf") for n in reached]
    med_fraction = median(as_fraction)
    # Whether a search samples the grid's best configuration early is a matter of its sampler
    # seed: the target is read as the median search, and the share of seeds meeting it is shown.
    within = sum(f <= 1 / 3 for f in as_fraction)
    met = med_fraction <= 1 / 3
    rows = [("grid (FIFO)", "-", grid_epochs, grid["trial_epochs_needed"], "-", round(grid_best, 4),
             _fmt(grid.get("selected_test_accuracy")), round(grid["wall_s"]), 0)]
    for r in runs:
        rows.append(("ASHA+TPE", r["sampler_seed"], r["trial_epochs_total"], r["trial_epochs_needed"] or "never",
                     r["replayed_needed"] or "never", round(r["best_dev_accuracy"], 4),
                     _fmt(r["selected_test_accuracy"]), round(r["wall_s"]), r["early_stopped"]))
    replay_rows = []
    for label, needed_epochs in result["replay"]["trial_epochs_needed"].items():
        fractions = [(n / grid_epochs) if n is not None else float("inf") for n in needed_epochs]
        replay_rows.append((label, len(fractions), sum(n is not None for n in needed_epochs),
                            sum(f <= 1 / 3 for f in fractions), _fmt_frac(median(fractions))))
    summary = (
        f"Grid: {grid['trials']} configurations x {grid_spec['training']['epochs']} epochs = {grid_epochs} "
        f"trial-epochs, best dev accuracy {grid_best:.4f}; threshold {grid_best - THRESHOLD:.4f} (0.5 points below). "
        f"Corpus {grid_spec['data'].get('corpus')}; with SNLI's ~1,000 held-out dev pairs one standard error of an "
        f"accuracy is ~1.5 points, so 0.5 points is within the noise of the dev estimate itself. 'test acc.' is the "
        f"sweep's own result: the paper protocol's selected configuration (mean over the runs it treats as its "
        f"seeds).\n\n"
        + md_table(["search", "sampler seed", "trial-epochs run", "trial-epochs to within 0.5 pt", "same, replayed",
                    "best dev", "test acc. (selected)", "wall s", "trials stopped early"], rows)
        + f"\n\n**ASHA+TPE needed a median {_fmt_frac(med_fraction)} of the grid's trial-epochs** "
        f"(target <= 33.3%): " + ", ".join(f"seed {r['sampler_seed']}: {_fmt_frac(f)}" for r, f in zip(runs, as_fraction, strict=True))
        + ".\n\nReplayed over the grid's recorded curves (`search_replay.py`: the same searcher and scheduler, "
        "no start-up or timing noise), for many sampler seeds: as run (repeated proposals skipped, as every "
        "sweep does), with repeats trained (the sampler alone), and with longer ASHA grace periods:\n\n"
        + md_table(["ASHA+TPE replay", "sampler seeds", "came within 0.5 pt", "within 0.5 pt at <= 1/3 of the grid",
                    "median trial-epochs / grid"], replay_rows)
    )
    return {
        "median_fraction_of_grid": med_fraction,
        "targets": [target("ASHA+TPE vs grid", "within 0.5 pt of grid best at <= 1/3 of grid trial-epochs",
                           f"median {_fmt_frac(med_fraction)} of grid trial-epochs; {within} of {len(runs)} "
                           f"sampler seeds within 1/3", met,
                           "; ".join(f"seed {r['sampler_seed']}: {r['trial_epochs_needed']}/{grid_epochs}" for r in runs))],
        "summary_md": summary,
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _fmt_frac(x: float) -> str:
    return "never" if x == float("inf") else f"{x:.1%}"
