"""The merge engines' fold, pure (no store): MergeWrite over a dict of encoded rows against a reference fold in
plain Python, for every aggregate function, with random writes, retracts and deletes (keys repeating in a
batch too), and each engine's own rules."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from kvlease.common.codec import RowCodec
from kvlease.common.errors import InvalidRequestError, InvalidRowError, InvalidTableError
from kvlease.common.logentry import ChangeType
from kvlease.common.merge_engine import parse_aggregates, parse_engine
from kvlease.common.tables import TableInfo, TableSpec, parse_schema, validate_spec
from kvlease.tablet.bucket import merge_writes

#: one column per function: name -> (type, function)
AGG_COLUMNS = {
    "s_sum": ("BIGINT", "sum"), "p_prod": ("BIGINT", "product"), "mx": ("BIGINT", "max"), "mn": ("STRING", "min"),
    "lv": ("BIGINT", "last_value"), "lvn": ("STRING", "last_value_ignore_nulls"), "fv": ("BIGINT", "first_value"),
    "fvn": ("STRING", "first_value_ignore_nulls"), "la": ("STRING", "listagg"), "ba": ("BOOLEAN", "bool_and"),
    "bo": ("BOOLEAN", "bool_or"), "d": ("DOUBLE", None),  # d: the default function, last_value_ignore_nulls
}
RETRACTABLE = ("s_sum", "p_prod", "lv", "lvn")


def make_codec(schema: str, kind: str | None, **options) -> RowCodec:
    columns = parse_schema(schema)
    spec = validate_spec(TableSpec("db", "t", columns, ("id",), merge_engine=parse_engine(kind, **options)))
    return RowCodec(TableInfo(1, "db", "t", spec.columns, ("id",), 1, merge_engine=spec.merge_engine))


def agg_codec() -> RowCodec:
    schema = "id BIGINT, " + ", ".join(f"{name} {type_}" for name, (type_, _) in AGG_COLUMNS.items())
    return make_codec(schema, "aggregation", aggregates={n: f for n, (_, f) in AGG_COLUMNS.items() if f})


class Store:
    """A bucket's rows as a dict of encoded key -> value, written through MergeWrite as the leader does."""

    def __init__(self, codec: RowCodec) -> None:
        self.codec, self.rows, self.records = codec, {}, []

    def write(self, upserts=None, retracts=None, deletes=None, partial=False) -> list[int]:
        batches = [None if b is None else pa.RecordBatch.from_pylist(b, schema=self._schema(b))
                   for b in (upserts, retracts, deletes)]
        merge, keys, key_list = merge_writes.prepare(self.codec, *batches[:2], batches[2], partial)
        olds = pa.array([self.rows.get(k) for k in key_list], pa.binary())
        records, put_keys, put_values, gone = merge.changes(key_list, keys, olds)
        self.rows.update(zip(put_keys, put_values))
        for key in gone:
            del self.rows[key]
        self.records.append(records)
        return records.column(0).to_pylist()

    def _schema(self, rows: list[dict]) -> pa.Schema:
        schema = self.codec.values.schema
        names = list(dict.fromkeys(name for row in rows for name in row)) or ["id"]
        return pa.schema([schema.field(name) for name in names])

    def table(self) -> dict:
        decoded = self.codec.decode_values(list(self.rows.values())).to_pylist()
        return {row["id"]: row for row in decoded}


# -- the reference fold ------------------------------------------------------------------------------------------

def ref_combine(function, stored, value, existed):
    if function == "last_value":
        return value
    if function in ("last_value_ignore_nulls", None):
        return stored if value is None else value
    if function == "first_value":
        return stored if existed else value
    if function == "first_value_ignore_nulls":
        return value if stored is None else stored
    if stored is None or value is None:
        return value if stored is None else stored
    return {"sum": lambda: stored + value, "product": lambda: stored * value, "max": lambda: max(stored, value),
            "min": lambda: min(stored, value), "listagg": lambda: f"{stored},{value}",
            "bool_and": lambda: stored and value, "bool_or": lambda: stored or value}[function]()


