"""Schema evolution's rules (common/schema_changes.py): each change, its retry after a lost answer (same
outcome, no second version), and every refusal."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvlease.common import columns as columns_module
from kvlease.common import schema_changes as sc
from kvlease.common.errors import InvalidTableError
from kvlease.common.schema_changes import (AddColumn, DropColumn, RenameColumn, SchemaVersion, SetComment,
                                           WidenColumn)
from kvlease.common.tables import Column, TableInfo, TableSpec, validate_spec
from kvlease.common.types import NESTED, SIMPLE

pytestmark = pytest.mark.unit

NOW = 1_700_000_000_000


def table(*columns: Column, key=("id",), partition_key=()) -> TableInfo:
    columns = columns or (Column("id", "BIGINT"), Column("v", "STRING"), Column("n", "INT"))
    return TableInfo(7, "db", "t", columns, key, 2, created_ms=5, partition_key=partition_key)


class Evolving:
    """A table and its history, changed as the coordinator does: each outcome's version is stored."""

    def __init__(self, start: TableInfo) -> None:
        self.table, self.history = start, [SchemaVersion.current(start)]

    def __call__(self, change, now_ms: int = NOW) -> sc.Outcome:
        outcome = sc.apply(self.table, self.history, change, now_ms)
        if outcome.version is not None:
            self.table = outcome.table
            self.history.append(outcome.version)
        return outcome


@pytest.fixture
def every_type(monkeypatch):
    """Every type of the grammar storable (what the codec's side of issue 42 makes true)."""
    monkeypatch.setattr(columns_module, "TYPES", (*SIMPLE, "DECIMAL", *NESTED))


def test_a_table_numbers_its_columns_by_position_and_a_version_round_trips_through_json():
    t = table()
    assert [c.id for c in t.columns] == [0, 1, 2] and t.schema_id == 1
    mixed = table(Column("id", "BIGINT", 4), Column("v", "STRING"), Column("n", "INT", 1), Column("m", "INT"))
    assert [c.id for c in mixed.columns] == [4, 5, 1, 6]  # unnumbered ones: after the highest id there is
    version = SchemaVersion(3, (Column("id", "BIGINT", 0), Column("c", "INT", 4, "it's")), "add column c INT", 9,
                            "a table")
    assert SchemaVersion.from_json(version.to_json()) == version


def test_a_create_keeps_its_columns_comments_and_refuses_one_too_long():
    spec = validate_spec(TableSpec("db", "t", (Column("id", "BIGINT", 7, "the key"),), ("id",)))
    assert spec.columns == (Column("id", "BIGINT", comment="the key"),)  # ids are the table's to number
    with pytest.raises(InvalidTableError, match="column id's comment: a text of at most 1024 characters"):
        validate_spec(TableSpec("db", "t", (Column("id", "BIGINT", comment="x" * 1025),), ("id",)))


def test_add_column_appends_a_nullable_column_with_a_new_field_id_and_a_retry_changes_nothing():
    t = Evolving(table())
    outcome = t(AddColumn("c BIGINT COMMENT 'the count, it''s'"))
    assert outcome.table.schema_id == 2
    assert outcome.table.columns[-1] == Column("c", "BIGINT", 3, "the count, it's")
    assert outcome.version == SchemaVersion(2, outcome.table.columns, "add column c BIGINT", NOW, "")
    again = t(AddColumn("c bigint comment 'the count, it''s'"))  # the same request, its answer lost
    assert again.version is None and again.table.schema_id == 2 and len(t.history) == 2


def test_a_new_field_id_is_past_every_id_ever_used_also_a_dropped_columns():
    t = Evolving(table())
    t(DropColumn("n"))  # field id 2 goes
    assert t(AddColumn("m INT")).table.column("m").id == 3  # not 2 again
    t(DropColumn("m"))
    assert t(AddColumn("m INT")).table.column("m").id == 4  # a dropped name again, same type: a new column


def test_rename_keeps_the_field_id_and_a_retry_finds_it_done():
    t = Evolving(table())
    outcome = t(RenameColumn("v", "label"))
    assert outcome.table.column("label") == Column("label", "STRING", 1) and outcome.table.column("v") is None
    assert outcome.version.change == "rename column v to label"
    again = t(RenameColumn("v", "label"))
    assert again.version is None and again.table.schema_id == 2


