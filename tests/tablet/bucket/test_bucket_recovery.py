"""The bucket store after failures: replay after a lost RocksDB write, one store per directory,
changelog retention, and SIGKILL crashes of an acknowledging writer."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
from rocksdict import Options, Rdict

from kvlease.ops.local_cluster import dying_with_parent
from kvlease.tablet.bucket.store import APPLIED_KEY, META_CF, BucketStore, BucketStoreError
from kvlease.common.logentry import ChangelogError
from kvlease.tablet.log.changelog import Changelog
from tests.support import bucket_writer
from tests.support.procs import kill_after_reading
from tests.tablet.bucket.test_bucket import (  # noqa: F401 - the fixtures bucket_dir and store, and shared helpers
    D, I, PROJECT_ROOT, TABLE, TABLE2, UA, UB, bucket_dir, changes, entry_changes, expected_changes, fold, keys,
    kv_rows, log_records, rows, state, store)

pytestmark = pytest.mark.unit


# --- recovery ------------------------------------------------------------------------------

class SimulatedCrash(Exception):
    pass


def test_records_appended_but_not_applied_are_replayed_on_open(bucket_dir, monkeypatch):
    store = BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=True)
    store.write(rows((1, "a", 1.0), (2, "b", 2.0)))

    def crash(*args):
        raise SimulatedCrash()

    monkeypatch.setattr(store.writes, "_apply", crash)
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
from kvlease.tablet.bucket.store import BucketStore
from tests.tablet.bucket.test_bucket import TABLE, rows
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
            dying_with_parent([sys.executable, "-m", "tests.support.bucket_writer", bucket_dir, str(round_seed)]),
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        writers.append(proc)
        opened = proc.stdout.readline().split()
        assert opened[:1] == [b"open"], proc.stderr.read().decode()
        replayed_from, end = int(opened[1]), int(opened[2])
        assert replayed_from <= end and end >= last_end  # nothing acknowledged was lost
        replays += replayed_from < end
        lines = kill_after_reading(proc, rng.uniform(0.1, 1.5))
        acked = [tuple(map(int, line.split())) for line in lines]
        for i, (n, base, nxt) in enumerate(acked):
            assert n == i and base == (acked[i - 1][2] if i else end)
            writes.append((round_seed, n, (base, nxt)))
        # the write in flight at the kill may or may not have reached the changelog
        writes.append((round_seed, len(acked), None))
        last_end = acked[-1][2] if acked else end

        with BucketStore.open(bucket_dir, table, segment_bytes=bucket_writer.SEGMENT_BYTES, fsync=True) as store:
            assert store.applied_offset == store.log_end_offset >= last_end
            entries = store.read_log(0, 1 << 30)
            model, kept = _walk_log_with_model(store, entries, writes)
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


def _walk_log_with_model(store, entries, writes) -> tuple[dict[int, str | None], list]:
    """Walk the log with a model: each write's entry holds exactly its expected records. Returns the
    model and the writes that made it (the unacknowledged ones that reached the log with their offsets)."""
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
    return model, kept