def ref_retract(function, stored, value):
    if value is None:
        return stored
    if function == "sum":
        return (stored or 0) - value
    if function == "product":
        if stored is None or value == 0 or stored % value:
            raise ValueError("not divisible")
        return stored // value
    return None  # last_value, last_value_ignore_nulls


def ref_write(table: dict, upserts, retracts, deletes) -> dict:
    """The table after one write (upserts, then retracts, then deletes); ValueError if it is refused."""
    table = {k: dict(v) for k, v in table.items()}
    for row in upserts:
        old = table.get(row["id"])
        new = {"id": row["id"]}
        for name, (_, function) in AGG_COLUMNS.items():
            new[name] = ref_combine(function, old and old[name], row.get(name), old is not None)
        table[row["id"]] = new
    for row in retracts:
        old = table.get(row["id"])
        if old is not None:
            for name in RETRACTABLE:
                old[name] = ref_retract(AGG_COLUMNS[name][1], old[name], row.get(name))
    for row in deletes:
        table.pop(row["id"], None)
    return table


small = st.one_of(st.none(), st.integers(-3, 3))
text = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))
flag = st.one_of(st.none(), st.booleans())
VALUES = {"BIGINT": small, "STRING": text, "BOOLEAN": flag, "DOUBLE": st.one_of(st.none(), st.just(1.5))}
keys = st.integers(0, 3)
upsert_rows = st.builds(lambda k, vals: {"id": k, **vals}, keys,
                        st.fixed_dictionaries({n: VALUES[t] for n, (t, _) in AGG_COLUMNS.items()}))
retract_rows = st.builds(lambda k, vals: {"id": k, **vals}, keys,
                         st.fixed_dictionaries({n: VALUES[AGG_COLUMNS[n][0]] for n in RETRACTABLE}))
