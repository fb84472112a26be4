"""The analysis a sweep logs at its end, on N stand-in finished trials: what each piece costs as N
grows to a cluster sweep's 10,000.

``orchestrator.sweep.driver._log_analysis`` builds, from the experiment's trial runs, the importance table
(Optuna's fANOVA and PED-ANOVA), the EVP table and four figures (importance, parallel coordinates,
EVP, learning curves of the top 5), each written as PNG, PDF and SVG. The scale_cluster benchmark
times the whole of it at N <= 1,000 inside a sweep; this one times each piece alone at N up to
10,000, on trials made here (a log-uniform lr, a uniform dropout, a uniform best dev accuracy; 3
epochs of dev accuracy for the learning curves), so that a cost growing faster than N shows as an
exponent, not as a linear fit's miss. No Ray, no MLflow store: the trials are what
``results.run_reader.load_trials`` returns.

    python -m benchmarks.run scale_analysis                       # N = 100, 1,000, 3,000, 10,000
    NLI_ANALYSIS_SIZES=100,1000 python -m benchmarks.run scale_analysis
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Context, log, md_table
from benchmarks.scale_support import power_fit

NAME = "scale_analysis"
TITLE = "The end-of-sweep analysis at 100-10,000 trials, piece by piece"

EXPERIMENT = "bench-analysis"
EPOCHS = 3


def standin_trials(n: int) -> list:
    from results.run_reader import TrialRun
    from results.selection import TrialRecord

    rng = random.Random(0)
    trials = []
    for i in range(n):
        record = TrialRecord(
            run_id=f"{i:032x}", config_key=f"config-{i}", model_config="decomposable/vanilla",
            params={"lr": 10 ** rng.uniform(-5, -1), "dropout": rng.uniform(0.0, 0.5), "seed": 1},
            best_dev_accuracy=rng.uniform(0.3, 0.9), seed=1, status="FINISHED",
        )
        trials.append(TrialRun(record=record, experiment=EXPERIMENT, parent_run_id="parent",
                               tagged_selected=False, metrics={"trial_time_s": rng.uniform(60, 180)},
                               corpus="snli", run_name=f"trial {i}"))
    return trials


def timed(pieces: dict[str, float], name: str, make):
    begun = time.perf_counter()
    value = make()
    pieces[name] = time.perf_counter() - begun
    return value


def measure(n: int) -> dict[str, Any]:
    """Each piece of ``results.analysis.analysis_files`` and the importance table, in seconds."""
    import pyarrow.compute as pc

    from results import analysis
    from results.evp import evp_table, plot_evp
    from results.figures import figure_files

    trials = standin_trials(n)
    pieces: dict[str, float] = {}
    importance = timed(pieces, "importance table", lambda: analysis.importance_table(trials))
    evp = timed(pieces, "EVP table", lambda: evp_table(trials))
    top = analysis.top_trials(trials, EXPERIMENT)
    histories = {t.record.run_id: [(e, t.record.best_dev_accuracy * e / EPOCHS) for e in range(1, EPOCHS + 1)]
                 for t in top}
    figures = {
        "importance figure": lambda: analysis.plot_importance(importance, EXPERIMENT),
        "parallel coordinates figure": lambda: analysis.plot_parallel_coordinates(trials, EXPERIMENT),
        "EVP figure": lambda: plot_evp(evp, "trials"),
        "learning curves figure": lambda: analysis.plot_learning_curves(top, histories, EXPERIMENT),
    }
    sizes = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, make in figures.items():
            files = timed(pieces, name, lambda make=make: figure_files(make(), Path(folder) / "figure.png"))
            sizes[name] = sum(len(content) for _, content in files)
    fanova = importance.filter(pc.equal(importance.column("evaluator"), "fanova"))
    return {"n": n, "seconds": pieces, "total_s": sum(pieces.values()), "figure_bytes": sizes,
            "fanova_trials": int(fanova.column("n_trials")[0].as_py()) if fanova.num_rows else None}


def run(ctx: Context) -> dict[str, Any]:
    sizes = tuple(int(s) for s in os.environ.get("NLI_ANALYSIS_SIZES", "").split(",") if s) or (
        (100, 1000) if ctx.quick else (100, 1000, 3000, 10000))
    runs = []
    for n in sizes:
        log(f"{NAME}: {n} trials")
        runs.append(measure(n))
        log(f"{NAME}: {n} trials, {runs[-1]['total_s']:.1f} s")
    names = list(runs[0]["seconds"])
    exponents = {name: power_fit([r["n"] for r in runs], [r["seconds"][name] for r in runs])["b"] for name in names}
    rows = [[name, *(f"{r['seconds'][name]:.2f}" for r in runs), f"{exponents[name]:.2f}"] for name in names]
    rows.append(["total", *(f"{r['total_s']:.1f}" for r in runs),
                 f"{power_fit([r['n'] for r in runs], [r['total_s'] for r in runs])['b']:.2f}"])
    table = md_table(["piece (seconds)", *(f"N = {r['n']:,}" for r in runs), "exponent b (t ~ N^b)"], rows)
    summary = (f"Stand-in finished trials; fANOVA saw {runs[-1]['fanova_trials']} of {runs[-1]['n']:,} "
               f"at the largest N. Each figure in PNG, PDF and SVG.\n\n{table}\n")
    return {"runs": runs, "exponents": exponents, "summary_md": summary}
