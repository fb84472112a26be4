"""Benchmarks of nli-orchestrator (not tests): `python -m benchmarks.run [NAME ...] [--quick]`.

Each benchmark is a module with ``NAME``, ``TITLE`` and ``run(ctx) -> dict``; the runner writes
``benchmarks/out/<NAME>.json`` and regenerates ``benchmarks/out/summary.md`` from every JSON there.
See benchmarks/README.md for what each one measures and the latest numbers.
"""

# Run order of `python -m benchmarks.run` (and `make bench`). plain_optuna compares against the
# sweep_efficiency result of the same run, so it comes after it. search_efficiency is opt-in
# (--with-search, or name it): grid + 3 ASHA/TPE sweeps take ~11 min quiet, more under load.
DEFAULT_BENCHMARKS = (
    "throughput", "public_setup", "bucketing", "preprocessing", "sweep_efficiency", "plain_optuna", "scaling",
)
# The scale set (--scale, or name them): a simulated 16-node cluster and a shared tracking server
# under load, tens of minutes and most of the machine's memory; the end-of-sweep analysis at up to
# 10,000 trials (a minute).
SCALE_BENCHMARKS = ("scale_cluster", "scale_tracking", "scale_analysis")
# omp_policy (name it): ACTIVE against PASSIVE in fresh processes, alone and oversubscribed; its
# spinning cells crawl on a busy machine (13 min on this 2-core one at load average 16-43).
# A real reproduction (Yin et al. on SICK, 8 configurations, refit on train + dev): ~40 min on a
# shared 2-core machine; only when named.
REPRODUCTION_BENCHMARKS = ("reproduce_sick",)
# replay (name it): records a 36-trial toy grid with `orchestrate sweep` (minutes), then times
# `orchestrate replay` of it (seconds).
# sweep_cpu (name it): the CPU of one small sweep by process, 3 sweeps (a minute or two).
# static_shapes (name it): the padding that CUDA graphs' static batch shapes cost (seconds).
# stacking (name it): 8 configurations stacked against 8 separate trials, ABCNN-3 and decomposable
# on SICK (a few minutes on a shared 2-core machine).
# stacked_sweep (name it): the ABCNN-3 grid of stacking through `orchestrate sweep`, stack off / 8 / 4,
# twice each (about 10 minutes on a 2-core machine).
OPT_IN_BENCHMARKS = ("search_efficiency", "omp_policy", "replay", "sweep_cpu", "static_shapes", "stacking",
                     "stacked_sweep",
                     *SCALE_BENCHMARKS,
                     *REPRODUCTION_BENCHMARKS)
ALL_BENCHMARKS = DEFAULT_BENCHMARKS + OPT_IN_BENCHMARKS
