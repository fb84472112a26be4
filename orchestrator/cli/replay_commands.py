"""`orchestrate replay EXPERIMENT`: a completed sweep as a tabular benchmark of search strategies
(orchestrator/sweep/replay.py). Everything is computed before the first file is written: bad input
(exit 2) leaves no output behind."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import click

from nli_models.errors import InputError
from orchestrator.cli.options import tracking_uri_option
from results.formats import SUFFIXES

SAMPLERS = ("grid", "random", "tpe", "cmaes", "nsga2")  # orchestrator.sweep.spec.SearchConfig.sampler
SCHEDULERS = ("fifo", "asha", "median")  # orchestrator.sweep.spec.SchedulerConfig.type
BUDGET_KINDS = {"trials": int, "epochs": int, "seconds": float}


def parse_budget(items: tuple[str, ...]) -> dict[str, float]:
    """`--budget trials=36 --budget seconds=3600` -> {"trials": 36, "seconds": 3600.0}."""
    allowed = "trials=N (trials proposed), epochs=N (trial-epochs), seconds=S (simulated)"
    budget: dict[str, float] = {}
    for item in items:
        kind, _, text = item.partition("=")
        convert = BUDGET_KINDS.get(kind.strip())
        try:
            value = convert(text) if convert else None
        except ValueError:
            value = None
        if value is None or not value > 0 or kind.strip() in budget or value == float("inf"):
            raise InputError(f"--budget {item!r}: give each of {allowed} at most once, > 0")
        budget[kind.strip()] = value
    return budget


@click.command("replay")
@click.argument("experiment")
@click.option("--sampler", "samplers", multiple=True, type=click.Choice(SAMPLERS),
              help="sampler(s) to replay (repeatable; default: every one the recorded space "
                   "allows: grid only for a grid)")
@click.option("--scheduler", "schedulers", multiple=True, type=click.Choice(SCHEDULERS),
              help="scheduler(s) to replay (repeatable; default: all); every sampler is paired "
                   "with every scheduler, with the recorded spec's grace period and reduction factor")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True,
              help="replays of each strategy, with sampler seeds 0..N-1")
@click.option("--budget", "budget_items", multiple=True, metavar="KIND=VALUE",
              help="trials=N (default: the recorded sweep's trials), epochs=N (trial-epochs), "
                   "seconds=S (simulated; default: the spec's time_budget_s); repeatable, the "
                   "first to run out ends a replay")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="strategy table (.parquet); beside it STEM.runs.parquet (one row per replay) "
                   "and STEM.png (the figure)")
@click.option("--format", "fmt", type=click.Choice(list(SUFFIXES)),
              help="also write the strategy table to OUT with suffix .md, .csv or .tex")
@tracking_uri_option
def replay_command(experiment: str, samplers: tuple[str, ...], schedulers: tuple[str, ...],
                   repeats: int, budget_items: tuple[str, ...], out: Path, fmt: str | None,
                   tracking_uri: str | None) -> None:
    """Replay EXPERIMENT's latest completed sweep as a tabular benchmark: each configuration's
    recorded dev curve and epoch times stand in for training, and each strategy (sampler +
    scheduler) runs through the sweep's own searcher and scheduler on a simulated clock. Prints
    the strategy table; writes it, the per-replay table and a figure of the best dev accuracy so
    far against simulated time and trial-epochs."""
    from nli_models.outputs import check_output_path

    if out.suffix != ".parquet":
        raise InputError(f"--out {out}: must end in .parquet")
    budget = parse_budget(budget_items)
    files = _files(out, fmt)
    for path in files:
        check_output_path(path, "--out")
    started, cpu = time.perf_counter(), time.process_time()
    outputs, notes = _compute(experiment, samplers, schedulers, repeats, budget, tracking_uri, out, fmt)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    from results.atomic_files import write_output

    for path, content in outputs:
        write_output(path, content)
    for note in notes:
        click.echo(note)
    click.echo(f"read and replayed in {seconds:.1f} s ({cpu:.1f} s CPU); wrote "
               f"{', '.join(str(p) for p, _ in outputs)}")


def _files(out: Path, fmt: str | None) -> list[Path]:
    extra = [out.with_suffix(SUFFIXES[fmt])] if fmt else []
    return [out, out.with_suffix(".runs.parquet"), out.with_suffix(".png"), *extra]


def _compute(experiment, samplers, schedulers, repeats, budget, tracking_uri, out, fmt):
    from mlflow.exceptions import MlflowException

    from nli_models.config import validate_config
    from nli_models.strict import load_yaml
    from orchestrator.sweep.replay import (
        Budget,
        Strategy,
        check_replayable,
        recorded_trials,
        replay,
        searched_names,
        strategy_spec,
    )
    from orchestrator.sweep.spec import SweepSpec
    from results.figures import figure_bytes
    from results.render import render
    from results.replay_record import read_recording, recorded_test_accuracy
    from results.replay_report import (
        plot_replay,
        run_rows,
        runs_table,
        strategy_table,
        strategy_view,
    )
    from results.run_reader import open_client
    from results.tracking_uri import resolve_tracking_uri

    try:
        client = open_client(resolve_tracking_uri(tracking_uri))
        record = read_recording(client, experiment)
    except MlflowException as exc:
        raise click.ClickException(f"reading the tracking store failed: {exc}") from None
    where = f"{experiment}: sweep {record.parent_run_id}"
    spec = validate_config(SweepSpec, load_yaml(record.spec_text), f"{where}: spec.yaml")
    check_replayable(spec, where)
    grid = all(domain.kind == "grid" for domain in spec.search.space.values())
    chosen = samplers or tuple(s for s in SAMPLERS if grid or s != "grid")
    strategies = [Strategy(a, b) for a, b in itertools.product(chosen, schedulers or SCHEDULERS)]
    for strategy in strategies:  # a sampler the space cannot take fails before any replay runs
        strategy_spec(spec, strategy, 0)
    limits = Budget(
        trials=int(budget.get("trials", spec.num_trials())),
        epochs=int(budget["epochs"]) if "epochs" in budget else None,
        seconds=budget.get("seconds", spec.search.time_budget_s),
    )
    slots = spec.search.max_concurrent_trials or record.concurrency
    keyed = recorded_trials(spec, list(record.trials))
    runs = [replay(spec, keyed, strategy, seed, limits, slots)
            for strategy in strategies for seed in range(repeats)]
    names = [n for n in searched_names(spec) if n != "seed"]
    best = next((t for t in record.trials if t.run_id == record.best_run_id), None)
    rows = run_rows(runs, names, best.config_key if best else None,
                    lambda ids: recorded_test_accuracy(client, ids))
    metadata = {"experiment": experiment, "sweep_run_id": record.parent_run_id, "slots": slots,
                "budget": {k: v for k, v in vars(limits).items() if v is not None}}
    table = strategy_table(rows, **metadata)
    view = strategy_view(table)
    outputs: list[tuple[Path, object]] = [
        (out, table),
        (out.with_suffix(".runs.parquet"), runs_table(rows, **metadata)),
        (out.with_suffix(".png"), figure_bytes(plot_replay(runs, f"replay of {experiment}"), "png")),
    ]
    if fmt:
        outputs.append((out.with_suffix(SUFFIXES[fmt]), render(view, fmt)))
    notes = [
        f"sweep {record.parent_run_id} of {experiment!r}: {len(record.trials)} finished trial runs"
        f" replayable ({record.unusable} without a finished curve); {slots} trials at once; budget "
        + ", ".join(f"{k} {v:g}" for k, v in metadata["budget"].items())
        + f"; {len(strategies)} strategies x {repeats} repeats",
        render(view, "md").rstrip("\n"),
    ]
    if any(s.sampler == "cmaes" for s in strategies) and grid:
        notes.insert(1, "note: CMA-ES samples only numeric ranges; a grid's values are categorical, "
                        "which Optuna's CmaEsSampler draws with its independent sampler (random)")
    return outputs, notes
