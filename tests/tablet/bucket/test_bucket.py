"""The bucket store: change records with before-images, rejected batches, lookups, pipelined writes
(snapshots and checkpoints: test_bucket_snapshots.py)."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from kvlease.common.errors import InvalidRowError
from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.bucket.store import BucketStore, BucketStoreError
from kvlease.common.logentry import ChangeType, ChangelogError, decode_entry
from tests.support import bucket_writer
from tests.support.paths import REPO

pytestmark = pytest.mark.unit

PROJECT_ROOT = REPO
TABLE = TableInfo(3, "db", "users", (Column("id", "BIGINT"), Column("name", "STRING"), Column("score", "DOUBLE")),
                  ("id",), 4)
# a two-column key, STRING first: keys of different lengths
TABLE2 = TableInfo(4, "db", "events", (Column("kind", "STRING"), Column("seq", "INT"), Column("payload", "BYTES")),
                   ("kind", "seq"), 1)
I, UB, UA, D = (ct.short for ct in ChangeType)


@pytest.fixture
def bucket_dir(kvlease_tmp: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="bucket-", dir=kvlease_tmp)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store(bucket_dir: str) -> Iterator[BucketStore]:
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as s:
        yield s


def rows(*items: tuple) -> pa.RecordBatch:
    """Full rows of TABLE from (id, name, score) tuples."""
    ids, names, scores = zip(*items) if items else ((), (), ())
    return pa.RecordBatch.from_arrays([pa.array(ids, pa.int64()), pa.array(names, pa.string()),
                                       pa.array(scores, pa.float64())], names=["id", "name", "score"])


def keys(*ids: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(ids, pa.int64())], names=["id"])


def changes(store: BucketStore, start: int = 0) -> list[tuple]:
    """The changelog from ``start`` as (offset, change type, id, decoded row)."""
    out, offset = [], start
    while offset < store.log_end_offset:
        entries = store.read_log(offset, 1 << 20)
        for entry in entries:
            decoded = store.codec.decode_values(entry.records.column(2))
            ids = store.codec.decode_keys(entry.records.column(1)).column(0).to_pylist()
            for i, (ct, row) in enumerate(zip(entry.records.column(0).to_pylist(), decoded.to_pylist())):
                out.append((entry.base_offset + i, ChangeType(ct).short, ids[i], tuple(row.values())))
        offset = entries[-1].next_offset
    return out


def kv_rows(store: BucketStore) -> dict[bytes, bytes]:
    with store.snapshot() as snapshot:
        return dict(store.iter_rows(snapshot))


def state(store: BucketStore) -> dict[int, tuple]:
    """Every row of the bucket (a full KV scan), by id."""
    decoded = store.codec.decode_values(list(kv_rows(store).values())).to_pylist()
    return {row["id"]: tuple(row.values()) for row in decoded}


def fold(entries_records: list[pa.RecordBatch], initial: dict[bytes, bytes] | None = None) -> dict[bytes, bytes]:
    """The KV state the changelog records describe: +I/+U put, -D delete."""
    kv = dict(initial or {})
    for records in entries_records:
        for ct, key, value in zip(*(c.to_pylist() for c in records.columns)):
            if ct in (ChangeType.INSERT, ChangeType.UPDATE_AFTER):
                kv[key] = value
            elif ct == ChangeType.DELETE:
                del kv[key]
    return kv


def log_records(store: BucketStore, start: int = 0) -> list[pa.RecordBatch]:
    out, offset = [], start
    while offset < store.log_end_offset:
        entries = store.read_log(offset, 1 << 20)
        out += [e.records for e in entries]
        offset = entries[-1].next_offset
    return out


# --- change records ----------------------------------------------------------------------------

def test_insert_update_delete_produce_records_with_before_images(store):
    assert store.write(rows((1, "a", 1.0), (2, "b", None))) == (0, 2)
    assert store.write(rows((2, "B", 2.5), (3, "c", 3.0))) == (2, 5)
    assert store.write(None, keys(1)) == (5, 6)
    assert changes(store) == [
        (0, I, 1, (1, "a", 1.0)), (1, I, 2, (2, "b", None)),
        (2, UB, 2, (2, "b", None)), (3, UA, 2, (2, "B", 2.5)), (4, I, 3, (3, "c", 3.0)),
        (5, D, 1, (1, "a", 1.0)),
    ]
    assert state(store) == {2: (2, "B", 2.5), 3: (3, "c", 3.0)}
    assert store.applied_offset == store.log_end_offset == 6
    assert store.list_offsets() == (0, 6)


def test_upserts_and_deletes_in_one_write(store):
    store.write(rows((1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)))
    assert store.write(rows((4, "d", 4.0), (1, "A", 1.5)), keys(2, 99, 3)) == (3, 8)
    assert changes(store, 3) == [(3, I, 4, (4, "d", 4.0)), (4, UB, 1, (1, "a", 1.0)), (5, UA, 1, (1, "A", 1.5)),
                                 (6, D, 2, (2, "b", 2.0)), (7, D, 3, (3, "c", 3.0))]
    assert state(store) == {1: (1, "A", 1.5), 4: (4, "d", 4.0)}


def test_delete_of_a_missing_key_writes_nothing(store):
    store.write(rows((1, "a", 1.0)))
    segment_sizes = [s.size for s in store.log_segments()]
    assert store.write(None, keys(7, 8)) == (1, 1)
    assert store.write(rows(), keys()) == (1, 1)
    assert store.write() == (1, 1)
    assert [s.size for s in store.log_segments()] == segment_sizes
    assert store.list_offsets() == (0, 1)
    assert state(store) == {1: (1, "a", 1.0)}


def test_a_key_twice_in_one_write_gets_each_step_in_order(store):
    store.write(rows((1, "a", 1.0)))
    # insert then update 2; update 1 twice; upsert then delete 3; delete 1 twice (one -D)
    base, nxt = store.write(rows((2, "x", None), (1, "b", 2.0), (2, "y", None), (3, "t", 0.0), (1, "c", 3.0)),
                            keys(3, 1, 1))
    assert changes(store, base) == [
        (1, I, 2, (2, "x", None)),
        (2, UB, 1, (1, "a", 1.0)), (3, UA, 1, (1, "b", 2.0)),
        (4, UB, 2, (2, "x", None)), (5, UA, 2, (2, "y", None)),
        (6, I, 3, (3, "t", 0.0)),
        (7, UB, 1, (1, "b", 2.0)), (8, UA, 1, (1, "c", 3.0)),
        (9, D, 3, (3, "t", 0.0)),
        (10, D, 1, (1, "c", 3.0)),
    ]
    assert nxt == 11
    assert state(store) == {2: (2, "y", None)}
    # and the state survives a replay of the log from scratch
    assert fold(log_records(store)) == kv_rows(store)


def test_multi_column_keys(bucket_dir):
    with BucketStore.open(bucket_dir, TABLE2, segment_bytes=1 << 20, fsync=False) as s:
        batch = pa.RecordBatch.from_arrays([pa.array(["a", "a\x00", "", "a"]), pa.array([2, 1, 5, 1], pa.int32()),
                                            pa.array([b"p", None, b"\x00", b"q"])], names=["kind", "seq", "payload"])
        s.write(batch)
        s.write(batch.slice(3, 1), batch.select(["kind", "seq"]).slice(1, 1))
        found, got = s.lookup(pa.RecordBatch.from_arrays([pa.array([1, 2, 1], pa.int32()), pa.array(["a", "a", "a\x00"])],
                                                         names=["seq", "kind"]))
        assert found.tolist() == [True, True, False]
        assert got.to_pylist() == [{"kind": "a", "seq": 1, "payload": b"q"}, {"kind": "a", "seq": 2, "payload": b"p"}]
        with s.snapshot() as snapshot:  # key order == tuple order
            ordered = s.codec.decode_keys([k for k, _ in s.iter_rows(snapshot)]).to_pylist()
        assert [(r["kind"], r["seq"]) for r in ordered] == [("", 5), ("a", 1), ("a", 2)]


def test_random_writes_match_a_model(bucket_dir):
    """Vectorized (distinct keys) and step-by-step (repeated keys) writes against a pure model."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    model: dict[int, str | None] = {}
    with BucketStore.open(bucket_dir, bucket_writer.TABLE, segment_bytes=1 << 20, fsync=False) as s:
        for i in range(150):
            ids, values, deletes = bucket_writer.write_ops(seed, i)
            n = len(ids) // 10 + 1  # smaller writes: more of them hit existing keys and repeat
            ids, values = ids[:n], values[:n]
            expected = expected_changes(model, ids, values, deletes)
            base, nxt = s.write(*bucket_writer.batches(ids, values, deletes))
            assert nxt - base == len(expected)
            if expected:
                [entry] = s.read_log(base, 1 << 30)[:1]
                assert entry_changes(s.codec, entry.records) == expected
        decoded = s.codec.decode_values(list(kv_rows(s).values())).to_pylist()
        assert {row["id"]: row["v"] for row in decoded} == model