def test_widen_changes_the_type_and_a_retry_finds_it_done(every_type):
    t = Evolving(table(Column("id", "BIGINT"), Column("a", "TINYINT"), Column("f", "FLOAT"),
                       Column("d", "DECIMAL(10,2)")))
    assert t(WidenColumn("a SMALLINT")).table.column("a").type == "SMALLINT"
    assert t(WidenColumn("a BIGINT")).table.column("a").type == "BIGINT"
    assert t(WidenColumn("f DOUBLE")).table.column("f").type == "DOUBLE"
    outcome = t(WidenColumn("d DECIMAL(12,2)"))
    assert outcome.table.column("d") == Column("d", "DECIMAL(12,2)", 3)
    assert outcome.version.change == "widen column d DECIMAL(10,2) to DECIMAL(12,2)"
    assert t(WidenColumn("d decimal(12, 2)")).version is None and t.table.schema_id == 5


def test_drop_removes_the_column_and_a_retry_finds_it_gone():
    t = Evolving(table())
    outcome = t(DropColumn("v"))
    assert [c.name for c in outcome.table.columns] == ["id", "n"] and outcome.table.schema_id == 2
    assert t(DropColumn("v")).version is None and len(t.history) == 2


def test_comment_sets_the_tables_comment_and_the_same_again_changes_nothing():
    t = Evolving(table())
    outcome = t(SetComment("orders, one row each"))
    assert outcome.table.comment == "orders, one row each" and outcome.version.comment == "orders, one row each"
    assert t(SetComment("orders, one row each")).version is None
    assert t(SetComment("")).table.comment == "" and t.table.schema_id == 3


def test_each_change_makes_one_version_and_the_history_replays_the_columns():
    t = Evolving(table())
    for change in (AddColumn("c INT"), RenameColumn("c", "d"), WidenColumn("d BIGINT"), DropColumn("v")):
        t(change)
        t(change)  # every retry: nothing more
    assert [v.schema_id for v in t.history] == [1, 2, 3, 4, 5]
    assert [v.change for v in t.history] == ["create", "add column c INT", "rename column c to d",
                                             "widen column d INT to BIGINT", "drop column v"]
    assert t.table.columns == (Column("id", "BIGINT", 0), Column("n", "INT", 2), Column("d", "BIGINT", 3))


@pytest.mark.parametrize("change, says", [
    (AddColumn("v INT"), "column v exists already in table db.t (STRING)"),
    (AddColumn("v STRING COMMENT 'another'"), "column v exists already"),
    (AddColumn("c"), "bad column definition 'c': expected 'NAME TYPE"),
    (AddColumn(""), "bad column definition"),
    (AddColumn("9c INT"), "bad column name '9c'"),
    (AddColumn("c UUID"), "column 'c': bad column type 'UUID'"),
    (AddColumn("c INT COMMENT '" + "x" * 1025 + "'"), "more than 1024"),
    (RenameColumn("id", "key"), "column id of table db.t is a primary key column: it cannot be renamed"),
    (RenameColumn("v", "n"), "cannot rename column v to n: table db.t has a column n"),
    (RenameColumn("nope", "x"), "table db.t has no column nope"),
    (RenameColumn("v", "v"), "column v is named v already"),
    (RenameColumn("v", "bad name"), "bad column name 'bad name'"),
    (WidenColumn("n STRING"), "cannot change column n from INT to STRING: only a widening"),
    (WidenColumn("id INT"), "column id of table db.t is a primary key column: it cannot be retyped"),
    (WidenColumn("nope BIGINT"), "table db.t has no column nope"),
    (WidenColumn("n BIGINT COMMENT 'x'"), "widen column n: takes 'NAME TYPE', no comment"),
    (DropColumn("id"), "column id of table db.t is a primary key column: it cannot be dropped"),
    (DropColumn("nope"), "table db.t has no column nope"),
])
def test_refusals_name_the_column_and_why(change, says):
    with pytest.raises(InvalidTableError) as refused:
        sc.apply(table(), [], change, NOW)
    assert says in refused.value.message


