"""One-time preprocessing cost of SNLI dev+test (first run vs cached run, with and without GloVe
vectors) and preprocessing time against corpus size.

Every measurement is one call of ``prepare_data`` in a fresh Python process (as `orchestrate`
runs it), timed inside that process; the import of nli_models.data is timed separately. "first"
= an empty cache folder, "cached" = the same folder again (the .npz written by the first run).
The first run is broken into the pipeline's steps by wrapping the functions of
nli_models.data.prepare. Sizes: real SNLI dev+test pairs written to a scratch JSONL outside the
repository (19,666 distinct pairs; 20k repeats the first 334), read as one train split.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    GLOVE,
    SNLI_DEV,
    SNLI_TEST,
    Context,
    Instrument,
    log,
    md_table,
    median,
    snli_data_block,
    spread,
)

NAME = "preprocessing"
TITLE = "Data preparation: first vs cached run, and time against corpus size"

STAGES = (
    "resolve_files", "cache_key", "load_arrays", "_from_arrays", "read_splits", "_tokenize_split",
    "Vocabulary.build", "_load_vectors", "build_embedding_init", "numericalize", "_to_arrays", "save_arrays",
)


def worker(config: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    started = time.perf_counter()
    import nli_models.data.prepare as prepare
    from nli_models.data import prepare_data
    from nli_models.data.text import Vocabulary

    import_s = time.perf_counter() - started
    with Instrument() as inst:
        for stage in STAGES:
            if stage == "Vocabulary.build":
                inst.wrap(Vocabulary, "build", stage)
            else:
                inst.wrap(prepare, stage, stage)
        t0 = time.perf_counter()
        data = prepare_data(config, cache_dir=cache_dir)
        total = time.perf_counter() - t0
    stages = {name: round(inst.total(name), 4) for name in STAGES if inst.count(name)}
    return {
        "seconds": total,
        "import_s": import_s,
        "from_cache": data.from_cache,
        "stages": stages,
        "other_s": round(total - sum(stages.values()), 4),
        "pairs": {name: len(split) for name, split in data.splits.items()},
        "vocab": len(data.vocab),
        "vector_coverage": data.vector_coverage,
    }


def run_worker(config: dict[str, Any], cache_dir: Path) -> dict[str, Any]:
    payload = json.dumps({"config": config, "cache_dir": str(cache_dir)})
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.preprocessing", "--worker", payload],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1],
    )
    if done.returncode != 0:
        raise RuntimeError(f"preprocessing worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the benchmark ------------------------------------------------------------------------------


def _write_pairs(sources: list[Path], count: int, path: Path) -> None:
    lines = [line for src in sources for line in src.read_text().splitlines() if line.strip()]
    chosen = [lines[i % len(lines)] for i in range(count)]
    path.write_text("\n".join(chosen) + "\n")


def run(ctx: Context) -> dict[str, Any]:
    data_dir = ctx.require_snli()
    repeats = 1 if ctx.quick else 3
    sizes = (1_000, 5_000) if ctx.quick else (1_000, 5_000, 20_000)
    work = ctx.work_dir(NAME)

    # 1. SNLI dev+test: first vs cached, with and without GloVe.
    snli: dict[str, dict[str, list[dict]]] = {}
    for vectors in (False, True):
        key = "glove" if vectors else "no_vectors"
        snli[key] = {"first": [], "cached": []}
        for rep in range(repeats):
            cache = work / f"cache-{key}-{rep}"
            for phase in ("first", "cached"):
                result = run_worker(snli_data_block(data_dir, vectors), cache)
                expected_cached = phase == "cached"
                if result["from_cache"] != expected_cached:
                    raise RuntimeError(f"{key} {phase}: from_cache={result['from_cache']}")
                snli[key][phase].append(result)
            log(f"preprocessing: SNLI dev+test {key} repeat {rep + 1}: first {snli[key]['first'][-1]['seconds']:.2f}s, "
                f"cached {snli[key]['cached'][-1]['seconds']:.3f}s")

    # 2. Time against corpus size (first run), real SNLI pairs.
    corpus_files = [data_dir / SNLI_DEV, data_dir / SNLI_TEST]
    by_size: dict[str, dict[str, list[dict]]] = {}
    for n in sizes:
        path = work / f"snli-{n}.jsonl"
        _write_pairs(corpus_files, n, path)
        by_size[str(n)] = {}
        for vectors in (False, True):
            key = "glove" if vectors else "no_vectors"
            config = {"corpus": "snli", "files": {"train": str(path)}, "splits": ["train"], "lowercase": True}
            if vectors:
                config["vectors"] = GLOVE
            runs = [run_worker(config, work / f"cache-size-{n}-{key}-{rep}") for rep in range(repeats)]
            by_size[str(n)][key] = runs
            log(f"preprocessing: {n:>6,} pairs {key}: first run {median(r['seconds'] for r in runs):.2f}s")

    # Summaries.
    def med(runs: list[dict], field: str = "seconds") -> float:
        return median(r[field] for r in runs)

    rows = []
    snli_summary = {}
    for key, phases in snli.items():
        first, cached = med(phases["first"]), med(phases["cached"])
        stages = {s: median(r["stages"].get(s, 0.0) for r in phases["first"]) for s in STAGES}
        stages["other"] = median(r["other_s"] for r in phases["first"])
        snli_summary[key] = {
            "first": spread([r["seconds"] for r in phases["first"]]),
            "cached": spread([r["seconds"] for r in phases["cached"]]),
            "speedup": first / cached,
            "first_run_stages_s": {k: round(v, 4) for k, v in stages.items() if v > 0},
            "import_s": med(phases["first"], "import_s"),
            "pairs": phases["first"][0]["pairs"],
            "vocab": phases["first"][0]["vocab"],
            "vector_coverage": phases["first"][0]["vector_coverage"],
        }
        rows.append((key.replace("_", " "), round(first, 3), round(cached, 3), round(first / cached, 1),
                     ", ".join(f"{k} {v:.2f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]) if v >= 0.01)))

    size_rows, fits = [], {}
    for key in ("no_vectors", "glove"):
        xs = np.array([int(n) for n in by_size])
        ys = np.array([med(by_size[n][key]) for n in by_size])
        slope, intercept = np.polyfit(xs, ys, 1) if len(xs) > 1 else (float("nan"), float("nan"))
        fits[key] = {"seconds_per_1k_pairs": float(slope * 1000), "intercept_s": float(intercept)}
        for n in by_size:
            size_rows.append((f"{int(n):,}", key.replace("_", " "), round(med(by_size[n][key]), 3),
                              round(1000 * med(by_size[n][key]) / int(n), 3)))

    pairs = snli_summary["no_vectors"]["pairs"]
    summary = (
        f"SNLI dev (train {pairs.get('train', 0):,} + 10% premise holdout dev {pairs.get('dev', 0):,}) + SNLI test "
        f"({pairs.get('test', 0):,}), lowercase; vocabulary {snli_summary['no_vectors']['vocab']:,} "
        f"(GloVe 6B 50d covers {snli_summary['glove']['vector_coverage']:.1%}). Each number: one `prepare_data` "
        f"call in a fresh process, median of {repeats}; the `import nli_models.data` before it takes "
        f"{snli_summary['no_vectors']['import_s']:.2f} s and is not included.\n\n"
        + md_table(["vectors", "first run s", "cached run s", "first / cached", "first-run steps (s)"], rows)
        + "\n\nFirst run against corpus size (one train split, no holdout):\n\n"
        + md_table(["pairs", "vectors", "first run s", "s per 1k pairs"], size_rows)
        + "\n\nLinear fit: "
        + "; ".join(f"{k.replace('_', ' ')}: {v['intercept_s']:.2f} s + {v['seconds_per_1k_pairs']:.3f} s per 1k pairs"
                    for k, v in fits.items())
        + "."
    )
    return {
        "params": {"repeats": repeats, "sizes": list(sizes), "snli_config": snli_data_block(data_dir, False)},
        "snli_dev_test": snli_summary,
        "snli_raw": snli,
        "by_size": by_size,
        "fits": fits,
        "targets": [],
        "summary_md": summary,
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        request = json.loads(sys.argv[2])
        print(json.dumps(worker(request["config"], request["cache_dir"])))
    else:
        print("usage: python -m benchmarks.run preprocessing", file=sys.stderr)
        sys.exit(2)
