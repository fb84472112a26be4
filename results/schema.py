"""Column declarations shared by the Parquet tables ``orchestrate results`` writes.

Each table's columns are declared once, as data, in ``results/columns.yaml`` (name, Arrow type,
description); the same declaration builds the Arrow schema, stores every description as field
metadata (key ``description``) and writes the module docstring's column list, so file, code and
documentation cannot disagree. A malformed declaration fails when the first table's columns are
read, that is when a results module is imported, naming the file and the column.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import pyarrow as pa
import yaml

SCHEMA_VERSION = "1"
SCHEMA_VERSION_KEY = "nli.schema_version"
TABLE_KEY = "nli.table"  # which table a file holds: results, comparison or evp


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    description: str


COLUMNS_FILE = resources.files("results").joinpath("columns.yaml")
ARROW_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}
_COLUMN_KEYS = {"name", "type", "description"}


def table_columns(table: str, **generated: Sequence[Column]) -> tuple[Column, ...]:
    """``table``'s columns as columns.yaml declares them, in order; an entry ``generated: NAME``
    stands for the columns passed as ``NAME``, which must be exactly the ones the table names."""
    entries = _declared_tables()[table]
    named = sorted(entry for entry in entries if isinstance(entry, str))
    if named != sorted(generated):
        raise ValueError(
            f"{COLUMNS_FILE}: table {table} declares generated columns {named}, "
            f"the code passes {sorted(generated)}"
        )
    columns: list[Column] = []
    for entry in entries:
        columns.extend(generated[entry] if isinstance(entry, str) else (entry,))
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"{COLUMNS_FILE}: table {table} repeats columns {repeated}")
    return tuple(columns)


@cache
def _declared_tables() -> dict[str, list[Column | str]]:
    """Every table of columns.yaml: its Columns, and the NAME of each ``generated: NAME``."""
    # `orchestrate --help` reads this file (the CLI imports results.published): libyaml's loader
    # takes 2 ms where the pure-Python one takes 20.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    tables = yaml.load(COLUMNS_FILE.read_text(encoding="utf-8"), Loader=loader)
    return {
        table: [_declared_column(table, i, entry) for i, entry in enumerate(entries, start=1)]
        for table, entries in tables.items()
    }


def _declared_column(table: str, position: int, entry: object) -> Column | str:
    where = f"{COLUMNS_FILE}: table {table}, column {position}"
    if isinstance(entry, dict) and set(entry) == {"generated"}:
        return str(entry["generated"])
    if (
        not isinstance(entry, dict)
        or set(entry) != _COLUMN_KEYS
        or not all(isinstance(entry[key], str) for key in _COLUMN_KEYS)
    ):
        raise ValueError(
            f"{where}: needs exactly name, type and description, as text (got {entry!r})"
        )
    if entry["type"] not in ARROW_TYPES:
        raise ValueError(
            f"{where} ({entry['name']}): unknown type {entry['type']!r}; "
            f"known: {', '.join(sorted(ARROW_TYPES))}"
        )
    return Column(entry["name"], ARROW_TYPES[entry["type"]], entry["description"])


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
