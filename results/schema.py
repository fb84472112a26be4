"""Column declarations shared by the Parquet tables ``orchestrate results`` writes.

Each table declares its columns once (name, Arrow type, description); the same declaration
builds the Arrow schema, stores every description as field metadata (key ``description``) and
writes the module docstring's column list, so file, code and documentation cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = "1"
SCHEMA_VERSION_KEY = "nli.schema_version"
TABLE_KEY = "nli.table"  # which table a file holds: results, comparison or evp


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    description: str


EXPERIMENT = Column("experiment", pa.string(), "MLflow experiment")
"""The column that names a row's MLflow experiment, in every table keyed by it."""


def arrow_table(
    rows: Sequence[dict], columns: Sequence[Column], table: str, **metadata: object
) -> pa.Table:
    """Rows (dicts keyed by column name, None for null) as an Arrow table with documented schema;
    ``metadata`` values are stored JSON-encoded under ``nli.<key>``."""
    schema = pa.schema(
        [pa.field(c.name, c.type, metadata={"description": c.description}) for c in columns],
        metadata={
            SCHEMA_VERSION_KEY: SCHEMA_VERSION,
            TABLE_KEY: table,
            **{f"nli.{key}": json.dumps(value) for key, value in metadata.items()},
        },
    )
    return pa.Table.from_pylist(list(rows), schema=schema)


def describe(columns: Sequence[Column]) -> str:
    """The column list for a module docstring."""
    return "\n".join(f"* ``{c.name}`` ({c.type}): {c.description}" for c in columns)
