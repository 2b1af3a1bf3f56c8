"""Row TTL on one bucket's store (real RocksDB and changelog in temp dirs, a controlled clock): lookups leave
expired rows out, the conditional delete removes only rows still expired under the write lock (a refresh,
also one still in a replicated bucket's pre-write buffer, keeps its row), its -D records carry the
before-image or (``--ttl-changelog none``) none, which a follower applies and the change feed skips."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kvlease.client.log_records import entry_records
from kvlease.common.logentry import ChangeType
from kvlease.common.row_ttl import RowTtl, row_ttl
from kvlease.common.tables import Column, TableInfo, TableSpec, validate_spec
from kvlease.tablet.bucket.expiry_deletes import ExpiredOnly
from kvlease.tablet.bucket.store import BucketStore
from tests.tablet.bucket.test_bucket import bucket_dir  # noqa: F401 (a fixture)
from tests.tablet.bucket.test_bucket_replicated import other_dir, replicate  # noqa: F401 (other_dir: a fixture)

pytestmark = pytest.mark.unit

T0 = 1_800_000_000_000
TTL_MS = 10_000


def table(mode: str = "delete") -> TableInfo:
    return TableInfo(9, "db", "ttl", (Column("id", "BIGINT"), Column("ts", "BIGINT"), Column("v", "STRING")),
                     ("id",), 1, row_ttl=RowTtl(TTL_MS, "ts", False, mode))


def rows(*items: tuple[int, int, str]) -> pa.RecordBatch:
    ids, stamps, vs = zip(*items)
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "ts": pa.array(stamps, pa.int64()), "v": list(vs)})


def keys(*ids: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64())})


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def open_store(dir: str, info: TableInfo, clock: Clock, replicated: bool = False) -> BucketStore:
    return BucketStore.open(dir, info, segment_bytes=1 << 20, fsync=False, clock_ms=clock, replicated=replicated)


def records(store: BucketStore) -> list[tuple[str, int, bool]]:
    """(change type, id, has a value) of every record."""
    out = []
    for entry in store.read_log(0, 1 << 30):
        r = entry.records
        ids = store.codec.decode_keys(r.column("key")).column("id").to_pylist()
        out += [(ChangeType(t).short, i, v is not None)
                for t, i, v in zip(r.column(0).to_pylist(), ids, r.column(2).to_pylist())]
    return out


def test_lookups_leave_expired_rows_out_before_any_delete(bucket_dir):
    clock = Clock()
    with open_store(bucket_dir, table(), clock) as store:
        store.write(rows((1, T0 - TTL_MS, "old"), (2, T0 - TTL_MS + 1, "young"), (3, T0, "new")))
        found, got = store.lookup(keys(1, 2, 3, 4))
        assert found.tolist() == [False, True, True, False] and got.column("v").to_pylist() == ["young", "new"]
        clock.now += 1
        assert store.lookup(keys(1, 2, 3))[0].tolist() == [False, False, True]
        assert [r[0] for r in records(store)] == ["+I"] * 3  # nothing deleted: only hidden


def test_the_conditional_delete_keeps_a_row_refreshed_meanwhile(bucket_dir):
    clock = Clock()
    with open_store(bucket_dir, table(), clock) as store:
        store.write(rows((1, T0 - 20_000, "a"), (2, T0 - 20_000, "b"), (3, T0, "c")))
        # the deleter read ids 1, 2 (and 3, not expired) as expired rows; id 2 is written again before it deletes
        store.write(rows((2, T0, "b2")))
        condition = ExpiredOnly(store.codec, store.table.row_ttl, clock.now)
        base, end = store.writes.write(None, keys(1, 2, 3, 7), only_if=condition)
        assert end - base == 1
        assert records(store)[-1] == ("-D", 1, True)  # with its before-image
        assert store.lookup(keys(1, 2, 3))[0].tolist() == [False, True, True]
        assert store.writes.write(None, keys(1, 2, 3), only_if=condition) == (end, end)  # nothing left to delete


def test_a_hidden_delete_has_no_before_image_and_the_change_feed_skips_it(bucket_dir, other_dir):
    clock = Clock()
    info = table("none")
    with open_store(bucket_dir, info, clock, replicated=True) as leader, \
            open_store(other_dir, info, clock, replicated=True) as follower:
        leader.become_leader(1)
        follower.become_follower(1)
        leader.write(rows((1, T0 - 20_000, "a"), (2, T0, "b")))
        leader.advance_high_watermark(leader.log_end_offset)
        leader.writes.write(None, keys(1, 2), only_if=ExpiredOnly(leader.codec, info.row_ttl, clock.now))
        assert records(leader)[-1] == ("-D", 1, False)
        replicate(leader, follower)
        for store in (leader, follower):
            store.advance_high_watermark(leader.log_end_offset)
        with follower.snapshot() as snapshot:
            assert [follower.codec.decode_values([v]).column("id")[0].as_py()
                    for _k, v in follower.iter_rows(snapshot)] == [2]
        feed = [entry_records(e) for e in leader.read_log(0, 1 << 30)]
        assert [r.column("change_type").to_pylist() for r in feed] == [[0, 0], []]


def test_a_refresh_still_in_the_pre_write_buffer_keeps_its_row(bucket_dir):
    clock = Clock()
    with open_store(bucket_dir, table(), clock, replicated=True) as store:
        store.become_leader(1)
        store.write(rows((1, T0 - 20_000, "a")))
        store.advance_high_watermark(store.log_end_offset)
        store.write(rows((1, T0, "a2")))  # not committed: RocksDB still holds the expired row
        assert store.lookup(keys(1))[0].tolist() == [False]  # reads see committed data only
        end = store.log_end_offset
        assert store.writes.write(None, keys(1), only_if=ExpiredOnly(store.codec, store.table.row_ttl,
                                                                      clock.now)) == (end, end)
        store.advance_high_watermark(store.log_end_offset)
        assert store.lookup(keys(1))[0].tolist() == [True]


def test_a_write_time_ttl_is_stamped_with_the_leaders_clock(bucket_dir):
    clock = Clock()
    spec = validate_spec(TableSpec("db", "w", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1,
                                   row_ttl=row_ttl("10s")))
    info = TableInfo(10, "db", "w", spec.columns, ("id",), 1, row_ttl=spec.row_ttl)
    with open_store(bucket_dir, info, clock) as store:
        store.write(pa.record_batch({"id": pa.array([1], pa.int64()), "v": ["a"]}))
        clock.now += 5_000
        store.write(pa.record_batch({"id": pa.array([2], pa.int64()), "v": ["b"]}))
        found, got = store.lookup(keys(1, 2))
        assert [t.value // 1000 for t in got.column("_write_time")] == [T0, T0 + 5_000]
        clock.now = T0 + 10_000
        assert store.lookup(keys(1, 2))[0].tolist() == [False, True]
