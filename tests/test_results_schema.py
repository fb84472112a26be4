"""results/columns.yaml, the declaration of every results table's columns: a malformed entry
fails naming the file and the column, before any table is written."""

import pytest

from results import schema

pytestmark = pytest.mark.unit


@pytest.fixture
def columns_file(tmp_path, monkeypatch):
    """Point results.schema at a columns file the test writes; the shipped one is read again after."""
    path = tmp_path / "columns.yaml"
    monkeypatch.setattr(schema, "COLUMNS_FILE", path)
    schema._declared_tables.cache_clear()
    yield path
    schema._declared_tables.cache_clear()


def test_a_mistyped_arrow_type_names_the_file_and_the_column(columns_file):
    columns_file.write_text(
        "evp:\n"
        "  - {name: n, type: int64, description: trials drawn}\n"
        "  - {name: std, type: flaot64, description: spread}\n"
    )
    with pytest.raises(ValueError) as error:
        schema.table_columns("evp")
    assert str(columns_file) in str(error.value)
    assert "table evp, column 2 (std): unknown type 'flaot64'" in str(error.value)


def test_an_entry_missing_its_description_is_refused(columns_file):
    columns_file.write_text("evp:\n  - {name: n, type: int64}\n")
    with pytest.raises(ValueError, match="table evp, column 1: needs exactly name, type and description"):
        schema.table_columns("evp")


def test_generated_columns_are_spliced_in_place_and_must_be_passed(columns_file):
    columns_file.write_text(
        "results:\n"
        "  - {name: model, type: string, description: registered model}\n"
        "  - generated: summary\n"
        "  - {name: k, type: int64, description: hidden size}\n"
    )
    summary = [schema.Column("dev", schema.ARROW_TYPES["float64"], "mean dev accuracy")]
    columns = schema.table_columns("results", summary=summary)
    assert [c.name for c in columns] == ["model", "dev", "k"]
    assert [str(c.type) for c in columns] == ["string", "double", "int64"]
    with pytest.raises(ValueError, match=r"declares generated columns \['summary'\], the code passes \[\]"):
        schema.table_columns("results")
