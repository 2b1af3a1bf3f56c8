"""The bucket store: change records with before-images, rejected batches, lookups, snapshots,
checkpoints, replay after a lost RocksDB write, retention, and SIGKILL crashes (slow)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest
from rocksdict import AccessType, Options, Rdict

from common.errors import InvalidRequestError, InvalidRowError
from common.tables import Column, TableInfo
from ops.zookeeper import dying_with_parent
from tablet.bucket import APPLIED_KEY, META_CF, BucketStore, BucketStoreError, checkpoint_log_offset
from common.logentry import ChangeType, ChangelogError, decode_entry
from tablet.changelog import Changelog
from tests import bucket_writer

pytestmark = pytest.mark.unit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
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


# --- rejected batches ------------------------------------------------------------------------

@pytest.mark.parametrize("upserts, deletes", [
    (pa.RecordBatch.from_arrays([pa.array([5], pa.int32())], names=["id"]), None),  # wrong type
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


def test_fetch_log_gives_raw_entries_and_the_end_offset(store):
    store.write(rows((1, "a", 1.0), (2, "b", 2.0)))
    store.write(rows((1, "A", 1.0)))
    entries, end = store.fetch_log(1, 1 << 20)
    assert end == 4 and len(entries) == 2
    first = decode_entry(entries[0], from_offset=1)
    assert (first.base_offset, first.next_offset) == (1, 2)
    assert decode_entry(entries[1]).records.column(0).to_pylist() == [ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER]
    assert store.fetch_log(4, 1 << 20) == ([], 4)


# --- snapshots ---------------------------------------------------------------------------------

def test_snapshot_is_consistent_and_carries_the_log_offset(store):
    store.write(rows(*[(i, f"n{i}", float(i)) for i in range(10)]))
    snapshot = store.snapshot()
    assert snapshot.log_offset == store.log_end_offset == 10
    expected = kv_rows(store)
    store.write(rows((3, "changed", 0.0), (100, "new", 0.0)), keys(0, 5))
    store._kv.flush_rows()  # also after a flush
    assert dict(store.iter_rows(snapshot)) == expected
    # key ranges: from_key inclusive, upper exclusive, resume with key + b"\0"
    ordered = sorted(expected)
    assert [k for k, _ in store.iter_rows(snapshot, from_key=ordered[2], upper=ordered[5])] == ordered[2:5]
    assert [k for k, _ in store.iter_rows(snapshot, from_key=ordered[8] + b"\x00")] == ordered[9:]
    assert list(store.iter_rows(snapshot, from_key=b"\xff" * 9)) == []
    snapshot.close()
    with pytest.raises(BucketStoreError, match="closed"):
        list(store.iter_rows(snapshot))


def test_snapshot_reads_many_rows_and_a_new_iter_rows_ends_the_old_one(store):
    store.write(rows(*[(i, "x" * 10, None) for i in range(3000)]))
    with store.snapshot() as snapshot:
        first = store.iter_rows(snapshot)
        assert len([next(first) for _ in range(5)]) == 5
        assert sum(1 for _ in store.iter_rows(snapshot)) == 3000
        with pytest.raises(BucketStoreError, match="re-positioned"):
            list(first)


def test_snapshot_of_an_empty_bucket(store):
    with store.snapshot() as snapshot:
        assert snapshot.log_offset == 0
        assert list(store.iter_rows(snapshot)) == []


def test_snapshots_under_concurrent_writes_match_the_log_prefix(store):
    """Snapshot + log offset are taken atomically: the rows equal the fold of the log below the offset."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                ids = rng.sample(range(300), rng.randint(1, 40))
                store.write(rows(*[(i, f"{seed}-{rng.random()}", None) for i in ids]),
                            keys(*rng.sample(range(300), rng.randint(0, 10))))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(2)]
    for t in threads:
        t.start()
    try:
        checked = 0
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline or checked < 5:
            with store.snapshot() as snapshot:
                seen = dict(store.iter_rows(snapshot))
                offset = snapshot.log_offset
            records = log_records(store)
            prefix, total = [], 0
            for r in records:
                if total >= offset:
                    break
                prefix.append(r.slice(0, offset - total))
                total += r.num_rows
            assert fold(prefix) == seen
            checked += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors


# --- checkpoints -------------------------------------------------------------------------------

