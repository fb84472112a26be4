"""Output files appear whole or not at all: each is written to a temporary sibling and renamed."""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MAX_STEM = 80


def file_stem(name: str) -> str:
    """A file or folder name for `name` (an experiment's, which MLflow lets hold anything): letters,
    digits and _.+- kept, any other run of characters made `_`, no leading dot (`..`, hidden
    files), at most MAX_STEM characters; a name that had to change gets 8 hex digits of its hash,
    so two experiments never share a file. Never a path: no `/`, never `.` or `..`."""
    stem = re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).lstrip(".")[:MAX_STEM] or "experiment"
    if stem == name:
        return stem
    return f"{stem}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def write_output(path: Path, content: pa.Table | str | bytes) -> None:
    """Write a table as Parquet, text as UTF-8 or bytes as they are, to a temporary file in the
    same directory renamed onto ``path`` (atomic); a failed write leaves no file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A plain unique name rather than mkstemp, whose 0600 mode would survive the rename.
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        if isinstance(content, pa.Table):
            pq.write_table(content, temporary)
        elif isinstance(content, str):
            temporary.write_text(content, encoding="utf-8")
        else:
            temporary.write_bytes(content)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
