"""Row TTL's definition and predicate, pure: durations, the checks against a table's columns, the wire and
ZooKeeper forms, which rows are expired, a lookup's and a scan batch's live rows, the write-time stamp."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest

from kvlease.common import schema_changes
from kvlease.common.codec import RowCodec
from kvlease.common.errors import InvalidTableError
from kvlease.common.row_expiry import expired_mask, live_lookup, live_rows, stamp_write_time
from kvlease.common.row_ttl import WRITE_TIME_COLUMN, RowTtl, format_duration, row_ttl
from kvlease.common.schema_changes import DropColumn, RenameColumn
from kvlease.common.tables import TableInfo, TableSpec, parse_schema, validate_spec
from kvlease.common.wire import table_from_pb, table_spec_from_pb, table_spec_to_pb, table_to_pb
from kvlease.tablet.scan.batch import Batch
from kvlease.tablet.scan.ttl_filter import ttl_filter

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000


@pytest.mark.parametrize("text, ms", [("7d", 7 * 86_400_000), ("12h", 12 * 3_600_000), ("30m", 1_800_000),
                                      ("90s", 90_000), ("500ms", 500), (" 2s ", 2000), (60_000, 60_000)])
def test_durations(text, ms):
    assert row_ttl(text, "ts").ttl_ms == ms
    assert row_ttl(format_duration(ms)).ttl_ms == ms


@pytest.mark.parametrize("ttl, match", [("7", "has no unit"), ("7 days", "not a duration"), ("0s", "above zero"),
                                        ("-1d", "not a duration"), (True, "a duration such as"), ("", "not a duration")])
def test_bad_durations_are_one_line_errors(ttl, match):
    with pytest.raises(InvalidTableError, match=match) as err:
        row_ttl(ttl, "ts")
    assert "\n" not in str(err.value) and "--ttl" in str(err.value)


def _spec(schema: str, ttl: RowTtl) -> TableSpec:
    return validate_spec(TableSpec("db", "t", parse_schema(schema), ("id",), 2, row_ttl=ttl))


def test_a_column_ttl_takes_timestamp_ltz_and_bigint_columns():
    assert _spec("id BIGINT, ts TIMESTAMP_LTZ", row_ttl("1d", "ts")).row_ttl == RowTtl(86_400_000, "ts", False)
    spec = _spec("id BIGINT, ms BIGINT, v STRING", row_ttl("1h", "ms", "none"))
    assert spec.row_ttl.hidden and [c.name for c in spec.columns] == ["id", "ms", "v"]


@pytest.mark.parametrize("schema, column, match", [
    ("id BIGINT, v STRING", "v", r"TTL column 'v' is of type STRING: a TTL counts from a TIMESTAMP"),
    ("id BIGINT, n TIMESTAMP_NTZ", "n", "of type TIMESTAMP_NTZ"),
    ("id BIGINT, i INT", "i", "of type INT"),
    ("id BIGINT, v STRING", "nope", "TTL column 'nope' is not a column of the table"),
])
def test_a_ttl_column_of_another_type_or_missing_is_refused(schema, column, match):
    with pytest.raises(InvalidTableError, match=match):
        _spec(schema, row_ttl("1d", column))


def test_a_bad_changelog_mode_is_refused():
    with pytest.raises(InvalidTableError, match=r"--ttl-changelog 'drop': one of delete, none"):
        row_ttl("1d", "ts", "drop")


def test_a_write_time_ttl_adds_its_column_and_refuses_one_of_another_type():
    spec = _spec("id BIGINT, v STRING", row_ttl("7d"))
    assert [(c.name, c.type) for c in spec.columns][-1] == (WRITE_TIME_COLUMN, "TIMESTAMP")
    assert spec.row_ttl.write_time and spec.row_ttl.column == WRITE_TIME_COLUMN
    with pytest.raises(InvalidTableError, match="write-time TTL counts from column _write_time TIMESTAMP"):
        _spec("id BIGINT, _write_time BIGINT", row_ttl("7d"))


def test_the_wire_and_zookeeper_forms_keep_it():
    spec = _spec("id BIGINT, ts BIGINT", row_ttl("90s", "ts", "none"))
    assert table_spec_from_pb(table_spec_to_pb(spec)).row_ttl == spec.row_ttl
    info = TableInfo(7, "db", "t", spec.columns, ("id",), 2, row_ttl=spec.row_ttl)
    assert table_from_pb(table_to_pb(info)).row_ttl == spec.row_ttl
    assert TableInfo.from_json(info.to_json()) == info
    plain = TableInfo(8, "db", "u", spec.columns, ("id",), 2)
    assert table_from_pb(table_to_pb(plain)).row_ttl is None and "row_ttl" not in plain.to_json()


def _us(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def test_expired_is_value_plus_ttl_at_most_now_and_null_never_expires():
    ttl = RowTtl(1000, "ts", False)
    rows = pa.record_batch({"ts": pa.array([NOW - 1001, NOW - 1000, NOW - 999, None], pa.int64())})
    assert expired_mask(ttl, rows, NOW).tolist() == [True, True, False, False]
    stamps = pa.array([_us(NOW - 5000), _us(NOW - 1000), _us(NOW), None], pa.timestamp("us"))
    assert expired_mask(ttl, pa.record_batch({"ts": stamps}), NOW).tolist() == [True, True, False, False]
    assert live_rows(ttl, pa.record_batch({"ts": stamps}), NOW).num_rows == 2
    assert live_rows(None, pa.record_batch({"ts": stamps}), NOW).num_rows == 4


def test_a_lookup_counts_an_expired_row_as_not_found():
    ttl = RowTtl(1000, "ts", False)
    found = np.array([True, False, True, True])
    rows = pa.record_batch({"id": [1, 3, 4], "ts": pa.array([NOW, NOW - 2000, NOW - 10], pa.int64())})
    hit, live = live_lookup(ttl, found, rows, NOW)
    assert hit.tolist() == [True, False, False, True] and live.column("id").to_pylist() == [1, 4]
    assert found.tolist() == [True, False, True, True]  # the caller's array is not changed


def test_the_write_time_stamp_replaces_or_adds_the_column():
    table = validate_spec(TableSpec("db", "t", parse_schema("id BIGINT, v STRING"), ("id",), 1, row_ttl=row_ttl("1h")))
    schema = RowCodec(TableInfo(1, "db", "t", table.columns, ("id",), 1, row_ttl=table.row_ttl)).schema
    stamped = stamp_write_time(table.row_ttl, schema, pa.record_batch({"id": [1, 2], "v": ["a", "b"]}), NOW)
    assert stamped.column(WRITE_TIME_COLUMN).to_pylist() == [_us(NOW).replace(tzinfo=None)] * 2
    sent = pa.record_batch({"id": [1], WRITE_TIME_COLUMN: pa.array([0], pa.timestamp("us"))})
    assert stamp_write_time(table.row_ttl, schema, sent, NOW).column(WRITE_TIME_COLUMN)[0].value == NOW * 1000
    column_ttl = RowTtl(1000, "ts", False)
    batch = pa.record_batch({"id": [1]})
    assert stamp_write_time(column_ttl, schema, batch, NOW) is batch


def test_a_scan_batch_loses_its_expired_rows_but_keeps_its_last_key():
    info = TableInfo(1, "db", "t", parse_schema("id BIGINT, ts BIGINT"), ("id",), 1, row_ttl=RowTtl(1000, "ts", False))
    codec = RowCodec(info)
    rows = pa.record_batch({"id": pa.array([1, 2, 3, 4], pa.int64()),
                            "ts": pa.array([NOW, NOW - 5000, NOW, NOW - 5000], pa.int64())})
    _keys, values = codec.encode_arrays(rows)
    data = values.to_pylist()
    offsets = np.cumsum([0] + [len(v) for v in data]).astype(np.int32)
    batch = Batch([b"".join(data[:2]), b"".join(data[2:])], offsets, b"last", True)
    kept = ttl_filter(codec, lambda: NOW)(batch)
    assert kept.count == 2 and kept.values() == [data[0], data[2]]
    assert kept.last_key == b"last" and kept.has_more
    capped = Batch(batch.chunks, offsets, b"last", False)  # cut by a cap of 4 rows
    assert ttl_filter(codec, lambda: NOW)(capped, 4).has_more  # two rows short: ask again
    assert not ttl_filter(codec, lambda: NOW)(capped, 5).has_more  # not cut: the end
    assert not ttl_filter(codec, lambda: NOW)(capped).has_more
    assert ttl_filter(codec, lambda: NOW + 10_000)(batch).count == 0
    assert ttl_filter(codec, lambda: NOW - 10_000)(batch) is batch
    assert ttl_filter(RowCodec(TableInfo(2, "db", "u", info.columns, ("id",), 1))) is None


@pytest.mark.parametrize("change, what", [(DropColumn("ts"), "dropped"), (RenameColumn("ts", "t2"), "renamed")])
def test_the_ttl_column_cannot_be_dropped_or_renamed(change, what):
    info = TableInfo(1, "db", "t", parse_schema("id BIGINT, ts BIGINT, v STRING"), ("id",), 1,
                     row_ttl=RowTtl(1000, "ts", False))
    with pytest.raises(InvalidTableError, match=f"column ts of table db.t is its row TTL column: it cannot be {what}"):
        schema_changes.apply(info, [], change, NOW)
    assert schema_changes.apply(info, [], DropColumn("v"), NOW).version is not None