def read_checkpoint(path: str) -> dict[bytes, bytes]:
    db = Rdict(path, Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return dict(db.items())
    finally:
        db.close()


def test_checkpoint_plus_changelog_from_its_offset_is_the_current_state(store, bucket_dir):
    store.write(rows(*[(i, f"n{i}", float(i)) for i in range(50)]))
    store.write(rows((3, "three", 3.3)), keys(4))
    target = os.path.join(bucket_dir, "cp1")
    offset = store.checkpoint(target)
    assert offset == store.log_end_offset == 53
    assert checkpoint_log_offset(target) == offset
    store.write(rows((3, "again", 0.0), (60, "new", 0.0)), keys(5, 6, 60))
    store.write(rows((5, "back", 5.0)))
    restored = fold(log_records(store, offset), initial=read_checkpoint(target))
    assert restored == kv_rows(store)
    # not a hit by accident: the checkpoint alone is the old state
    assert read_checkpoint(target) != kv_rows(store)
    with pytest.raises(InvalidRequestError, match="exists"):
        store.checkpoint(target)


def test_checkpoint_of_an_empty_bucket(store, bucket_dir):
    target = os.path.join(bucket_dir, "cp0")
    assert store.checkpoint(target) == 0
    assert read_checkpoint(target) == {} and checkpoint_log_offset(target) == 0


# --- recovery ------------------------------------------------------------------------------

class SimulatedCrash(Exception):
    pass


def test_records_appended_but_not_applied_are_replayed_on_open(bucket_dir, monkeypatch):
    store = BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=True)
    store.write(rows((1, "a", 1.0), (2, "b", 2.0)))

    def crash(*args):
        raise SimulatedCrash()

    monkeypatch.setattr(store, "_apply", crash)
    with pytest.raises(BucketStoreError, match="reopen") as info:
        store.write(rows((1, "A", 1.5), (3, "c", 3.0)), keys(2))
    assert isinstance(info.value.__cause__, SimulatedCrash)
    assert store.log_end_offset == 6 and store.applied_offset == 2
    assert store.lookup(keys(3))[0].tolist() == [False]  # not in RocksDB
    with pytest.raises(BucketStoreError, match="failed earlier"):
        store.write(rows((4, "d", 4.0)))
    store.close()

    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=True) as store:
        assert store.applied_offset == store.log_end_offset == 6
        assert state(store) == {1: (1, "A", 1.5), 3: (3, "c", 3.0)}
        assert fold(log_records(store)) == kv_rows(store)
        assert store.write(rows((4, "d", 4.0))) == (6, 7)


def set_applied(bucket_dir: str, offset: int) -> None:
    db = Rdict(os.path.join(bucket_dir, "kv"), Options(raw_mode=True), column_families={META_CF: Options(raw_mode=True)})
    try:
        db.get_column_family(META_CF).put(APPLIED_KEY, offset.to_bytes(8, "big"))
    finally:
        db.close()


def test_replay_is_idempotent_when_rows_are_ahead_of_the_applied_offset(bucket_dir):
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as store:
        store.write(rows((1, "a", 1.0), (2, "b", 2.0)))
        store.write(rows((1, "A", 1.0)), keys(2))
        store.write(rows((2, "again", 2.0)))
        expected = kv_rows(store)
    set_applied(bucket_dir, 0)  # RocksDB rows are at offset 6, its applied offset says 0
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as store:
        assert store.applied_offset == 6
        assert kv_rows(store) == expected


def test_rocksdb_ahead_of_the_changelog_is_an_error(bucket_dir):
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as store:
        store.write(rows((1, "a", 1.0)))
    set_applied(bucket_dir, 5)
    with pytest.raises(BucketStoreError, match="up to offset 5 but the changelog ends at 1"):
        BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False)
    # the failed open released everything: the changelog can be opened again
    Changelog(os.path.join(bucket_dir, "log"), segment_bytes=1 << 20).close()


def test_one_store_per_directory_and_closed_stores_refuse(bucket_dir):
    store = BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False)
    with pytest.raises(ChangelogError, match="another"):
        BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False)
    snapshot = store.snapshot()  # still referenced when the store closes
    store.close()
    store.close()  # idempotent
    assert snapshot.closed
    for call in (lambda: store.write(rows((1, "a", 1.0))), lambda: store.lookup(keys(1)), store.snapshot):
        with pytest.raises(BucketStoreError, match="closed"):
            call()
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False):  # RocksDB's lock was released
        pass


# --- retention -------------------------------------------------------------------------------

_TRUNCATE_THEN_DIE = """
import os, sys
from tablet.bucket import BucketStore
from tests.test_bucket import TABLE, rows
store = BucketStore.open(sys.argv[1], TABLE, segment_bytes=4096, fsync=True)
for i in range(40):
    store.write(rows(*[(i * 10 + j, "v" * 50, float(i)) for j in range(10)]))
store.write(rows((0, "updated", 0.0)))
print(store.truncate_log_before(store.log_end_offset), store.list_offsets()[0], flush=True)
os._exit(0)  # no close: memtables are lost, only what truncate_log_before flushed remains
"""


