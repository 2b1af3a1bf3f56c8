"""Rows stored under every schema id of a table read as one schema (common/codec_schemas.py): by field id,
the added column null, the renamed one under its new name, the widened one converted exactly, the dropped
one gone; a reader that keeps an older schema gets the values that fit it; a schema id the reader does not
know is asked for once."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from kvlease.common import schema_changes
from kvlease.common.codec import RowCodec, UnknownSchemaError, value_schema_ids
from kvlease.common.errors import InvalidRowError
from kvlease.common.schema_changes import SchemaVersion
from kvlease.common.tables import Column, TableInfo

pytestmark = pytest.mark.unit

V1 = TableInfo(7, "db", "t", (Column("k", "BIGINT"), Column("n", "INT"), Column("p", "DECIMAL(10,2)"),
                              Column("s", "STRING")), ("k",), 2)


def altered(table: TableInfo, history: list[SchemaVersion], change) -> tuple[TableInfo, list[SchemaVersion]]:
    """``table`` after ``change`` (the coordinator's rules), knowing its earlier schemas as readers do."""
    outcome = schema_changes.apply(table, history, change, 0)
    history = [*history, outcome.version]
    past = tuple((v.schema_id, v.columns) for v in history if v.schema_id < outcome.table.schema_id)
    return dataclasses.replace(outcome.table, past_schemas=past), history


def evolve(*changes) -> list[TableInfo]:
    tables, history = [V1], [SchemaVersion.current(V1)]
    for change in changes:
        table, history = altered(tables[-1], history, change)
        tables.append(table)
    return tables


def write(table: TableInfo, rows: list[dict]) -> list[bytes]:
    codec = RowCodec(table)
    return codec.encode_values(codec.to_batch(rows))


CHANGES = (schema_changes.AddColumn("c STRING"), schema_changes.RenameColumn("s", "label"),
           schema_changes.WidenColumn("n BIGINT"), schema_changes.WidenColumn("p DECIMAL(20,2)"),
           schema_changes.DropColumn("label"))


def test_rows_of_every_schema_id_read_as_the_current_schema_by_field_id():
    v1, v2, v3, v4, v5, v6 = evolve(*CHANGES)
    assert [c.name for c in v6.columns] == ["k", "n", "p", "c"] and v6.schema_id == 6
    stored = (write(v1, [{"k": 1, "n": 2**31 - 1, "p": Decimal("12.34"), "s": "one"}])
              + write(v2, [{"k": 2, "n": -5, "p": None, "s": "two", "c": "x"}])
              + write(v3, [{"k": 3, "n": 7, "p": Decimal("-0.01"), "label": "three", "c": None}])
              + write(v5, [{"k": 5, "n": 2**40, "p": Decimal("123456789012345.67"), "label": "five", "c": "y"}])
              + write(v6, [{"k": 6, "n": 1, "p": Decimal("1.00"), "c": "z"}]))
    assert list(value_schema_ids(stored)) == [1, 2, 3, 5, 6]
    rows = RowCodec(v6).decode_values(stored)
    assert rows.schema == RowCodec(v6).schema
    assert rows.to_pylist() == [  # the added column null before it existed, the dropped one gone, widened exact
        {"k": 1, "n": 2**31 - 1, "p": Decimal("12.34"), "c": None},
        {"k": 2, "n": -5, "p": None, "c": "x"},
        {"k": 3, "n": 7, "p": Decimal("-0.01"), "c": None},
        {"k": 5, "n": 2**40, "p": Decimal("123456789012345.67"), "c": "y"},
        {"k": 6, "n": 1, "p": Decimal("1.00"), "c": "z"}]
    # a rename keeps the column's data under its new name
    assert RowCodec(v3).decode_values(stored[:3]).column("label").to_pylist() == ["one", "two", "three"]


def test_a_reader_that_keeps_an_older_schema_reads_newer_rows_as_it_and_what_does_not_fit_is_a_clear_error():
    v1, *_, v6 = evolve(*CHANGES)
    newer = write(v6, [{"k": 6, "n": 3, "p": Decimal("1.50"), "c": "z"}])
    keeps = RowCodec(v6, read_as=v1.columns)  # a streaming query started at schema 1
    assert keeps.decode_values(newer).to_pylist() == [{"k": 6, "n": 3, "p": Decimal("1.50"), "s": None}]
    with pytest.raises(InvalidRowError, match="column 'n': a stored value does not fit this reader's type INT"):
        keeps.decode_values(write(v6, [{"k": 7, "n": 2**40}]))
    with pytest.raises(InvalidRowError, match="column 'p': a stored value does not fit"):
        keeps.decode_values(write(v6, [{"k": 8, "p": Decimal("123456789012345.67")}]))


def test_an_unknown_schema_id_is_asked_for_once_then_read():
    v1, v2 = evolve(CHANGES[0])
    asked = []
    codec = RowCodec(v1, refresh=lambda: asked.append(1) or v2)
    rows = write(v2, [{"k": 1, "c": "new"}]) + write(v1, [{"k": 2, "s": "old"}])
    assert codec.decode_values(rows).to_pylist() == [  # read as the schema it was opened with
        {"k": 1, "n": None, "p": None, "s": None}, {"k": 2, "n": None, "p": None, "s": "old"}]
    assert codec.decode_values(rows).num_rows == 2 and asked == [1]
    with pytest.raises(UnknownSchemaError, match="schema id 2, which this reader does not know"):
        RowCodec(v1).decode_values(rows)  # nobody to ask


def test_version_1_values_written_before_schema_ids_are_schema_1_rows():
    table = TableInfo(8, "db", "old", (Column("k", "BIGINT"), Column("s", "STRING")), ("k",), 1)
    later, _history = altered(table, [SchemaVersion.current(table)], schema_changes.AddColumn("c INT"))
    old = b"\x01" + b"\x00" + (5).to_bytes(8, "little") + (3).to_bytes(4, "little") + b"abc"  # format 1
    assert list(value_schema_ids([old])) == [1]
    assert RowCodec(later).decode_values([old]).to_pylist() == [{"k": 5, "s": "abc", "c": None}]