class CountingDb:
    """A RocksDB handle that counts the keys its point lookups asked for."""

    def __init__(self, db) -> None:
        self.db, self.looked_up = db, 0

    def get(self, keys, *args, **kwargs):
        self.looked_up += len(keys) if isinstance(keys, list) else 1
        return self.db.get(keys, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_new_key_ranges_are_not_looked_up_and_before_images_stay_exact(bucket_dir):
    def counted(s: BucketStore) -> CountingDb:
        s._kv._db = CountingDb(s._kv._db)
        return s._kv._db

    def ids(a: int, b: int) -> pa.RecordBatch:
        return rows(*((i, f"n{i}", float(i)) for i in range(a, b)))

    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as s:
        db = counted(s)
        s.write(ids(100, 200))
        s.write(ids(0, 50))  # below everything stored: new keys, no lookup
        s.write(ids(50, 100))  # fills the gap exactly (fixed-width keys): still no lookup
        assert db.looked_up == 0
        base, _ = s.write(rows((150, "u", 1.0), (250, "new", 2.0), (7, "v", 3.0)), keys(60, 999))
        assert db.looked_up == 3  # 150, 7 and 60 lie inside [0, 199]; 250 and 999 do not
        assert changes(s, base) == [
            (base, UB, 150, (150, "n150", 150.0)), (base + 1, UA, 150, (150, "u", 1.0)),
            (base + 2, I, 250, (250, "new", 2.0)),
            (base + 3, UB, 7, (7, "n7", 7.0)), (base + 4, UA, 7, (7, "v", 3.0)),
            (base + 5, D, 60, (60, "n60", 60.0)),
        ]
    # reopened: the range is the first and last key stored
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as s:
        db = counted(s)
        base, _ = s.write(rows((300, "x", 0.0), (1, "y", 0.0)))
        assert db.looked_up == 1
        assert changes(s, base) == [(base, I, 300, (300, "x", 0.0)), (base + 1, UB, 1, (1, "n1", 1.0)),
                                    (base + 2, UA, 1, (1, "y", 0.0))]
        assert fold(log_records(s)) == kv_rows(s)


# --- rejected batches ------------------------------------------------------------------------

@pytest.mark.parametrize("upserts, deletes", [
    (pa.RecordBatch.from_arrays([pa.array([5], pa.uint64())], names=["id"]), None),  # wrong type (int32: a widening)
    (pa.RecordBatch.from_arrays([pa.array([5, None], pa.int64())], names=["id"]), None),  # null key
    (pa.RecordBatch.from_arrays([pa.array([5]), pa.array([1])], names=["id", "nope"]), None),  # unknown column
    (pa.RecordBatch.from_arrays([pa.array(["x"])], names=["name"]), None),  # no key column
    (None, pa.RecordBatch.from_arrays([pa.array([1, None], pa.int64())], names=["id"])),  # null delete key
    ("valid", pa.RecordBatch.from_arrays([pa.array(["1"])], names=["id"])),  # good upserts, bad deletes
    ([1, 2], None),  # not a RecordBatch
])
def test_a_rejected_batch_changes_nothing(store, upserts, deletes):
    store.write(rows((1, "a", 1.0), (2, "b", 2.0)))
    before_kv, before_log = kv_rows(store), store.list_offsets()
    if isinstance(upserts, str):
        upserts = rows((1, "changed", 0.0), (9, "new", 0.0))
    with pytest.raises(InvalidRowError):
        store.write(upserts, deletes)
    assert kv_rows(store) == before_kv
    assert store.list_offsets() == before_log
    assert store.write(rows((3, "c", 3.0))) == (2, 3)  # and the store still works


# --- lookups and log reads -----------------------------------------------------------------

def test_lookup_returns_found_mask_and_rows_in_input_order(store):
    store.write(rows((1, "a", 1.0), (2, None, None), (3, "c", 3.0)))
    found, got = store.lookup(keys(3, 7, 1, 2, 3))
    assert found.dtype == bool and found.tolist() == [True, False, True, True, True]
    assert got.to_pylist() == [{"id": 3, "name": "c", "score": 3.0}, {"id": 1, "name": "a", "score": 1.0},
                               {"id": 2, "name": None, "score": None}, {"id": 3, "name": "c", "score": 3.0}]
    found, got = store.lookup(keys(8, 9))
    assert found.tolist() == [False, False] and got.num_rows == 0 and got.schema == store.codec.schema
    found, got = store.lookup(keys())
    assert len(found) == 0 and got.num_rows == 0
    found, got = store.lookup(rows((1, "ignored", 0.0)))  # full rows are accepted as keys
    assert found.tolist() == [True] and got.to_pylist()[0]["name"] == "a"
    with pytest.raises(InvalidRowError):
        store.lookup(pa.RecordBatch.from_arrays([pa.array(["1"])], names=["id"]))


def test_lookup_values_are_the_stored_values_of_what_lookup_finds(bucket_dir):
    """The packed form's read (client/point_lookup.py): the same rows as lookup, as stored values, with the schema
    id lookup decodes them as; a key of another bucket refused, rows a row TTL expired not found."""
    from kvlease.common.codec import RowCodec
    from kvlease.common.row_ttl import row_ttl

    now = [10_000_000]
    table = TableInfo(3, "db", "users", (Column("id", "BIGINT"), Column("name", "STRING"), Column("ts", "BIGINT")),
                      ("id",), 4, row_ttl=row_ttl("1s", "ts"))
    codec = RowCodec(table)
    mine = [i for i in range(40) if int(codec.buckets(codec.encode_keys(keys(i)))[0]) == 1]
    other = next(i for i in range(40) if i not in mine)
    with BucketStore.open(bucket_dir, table, segment_bytes=1 << 20, fsync=False, bucket=1,
                          clock_ms=lambda: now[0]) as s:
        s.write(pa.RecordBatch.from_pylist([{"id": i, "name": f"n{i}", "ts": now[0] - (5000 if i % 2 else 0)}
                                            for i in mine[:6]], schema=codec.schema))
        asked = keys(*mine[::-1], *mine)  # every key of the bucket, some never written, each twice
        found, rows = s.lookup(asked)
        found_v, values, schema_id = s.lookup_values(codec.encode_keys(asked))
        assert found_v.tolist() == found.tolist() and schema_id == table.schema_id
        assert codec.decode_values(values).equals(rows)
        live = {i for i in mine[:6] if i % 2 == 0}  # odd ids expired
        assert 0 < len(live) < 6
        assert [r["id"] for r in rows.to_pylist()] == [i for i in [*mine[::-1], *mine] if i in live]
        with pytest.raises(InvalidRowError, match="belongs to bucket"):
            s.lookup_values(codec.encode_keys(keys(other)))


def test_lookup_values_of_a_few_keys_are_what_lookup_finds(bucket_dir):
    """At most FEW_KEYS keys of a table without a row TTL are read without numpy/Arrow (tablet/bucket/reads.py):
    the same found flags and stored values as the vectorized read, deleted and absent keys not found, a key of
    another bucket refused."""
    from kvlease.common.codec import RowCodec
    from kvlease.tablet.bucket.reads import FEW_KEYS

    table = TableInfo(3, "db", "users", (Column("id", "BIGINT"), Column("name", "STRING")), ("id",), 4)
    codec = RowCodec(table)
    mine = [i for i in range(60) if int(codec.buckets(codec.encode_keys(keys(i)))[0]) == 2]
    other = next(i for i in range(60) if i not in mine)
    with BucketStore.open(bucket_dir, table, segment_bytes=1 << 20, fsync=False, bucket=2) as s:
        s.write(pa.RecordBatch.from_pylist([{"id": i, "name": f"n{i}"} for i in mine[:6]], schema=codec.schema))
        s.write(deletes=keys(mine[1]))
        for asked in ([mine[0]], [mine[1]], [mine[7]], mine[:FEW_KEYS], [mine[0], mine[0], mine[2]]):
            found, rows = s.lookup(keys(*asked))
            found_v, values, schema_id = s.lookup_values(codec.encode_keys(keys(*asked)))
            assert isinstance(found_v, list) and isinstance(values, list) and schema_id == table.schema_id
            assert found_v == found.tolist() and codec.decode_values(values).equals(rows)
        with pytest.raises(InvalidRowError, match="belongs to bucket"):
            s.lookup_values(codec.encode_keys(keys(mine[0], other)))


def test_fetch_log_gives_raw_entries_and_the_end_offset(store):
    store.write(rows((1, "a", 1.0), (2, "b", 2.0)))
    store.write(rows((1, "A", 1.0)))
    entries, end = store.fetch_log(1, 1 << 20)
    assert end == 4 and len(entries) == 2
    first = decode_entry(entries[0], from_offset=1)
    assert (first.base_offset, first.next_offset) == (1, 2)
    assert decode_entry(entries[1]).records.column(0).to_pylist() == [ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER]
    assert store.fetch_log(4, 1 << 20) == ([], 4)


def test_each_write_is_stamped_by_the_stores_clock_and_found_by_time(bucket_dir):
    times = iter([1_000, 2_000, 3_000])
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False, clock_ms=lambda: next(times)) as s:
        s.write(rows((1, "a", 1.0)))  # offset 0
        s.write(deletes=keys(7))  # changes nothing: no entry, no time taken
        s.write(rows((1, "b", 1.0)))  # offsets 1, 2
        s.write(deletes=keys(1))  # offset 3
        assert [(e.base_offset, e.timestamp_ms) for e in s.read_log(0, 1 << 20)] == [(0, 1_000), (1, 2_000),
                                                                                     (3, 3_000)]
        assert [s.offset_for_timestamp(t) for t in (0, 1_000, 1_001, 2_000, 3_000, 3_001)] == [0, 0, 1, 1, 3, 4]
        entries, _ = s.fetch_log(2, 1 << 20)  # the raw entries carry it to clients
        assert [decode_entry(e, from_offset=2).timestamp_ms for e in entries] == [2_000, 3_000]


