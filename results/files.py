"""Output files appear whole or not at all: each is written to a temporary sibling and renamed."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


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
