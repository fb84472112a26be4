"""What a reviewer needs to trust a sweep, recorded once on its parent run: the data it read
(files with SHA-256 and size, split sizes, vocabulary, vector coverage) and the environment
(package versions, hardware, device). `orchestrate report` renders both; nothing here talks to
MLflow (the sweep journals the records; orchestrator.tracking.uploader logs them)."""

from __future__ import annotations

import getpass
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch

from nli_models.data import PreparedData
from nli_models.data.data_config import DataConfig
from nli_models.data.prepare import resolve_files
from nli_models.files import sha256_file

# What the product itself writes into the folder it runs in (the default SQLite store and its
# lock, artifacts, Ray Tune's results, tables, caches, tracking journals): untracked files that
# match these do not make a checkout dirty, so `make demo` in a fresh clone records a clean tree.
PRODUCT_OUTPUTS = (
    "mlruns.db", "mlruns.db.lock", "mlruns.db-journal", "mlruns/*", "mlartifacts/*",
    "ray_results/*", "results/tables/*", "results/plots/*", ".nli_cache/*",
    "*tracking-journal-*.jsonl*",
)

PACKAGES = ("nli-orchestrator", "torch", "ray", "mlflow", "optuna", "numpy", "pandas", "pyarrow")


def git_state(folder: Path) -> tuple[str, bool | None]:
    """(commit, dirty) of the checkout holding ``folder``; ("unknown", None) outside one. Dirty
    means a tracked file changed or an untracked file exists that the product did not write
    (PRODUCT_OUTPUTS): a sweep's own store beside the code is not an uncommitted change."""
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=True, cwd=folder,
        ).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        status = git("status", "--porcelain", "--untracked-files=all", "-z")
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    entries = [e for e in status.split("\0") if e]
    changed = [e for e in entries if not e.startswith("?? ")]
    untracked = [e[3:] for e in entries if e.startswith("?? ")]
    foreign = [f for f in untracked if not _product_output(f)]
    return commit, bool(changed or foreign)


def _product_output(path: str) -> bool:
    """Whether an untracked path is one the product writes, in the root or a subfolder (the
    folder a command ran in)."""
    return any(fnmatch(path, p) or fnmatch(path, f"*/{p}") for p in PRODUCT_OUTPUTS)


def data_record(config: DataConfig, data: PreparedData) -> dict[str, Any]:
    """Files (path, SHA-256, bytes), split sizes, classes, vocabulary, vectors of a sweep's data."""
    files = {
        split: {"path": str(path), "sha256": sha256_file(path), "bytes": path.stat().st_size}
        for split, path in sorted(resolve_files(config).items())
    }
    vectors = config.vectors
    return {
        "corpus": data.corpus,
        "files": files,
        "splits": {name: len(split) for name, split in data.splits.items()},
        "split_provenance": {name: {k: str(v) for k, v in info.items()} for name, info in data.info.items()},
        "labels": list(data.labels),
        "vocabulary_size": len(data.vocab),
        "vectors": None if vectors is None else vectors.model_dump(mode="json"),
        "embedding_dim": data.embedding_dim,
        "vector_coverage": data.vector_coverage,
        "config": config.model_dump(mode="json"),
    }


def data_digest(record: dict[str, Any]) -> str:
    """A short digest of the data a sweep read: its files' SHA-256 (or, for generated data, its
    configuration) and split sizes."""
    basis = {k: record[k] for k in ("files", "splits", "config")}
    return hashlib.sha256(repr(sorted(basis.items())).encode()).hexdigest()[:16]


def environment_record(requested: dict[str, Any]) -> dict[str, Any]:
    """Package versions, Python, OS, CPU, memory and GPUs of the driver's host, and the devices
    the spec asks for (`requested`); the trials record where they really trained."""
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    cuda = torch.cuda.is_available()
    memory = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "python": platform.python_version(),
        "packages": versions,
        "os": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory,
        "requested": requested,
        "cuda_available": cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "cuda_version": torch.version.cuda,
        "user": getpass.getuser(),
    }