@pytest.mark.parametrize("start, to", [
    ("BIGINT", "INT"), ("INT", "TINYINT"), ("DOUBLE", "FLOAT"), ("DECIMAL(12,2)", "DECIMAL(10,2)"),
    ("DECIMAL(10,2)", "DECIMAL(12,3)"), ("INT", "DOUBLE"), ("INT", "DECIMAL(38,0)"), ("DATE", "TIMESTAMP"),
    ("ARRAY<INT>", "ARRAY<BIGINT>"),
])
def test_narrowing_and_anything_but_a_widening_is_refused(every_type, start, to):
    with pytest.raises(InvalidTableError) as refused:
        sc.apply(table(Column("id", "BIGINT"), Column("c", start)), [], WidenColumn(f"c {to}"), NOW)
    assert f"cannot change column c from {start} to {to}: only a widening" in refused.value.message


def test_widening_a_key_column_is_refused_even_when_it_would_widen():
    with pytest.raises(InvalidTableError, match="primary key column: it cannot be retyped"):
        sc.apply(table(Column("id", "INT"), Column("v", "STRING")), [], WidenColumn("id BIGINT"), NOW)


def test_partition_key_columns_cannot_be_renamed_retyped_or_dropped():
    t = table(Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "INT"), key=("day", "id"),
              partition_key=("day",))
    for change, what in ((RenameColumn("day", "d"), "renamed"), (DropColumn("day"), "dropped"),
                         (WidenColumn("day BYTES"), "retyped")):
        with pytest.raises(InvalidTableError) as refused:
            sc.apply(t, [], change, NOW)
        assert refused.value.message == f"column day of table db.t is a partition key column: it cannot be {what}"


def test_a_dropped_columns_name_cannot_come_back_with_another_type():
    t = Evolving(table())
    t(WidenColumn("n BIGINT"))
    t(DropColumn("n"))
    with pytest.raises(InvalidTableError) as refused:
        t(AddColumn("n STRING"))
    assert refused.value.message == ("column name n was a dropped column of type BIGINT in table db.t: it cannot be "
                                     "used for a column of type STRING")
    with pytest.raises(InvalidTableError, match="was a dropped column of type BIGINT"):
        t(RenameColumn("v", "n"))  # v is a STRING
    assert t(AddColumn("n BIGINT")).table.column("n").id == 3  # its last type: allowed, a new field id


def test_the_last_column_cannot_be_dropped():
    with pytest.raises(InvalidTableError, match="last column"):
        sc.apply(table(Column("only", "BIGINT"), key=()), [], DropColumn("only"), NOW)


def test_a_retried_rename_is_not_mistaken_for_one_never_made():
    t = Evolving(table())
    with pytest.raises(InvalidTableError, match="has no column label"):
        t(RenameColumn("label", "v"))  # v was always v: no column label ever had its field id
    t(RenameColumn("v", "label"))
    t(RenameColumn("label", "v"))  # and back
    assert t(RenameColumn("label", "v")).version is None  # the retry of the second
    with pytest.raises(InvalidTableError, match="has no column nope"):
        t(DropColumn("nope"))  # never a column: not a retry of a drop


NAMES = ("a", "b", "c", "v", "n")
TYPES = ("TINYINT", "INT", "BIGINT", "STRING")
CHANGES = st.one_of(
    st.builds(lambda n, t: AddColumn(f"{n} {t}"), st.sampled_from(NAMES), st.sampled_from(TYPES)),
    st.builds(RenameColumn, st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.builds(lambda n, t: WidenColumn(f"{n} {t}"), st.sampled_from(NAMES), st.sampled_from(TYPES)),
    st.builds(DropColumn, st.sampled_from(NAMES)),
    st.builds(SetComment, st.sampled_from(("", "x", "y"))))


@settings(max_examples=100, deadline=None)
@given(st.lists(CHANGES, max_size=25))
def test_any_sequence_of_changes_each_sent_twice_makes_one_version_each_and_never_reuses_a_field_id(changes):
    t = Evolving(table())
    used = {c.id for c in t.table.columns}
    for change in changes:
        try:
            outcome = t(change)
        except InvalidTableError:
            continue
        assert t(change).version is None and t.table == outcome.table  # its retry: the same, no new version
        if outcome.version is not None:
            new_ids = {c.id for c in outcome.table.columns} - used
            assert all(i > max(used) for i in new_ids) and len(new_ids) <= 1
            used |= new_ids
        ids = [c.id for c in t.table.columns]
        assert len(set(ids)) == len(ids) and len({c.name for c in t.table.columns}) == len(ids)
        assert t.table.column("id") == Column("id", "BIGINT", 0)  # the key column never changes
    assert [v.schema_id for v in t.history] == list(range(1, len(t.history) + 1)) and t.table.schema_id == len(t.history)
