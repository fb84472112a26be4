"""Small file helpers shared by the data pipeline, the orchestrator and results."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nli_models.errors import InputError


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks (corpora and vectors run to gigabytes)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def expand_user(path: str | Path, label: str) -> Path:
    """`path` with a leading `~` or `~USER` expanded; InputError naming `label` (the option or
    field that gave it) when USER has no home directory here (pathlib raises RuntimeError)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        user = str(path)[1:].split("/", 1)[0]
        raise InputError(f"{label} {path}: no user {user!r} on this machine, so ~{user} names no "
                         "home directory; give a path without it") from None