def expected_changes(model: dict[int, str | None], ids, values, deletes) -> list[tuple]:
    """The records a write should produce, step by step, applying it to ``model`` (id -> v)."""
    out = []
    for k, v in zip(ids, values):
        if k in model:
            out += [(UB, k, model[k]), (UA, k, v)]
        else:
            out.append((I, k, v))
        model[k] = v
    for k in deletes:
        if k in model:
            out.append((D, k, model.pop(k)))
    return out


def entry_changes(codec, records: pa.RecordBatch) -> list[tuple]:
    ids = codec.decode_keys(records.column(1)).column(0).to_pylist()
    decoded = codec.decode_values(records.column(2)).to_pylist()
    return [(ChangeType(ct).short, k, row["v"]) for ct, k, row in zip(records.column(0).to_pylist(), ids, decoded)
            if row["id"] == k]


# --- pipelined writes: the changelog fsync runs unlocked -----------------------------------------

def check_before_images(records: list[pa.RecordBatch]) -> dict[bytes, bytes]:
    """Replays the log in offset order, asserting every record fits the state before it; the end state."""
    model: dict[bytes, bytes] = {}
    for batch in records:
        for ct, key, value in zip(*(c.to_pylist() for c in batch.columns)):
            if ct == ChangeType.INSERT:
                assert key not in model, key
                model[key] = value
            elif ct in (ChangeType.UPDATE_BEFORE, ChangeType.DELETE):
                assert model.get(key) == value, key
                if ct == ChangeType.DELETE:
                    del model[key]
            else:
                assert key in model, key
                model[key] = value
    return model


