"""Run the benchmarks: `python -m benchmarks.run [NAME ...] [--quick] [--with-search] [--scale]`.

Without names: every default benchmark (see benchmarks/__init__.py) in order; search_efficiency
only with --with-search or when named; omp_policy and replay only when named; the scale set (scale_cluster, scale_tracking, scale_analysis) only with --scale or when named;
reproduce_sick (Yin et al. on real SICK through the CLI) only when named. Each result goes to benchmarks/out/<NAME>.json; then
benchmarks/out/summary.md is rebuilt from all JSON files there (quick and full runs are labelled).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from benchmarks import ALL_BENCHMARKS, DEFAULT_BENCHMARKS, SCALE_BENCHMARKS
from benchmarks.common import (
    OUT_DIR,
    Context,
    Skip,
    busy_processes,
    loadavg,
    log,
    machine_info,
    setup_environment,
    write_json,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(ALL_BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a few minutes")
    parser.add_argument("--with-search", action="store_true", help="also run search_efficiency (~11 min quiet, ~25 min or more under load)")
    parser.add_argument("--scale", action="store_true", help="also run the scale set: a simulated cluster and a shared tracking server under load (needs PostgreSQL; ~30 min or more)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch folders (MLflow stores, Ray results)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ALL_BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(ALL_BENCHMARKS)}")
    return args


def run_one(name: str, ctx: Context) -> dict:
    module = importlib.import_module(f"benchmarks.{name}")
    meta = {"name": name, "title": module.TITLE, "quick": ctx.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "loadavg_start": loadavg(), "busy_processes_start": busy_processes()}
    log(f"== {name}: {module.TITLE}{' (quick)' if ctx.quick else ''}")
    started = time.perf_counter()
    try:
        result = module.run(ctx)
        status = "ok"
    except Skip as skip:
        result, status = {"reason": str(skip), "summary_md": f"Skipped: {skip}"}, "skipped"
        log(f"{name}: SKIPPED: {skip}")
    except Exception as error:  # a failed benchmark must not lose the others' results
        text = traceback.format_exc()
        result, status = {"error": text, "summary_md": f"FAILED: {error!r}"}, "failed"
        log(f"{name}: FAILED\n{text}")
    finally:
        ctx.cleanup()
    meta.update(seconds=round(time.perf_counter() - started, 1), loadavg_end=loadavg())
    data = {"status": status, "meta": meta, **result}
    write_json(ctx.out_dir / f"{name}.json", data)
    ctx.results[name] = data
    log(f"== {name}: {status} in {meta['seconds']:.0f}s")
    return data


def write_summary(out_dir: Path) -> Path:
    sections, targets = [], []
    for name in ALL_BENCHMARKS:
        path = out_dir / f"{name}.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        meta = data.get("meta", {})
        mode = "quick" if meta.get("quick") else "full"
        sections.append(
            f"## {name}: {meta.get('title', '')}\n\n"
            f"_{data.get('status')}, {mode} run, {meta.get('started')}, {meta.get('seconds')} s, "
            f"load average {meta.get('loadavg_start')} -> {meta.get('loadavg_end')}_\n\n{data.get('summary_md', '')}\n"
        )
        for t in data.get("targets", []):
            met = {True: "met", False: "MISSED", None: "n/a", "True": "met", "False": "MISSED"}.get(t.get("met"), "n/a")
            targets.append(f"| {name} | {t['target']} | {t['goal']} | {t['measured']} | {met} | {t.get('note', '')} |")
    machine = machine_info()
    header = (
        "# Benchmark summary\n\n"
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cpu_count')} CPUs, {machine.get('memory_gib')} GiB; "
        f"torch {machine['torch']}, Python {machine['python']}, commit {machine.get('git_commit')}.\n\n"
    )
    if targets:
        header += (
            "## Targets\n\n| benchmark | target | goal | measured | status | note |\n|---|---|---|---|---|---|\n"
            + "\n".join(targets) + "\n\n"
        )
    path = out_dir / "summary.md"
    path.write_text(header + "\n".join(sections))
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_environment()
    names = args.names or list(DEFAULT_BENCHMARKS) + (["search_efficiency"] if args.with_search else [])
    if args.scale:
        names += [n for n in SCALE_BENCHMARKS if n not in names]
    ctx = Context(quick=args.quick, out_dir=args.out, keep_work=args.keep_work)
    started = time.perf_counter()
    log(f"benchmarks: {', '.join(names)}{' (quick)' if args.quick else ''}; output in {args.out}")
    statuses = {name: run_one(name, ctx)["status"] for name in names}
    summary = write_summary(args.out)
    total = time.perf_counter() - started
    write_json(args.out / "last_run.json", {"names": names, "quick": args.quick, "seconds": round(total, 1),
                                            "statuses": statuses, "machine": machine_info()})
    log(f"done in {total / 60:.1f} min: " + ", ".join(f"{k} {v}" for k, v in statuses.items()) + f"; summary: {summary}")
    return 1 if "failed" in statuses.values() else 0


if __name__ == "__main__":
    sys.exit(main())