def test_truncate_log_before_flushes_rocksdb_first(bucket_dir):
    result = subprocess.run([sys.executable, "-c", _TRUNCATE_THEN_DIE, bucket_dir], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    deleted, start = map(int, result.stdout.split())
    assert deleted > 0 and start > 0
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=4096, fsync=True) as store:
        assert store.list_offsets() == (start, 402)
        assert store.applied_offset == 402
        current = state(store)
        assert len(current) == 400 and current[0] == (0, "updated", 0.0)


def test_truncate_log_before_never_passes_the_applied_offset(bucket_dir):
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=4096, fsync=False) as store:
        for i in range(30):
            store.write(rows(*[(i * 100 + j, "x" * 100, None) for j in range(100)]))
        segments = store.log_segments()
        assert len(segments) == 30  # one write per segment
        assert store.truncate_log_before(10 ** 9) == 29  # capped at the applied offset; the active one stays
        assert store.list_offsets() == (segments[-1].base_offset, store.applied_offset)
        assert store.truncate_log_before(0) == 0
        assert len(state(store)) == 3000


# --- crash test: SIGKILL a writer that acknowledges each write ------------------------------------

@pytest.fixture
def writers() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


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


@pytest.mark.slow
def test_every_acknowledged_write_survives_sigkill(bucket_dir, writers):
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    table = bucket_writer.TABLE
    # every write that reached the changelog, in order: (seed, i, acknowledged (base, next) or None)
    writes: list[tuple[int, int, tuple[int, int] | None]] = []
    last_end = replays = 0
    for round_ in range(5):
        round_seed = seed + round_
        proc = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "tests.bucket_writer", bucket_dir, str(round_seed)]),
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        writers.append(proc)
        opened = proc.stdout.readline().split()
        assert opened[:1] == [b"open"], proc.stderr.read().decode()
        replayed_from, end = int(opened[1]), int(opened[2])
        assert replayed_from <= end and end >= last_end  # nothing acknowledged was lost
        replays += replayed_from < end
        deadline = time.monotonic() + rng.uniform(0.1, 1.5)
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line.endswith(b"\n"), f"writer died: {proc.stderr.read().decode()}"
            lines.append(line)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        lines += proc.stdout.read().splitlines(keepends=True)  # acks still in the pipe
        acked = [tuple(map(int, line.split())) for line in lines if line.endswith(b"\n")]
        for i, (n, base, nxt) in enumerate(acked):
            assert n == i and base == (acked[i - 1][2] if i else end)
            writes.append((round_seed, n, (base, nxt)))
        # the write in flight at the kill may or may not have reached the changelog
        writes.append((round_seed, len(acked), None))
        last_end = acked[-1][2] if acked else end

        with BucketStore.open(bucket_dir, table, segment_bytes=bucket_writer.SEGMENT_BYTES, fsync=True) as store:
            assert store.applied_offset == store.log_end_offset >= last_end
            entries = store.read_log(0, 1 << 30)
            # Walk the log with a model: each write's entry holds exactly its expected records.
            model: dict[int, str | None] = {}
            position, kept = 0, []
            for w_seed, n, ack in writes:
                ops = bucket_writer.write_ops(w_seed, n)
                trial = dict(model)
                expected = expected_changes(trial, *ops)
                in_log = position < len(entries) and (ack is not None or (
                    expected and entry_changes(store.codec, entries[position].records) == expected))
                if ack is not None:
                    if expected:
                        entry = entries[position]
                        assert (entry.base_offset, entry.next_offset) == ack
                        assert entry_changes(store.codec, entry.records) == expected
                        position += 1
                    else:
                        assert ack[0] == ack[1]
                    model = trial
                    kept.append((w_seed, n, ack))
                elif in_log:  # the unacknowledged write made it: it counts from now on
                    model = trial
                    position += 1
                    entry = entries[position - 1]
                    kept.append((w_seed, n, (entry.base_offset, entry.next_offset)))
            assert position == len(entries), "the changelog holds writes nobody made"
            in_flight = "in the log" if kept and kept[-1][:2] == (round_seed, len(acked)) else "lost"
            print(f"round {round_}: opened at {end} (replayed from {replayed_from}), {len(acked)} writes "
                  f"acknowledged, reopened at {store.replayed} (replayed from, end), in-flight write {in_flight}")
            replays += store.replayed[0] < store.replayed[1]
            writes = kept
            # the KV (a full scan) == the fold of the changelog == the model
            kv = kv_rows(store)
            assert kv == fold([e.records for e in entries])
            decoded = store.codec.decode_values(list(kv.values())).to_pylist()
            assert {row["id"]: row["v"] for row in decoded} == model
            last_end = store.log_end_offset
    assert replays, "no open had to replay the changelog: the test did not exercise recovery"