@pytest.fixture
def slow_fsync(monkeypatch):
    """``os.fdatasync`` taking 20 ms (writes pile up behind one), counted; ``fail`` arms one OSError."""
    real = os.fdatasync
    state = {"calls": 0, "fail": False, "seen_in_flight": 0, "store": None}

    def fdatasync(fd):
        state["calls"] += 1
        if state["store"] is not None:
            state["seen_in_flight"] = max(state["seen_in_flight"], len(state["store"].writes._in_flight))
        if state["fail"]:
            state["fail"] = False
            raise OSError(5, "simulated EIO")
        time.sleep(0.02)  # a slow disk: the latency is the point
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return state


def test_concurrent_writes_overlap_their_fsyncs_and_keep_exact_before_images(bucket_dir, slow_fsync):
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=16 << 10, fsync=True) as store:
        slow_fsync["store"] = store
        acked: list[tuple[int, int]] = []
        errors: list[BaseException] = []

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for i in range(25):
                    if seed % 2:  # overlapping random keys, with deletes
                        ids = rng.sample(range(200), rng.randint(1, 30))
                        dels = keys(*rng.sample(range(200), rng.randint(0, 5)))
                    else:  # a range of new keys of its own
                        ids, dels = list(range(1000 * (seed + 1) + 30 * i, 1000 * (seed + 1) + 30 * i + 30)), None
                    acked.append(store.write(rows(*[(k, f"{seed}-{i}", None) for k in ids]), dels))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert slow_fsync["seen_in_flight"] >= 2  # a write was written while another one synced...
        assert slow_fsync["calls"] < len(acked)  # ...and one fsync covered several writes
        spans = sorted((b, n) for b, n in acked if n > b)
        assert [b for b, _ in spans] == [0] + [n for _, n in spans[:-1]]  # contiguous offsets, no overlap
        assert store.applied_offset == store.log_end_offset == spans[-1][1]
        assert check_before_images(log_records(store)) == kv_rows(store)