writes = st.lists(st.tuples(st.lists(upsert_rows, max_size=4), st.lists(retract_rows, max_size=3),
                            st.lists(st.builds(lambda k: {"id": k}, keys), max_size=2)), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(writes)
def test_random_writes_and_retracts_fold_as_the_reference(sequence):
    store, expected = Store(agg_codec()), {}
    for upserts, retracts, deletes in sequence:
        try:
            after = ref_write(expected, upserts, retracts, deletes)
        except ValueError:
            with pytest.raises(InvalidRowError, match="p_prod"):
                store.write(upserts or None, retracts or None, deletes or None)
            continue  # refused: nothing changed
        store.write(upserts or None, retracts or None, deletes or None)
        expected = after
        assert store.table() == expected


def test_change_records_carry_full_before_and_after_images():
    store = Store(agg_codec())
    assert store.write([{"id": 1, "s_sum": 2, "la": "a"}]) == [ChangeType.INSERT]
    assert store.write([{"id": 1, "s_sum": 3, "la": "b"}]) == [ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER]
    records = store.records[-1]
    before, after = store.codec.decode_values(records.column(2)).to_pylist()
    assert (before["s_sum"], before["la"], after["s_sum"], after["la"]) == (2, "a", 5, "a,b")
    assert store.write(retracts=[{"id": 1, "s_sum": 5}]) == [ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER]
    assert store.table()[1]["s_sum"] == 0
    assert store.write(retracts=[{"id": 9, "s_sum": 5}]) == []  # no row to take from: ignored
    assert store.write(deletes=[{"id": 1}]) == [ChangeType.DELETE]


@pytest.mark.parametrize("column, value", [("mx", 1), ("mn", "a"), ("fv", 1), ("fvn", "a"), ("la", "a"),
                                           ("ba", True), ("bo", False)])
def test_a_retract_of_a_function_without_history_is_refused(column, value):
    store = Store(agg_codec())
    store.write([{"id": 1, column: value}])
    with pytest.raises(InvalidRowError, match=f"column '{column}': .* cannot take a retract"):
        store.write(retracts=[{"id": 1, column: value}])
    store.write(retracts=[{"id": 1, column: None, "s_sum": 1}])  # null: nothing taken back


def test_sum_overflow_and_decimal_precision_are_refused():
    store = Store(make_codec("id BIGINT, n TINYINT, p DECIMAL(4,2)", "aggregation", aggregates={"n": "sum", "p": "sum"}))
    store.write([{"id": 1, "n": 100}])
    with pytest.raises(InvalidRowError, match="column 'n': sum overflows"):
        store.write([{"id": 1, "n": 100}])
    store.write([{"id": 2, "p": 60}])
    with pytest.raises(InvalidRowError, match="column 'p': sum does not fit"):
        store.write([{"id": 2, "p": 60}])
    assert store.table()[1]["n"] == 100


def test_first_row_keeps_the_first_and_refuses_deletes():
    store = Store(make_codec("id BIGINT, v STRING", "first_row"))
    assert store.write([{"id": 1, "v": "a"}, {"id": 1, "v": "b"}]) == [ChangeType.INSERT]  # one batch, key twice
    assert store.write([{"id": 1, "v": "c"}, {"id": 2, "v": "d"}]) == [ChangeType.INSERT]
    assert {k: r["v"] for k, r in store.table().items()} == {1: "a", 2: "d"}
    with pytest.raises(InvalidRequestError, match="refuses deletes: its merge engine is first_row"):
        store.write(deletes=[{"id": 1}])


def test_versioned_applies_equal_or_higher_versions_only():
    store = Store(make_codec("id BIGINT, ver BIGINT, v STRING", "versioned", version_column="ver"))
    store.write([{"id": 1, "ver": 5, "v": "a"}])
    assert store.write([{"id": 1, "ver": 4, "v": "old"}]) == []  # ignored: no record
    assert store.write([{"id": 1, "ver": 5, "v": "tie"}, {"id": 1, "ver": 3, "v": "x"},
                        {"id": 1, "ver": 9, "v": "new"}]) == [ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER] * 2
    assert store.table()[1]["v"] == "new"
    with pytest.raises(InvalidRowError, match="row 0, column 'ver': the version column is null"):
        store.write([{"id": 1, "ver": None, "v": "z"}])
    with pytest.raises(InvalidRowError, match="must name its version column"):
        store.write([{"id": 1, "v": "z"}], partial=True)


def test_partial_update_keeps_unwritten_columns_and_nulls_the_written_null():
    store = Store(make_codec("id BIGINT, a STRING, b BIGINT, c BIGINT", None))
    store.write([{"id": 1, "a": "x", "b": 1, "c": 2}])
    store.write([{"id": 1, "b": None}], partial=True)  # a batch's columns are the ones written: b, not c
    store.write([{"id": 2, "c": 7}], partial=True)
    assert store.table() == {1: {"id": 1, "a": "x", "b": None, "c": 2}, 2: {"id": 2, "a": None, "b": None, "c": 7}}
    store.write([{"id": 1, "a": "y"}])  # not partial: the others are null
    assert store.table()[1] == {"id": 1, "a": "y", "b": None, "c": None}
    with pytest.raises(InvalidRowError, match="column 'id': primary key column is missing"):
        store.write([{"a": "z"}], partial=True)


@pytest.mark.parametrize("behavior, records", [("allow", [ChangeType.DELETE]), ("ignore", [])])
def test_delete_behaviors(behavior, records):
    store = Store(make_codec("id BIGINT, n BIGINT", "aggregation", aggregates={"n": "sum"}, delete_behavior=behavior))
    store.write([{"id": 1, "n": 1}])
    assert store.write(deletes=[{"id": 1}]) == records
    disabled = Store(make_codec("id BIGINT, n BIGINT", "aggregation", delete_behavior="disable"))
    with pytest.raises(InvalidRequestError, match="refuses deletes"):
        disabled.write(deletes=[{"id": 1}])


def test_retract_needs_the_aggregation_engine():
    store = Store(make_codec("id BIGINT, n BIGINT", None))
    with pytest.raises(InvalidRequestError, match="cannot take a retract: it needs the aggregation merge engine"):
        store.write(retracts=[{"id": 1, "n": 1}])


def test_rows_of_an_earlier_schema_fold_as_the_current_columns():
    old = make_codec("id BIGINT, n BIGINT", "aggregation", aggregates={"n": "sum"})
    before = Store(old)
    before.write([{"id": 1, "n": 4}])
    columns = (*old.table.columns, *parse_schema("extra STRING"))
    columns = tuple(c if c.name != "extra" else c.__class__(c.name, c.type, 2) for c in columns)
    table = TableInfo(1, "db", "t", columns, ("id",), 1, schema_id=2, merge_engine=old.table.merge_engine,
                      past_schemas=((1, old.table.columns),))
    after = Store(RowCodec(table))
    after.rows = dict(before.rows)  # values of schema id 1
    after.write([{"id": 1, "n": 3, "extra": "x"}])
    assert after.table() == {1: {"id": 1, "n": 7, "extra": "x"}}


@pytest.mark.parametrize("change, column", [("rename", "total"), ("drop", "total"), ("drop", "ver")])
def test_a_column_the_engine_names_cannot_be_renamed_or_dropped(change, column):
    from kvlease.common import schema_changes as sc

    for kind, options in (("aggregation", {"aggregates": {"total": "sum"}}), ("versioned", {"version_column": "ver"})):
        codec = make_codec("id BIGINT, ver BIGINT, total BIGINT, other STRING", kind, **options)
        table = codec.table
        named = column == "total" and kind == "aggregation" or column == "ver" and kind == "versioned"
        step = sc.RenameColumn(column, "renamed") if change == "rename" else sc.DropColumn(column)
        if named:
            with pytest.raises(InvalidTableError, match="is named by its merge engine"):
                sc.apply(table, [sc.SchemaVersion.current(table)], step, 1)
        else:
            assert sc.apply(table, [sc.SchemaVersion.current(table)], step, 1).version is not None
        assert sc.apply(table, [sc.SchemaVersion.current(table)], sc.DropColumn("other"), 1).version is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(keys, st.integers(0, 4), st.sampled_from(["a", "b", None])), max_size=5),
                min_size=1, max_size=6))
def test_first_row_and_versioned_fold_as_the_reference(batches):
    first = Store(make_codec("id BIGINT, ver BIGINT, v STRING", "first_row"))
    versioned = Store(make_codec("id BIGINT, ver BIGINT, v STRING", "versioned", version_column="ver"))
    expected_first, expected_versioned = {}, {}
    for batch in batches:
        rows = [{"id": k, "ver": ver, "v": v} for k, ver, v in batch]
        for row in rows:
            expected_first.setdefault(row["id"], row)
            if row["id"] not in expected_versioned or row["ver"] >= expected_versioned[row["id"]]["ver"]:
                expected_versioned[row["id"]] = row
        if rows:
            first.write(rows)
            versioned.write(rows)
        assert first.table() == expected_first and versioned.table() == expected_versioned


@pytest.mark.unit
def test_agg_options_of_the_cli_and_of_spark_are_read_by_one_parser():
    from kvlease.spark_source.options import OptionError
    from kvlease.spark_source.write_options import _aggregates

    assert parse_aggregates([" total = sum", "n=max"]) == {"total": "sum", "n": "max"}
    for items, words in ((["total"], "expected COL=FUNCTION"), (["=sum"], "expected COL=FUNCTION"),
                         (["a=sum", "a=max"], "column 'a' is named twice")):
        with pytest.raises(InvalidTableError, match=words):
            parse_aggregates(items)
    assert _aggregates("total=sum, n=max,") == {"total": "sum", "n": "max"}
    with pytest.raises(OptionError, match="option 'agg': column 'a' is named twice"):
        _aggregates("a=sum,a=max")