def test_a_failed_fsync_fails_the_write_and_the_store_and_a_reopen_is_consistent(bucket_dir, slow_fsync):
    store = BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=True)
    try:
        assert store.write(rows((1, "a", 1.0))) == (0, 1)
        slow_fsync["fail"] = True
        with pytest.raises(ChangelogError, match="fsync failed"):
            store.write(rows((2, "b", 2.0)))
        with pytest.raises(BucketStoreError, match="failed earlier"):
            store.write(rows((3, "c", 3.0)))
        assert store.lookup(keys(1, 2))[0].tolist() == [True, False]  # the failed write was never applied
    finally:
        store.close()
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=True) as store:
        # the entry reached the file, so it may come back (the write's outcome was an error, not a "no")
        assert set(state(store)) in ({1}, {1, 2})
        assert check_before_images(log_records(store)) == kv_rows(store)
        assert store.write(rows((3, "c", 3.0)))[1] == store.log_end_offset


def test_flushed_rows_are_stored_uncompressed_and_compacted_ones_lz4(tmp_path):
    """Level 0 (flushes) is uncompressed, the levels below LZ4 (tablet/store/kvstore.py _options)."""
    from kvlease.tablet.store.kvstore import KvStore

    store = KvStore(str(tmp_path / "kv"))
    try:
        keys = [i.to_bytes(8, "big") for i in range(20_000)]
        store.write(keys, [b"a" * 200] * len(keys), [], 1)  # very compressible: 4 MB of rows
        store.flush()

        def sst_bytes() -> int:
            return sum(f.stat().st_size for f in (tmp_path / "kv").glob("*.sst"))
        flushed = sst_bytes()
        assert flushed > 20_000 * 200  # as written
        store._db.compact_range(None, None)  # into the last level
        compacted = sst_bytes()
        assert compacted < flushed / 5, (flushed, compacted)
        assert store.get(keys[:2]) == [b"a" * 200] * 2
    finally:
        store.close()

