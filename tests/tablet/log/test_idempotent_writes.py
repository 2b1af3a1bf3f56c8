"""Idempotent writes: a writer's batch is appended once, whatever how often it is sent.

The bucket store alone (real RocksDB and changelog in a temp dir), then a tablet
server over real gRPC whose first answer is lost (slower than the client's
timeout): the client sends the batch again and gets the original offsets, and
the changelog holds it once.
"""

from __future__ import annotations

import threading
import time

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from kvlease.tablet.bucket.store import BucketStore
from tests.support.local_cluster import LocalCluster
from tests.tablet.bucket.test_bucket import TABLE, bucket_dir, changes, keys, kv_rows, rows  # noqa: F401 (fixture)


def entries(store: BucketStore) -> list[tuple[int, int, int, int]]:
    """``(base_offset, count, writer_id, sequence)`` of every changelog entry."""
    return [(e.base_offset, e.count, e.writer_id, e.sequence) for e in store.read_log(0, 1 << 30)] \
        if store.log_end_offset else []


@pytest.mark.unit
def test_a_resent_batch_is_answered_with_its_offsets_and_not_appended_again(bucket_dir):
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as store:
        first = store.write(rows((1, "a", 1.0), (2, "b", 2.0)), writer=(77, 0))
        assert first == (0, 2)
        assert store.write(rows((1, "a", 1.0), (2, "b", 2.0)), writer=(77, 0)) == first  # resent
        assert store.write(rows((1, "a2", 1.0)), writer=(77, 1)) == (2, 4)  # -U +U
        assert store.write(rows((1, "a2", 1.0)), writer=(77, 1)) == (2, 4)
        assert store.write(rows((9, "x", 0.0))) == (4, 5)  # not idempotent: appended as always
        assert entries(store) == [(0, 2, 77, 0), (2, 2, 77, 1), (4, 1, -1, -1)]
        with pytest.raises(errors.OutOfOrderSequenceError, match="expected batch 2"):
            store.write(rows((3, "gap", 0.0)), writer=(77, 3))
        with pytest.raises(errors.OutOfOrderSequenceError, match="expected batch 0"):
            store.write(rows((3, "new", 0.0)), writer=(78, 5))  # a writer it does not know starts at 0
        assert store.log_end_offset == 5 and 3 not in {r[2] for r in changes(store)}
        # a write that changes nothing appends nothing and takes no number
        assert store.write(deletes=keys(404), writer=(77, 2)) == (5, 5)
        assert store.write(rows((4, "d", 0.0)), writer=(77, 2)) == (5, 6)


@pytest.mark.unit
def test_a_reopened_store_knows_its_writers_from_the_changelog(bucket_dir):
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as store:
        for seq in range(7):  # more batches than the window of remembered ones
            store.write(rows((seq, f"v{seq}", 0.0)), writer=(5, seq))
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as store:
        assert store.write(rows((6, "v6", 0.0)), writer=(5, 6)) == (6, 7)  # the last one, resent
        assert store.writers.builds == 1
        assert store.write(rows((7, "v7", 0.0)), writer=(5, 7)) == (7, 8)
        with pytest.raises(errors.OutOfOrderSequenceError):
            store.write(rows((0, "v0", 0.0)), writer=(5, 0))  # older than the window: refused, not re-applied
        assert store.log_end_offset == 8 and store.writers.builds == 1


@pytest.mark.unit
def test_a_duplicate_of_a_batch_still_being_written_waits_for_it(bucket_dir):
    with BucketStore.open(bucket_dir, TABLE, segment_bytes=1 << 20, fsync=False) as store:
        syncing, release = threading.Event(), threading.Event()
        changelog = store.files.changelog
        original_sync = changelog.sync

        def slow_sync(pending):  # the first write is written but not yet published
            syncing.set()
            release.wait(5)
            return original_sync(pending)
        changelog.sync = slow_sync
        checks = []  # the outcomes of writer 9's sequence checks: the first write's, then the resent one's
        original_check = store.writers.check

        def check(*args):
            checks.append(original_check(*args))
            return checks[-1]
        store.writers.check = check
        answers = []
        first = threading.Thread(target=lambda: answers.append(store.write(rows((1, "a", 0.0)), writer=(9, 0))))
        first.start()
        assert syncing.wait(5)
        resent = threading.Thread(target=lambda: answers.append(store.write(rows((1, "a", 0.0)), writer=(9, 0))))
        resent.start()
        # the resend waits for the original (the same keys, in flight) before its duplicate check, which then
        # finds it appended: it answers its offsets once it is published
        wait_until(lambda: len(store.writes._settled._waiters) == 1, 5, "the resent batch to wait for its original")
        time.sleep(0.2)  # a negative check: a resend that did not wait for its original would have answered by now
        assert answers == []  # the resent one does not answer before the original is published
        release.set()
        first.join(5)
        resent.join(5)
        assert answers == [(0, 1), (0, 1)] and store.log_end_offset == 1
        assert [type(c).__name__ for c in checks][-1] == "Duplicate"  # the resend's check found the original


@pytest.mark.zk
def test_a_write_whose_answer_was_lost_is_applied_once(make_config, tmp_path):
    cluster = LocalCluster(make_config, tmp_path, 1)
    try:
        cluster.create_table("db.idem", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 1)
        tablet = cluster.tablets[1]
        with TableClient(cluster.admin, "db.idem", retry_total_s=20, request_timeout_s=0.5) as client:
            client.upsert([{"id": 0, "v": "warm"}])
            store = tablet.replicas.replicas()[0].store
            real_write, calls, resent = store.write, [], threading.Event()

            def write_then_stall(*args, **kwargs):  # the first answer comes after the client gave up on it and
                answer = real_write(*args, **kwargs)  # sent the batch again
                calls.append(kwargs.get("writer"))
                if len(calls) == 1:
                    resent.wait(30)
                else:
                    resent.set()
                return answer
            store.write = write_then_stall
            offsets = client.upsert([{"id": i, "v": f"v{i}"} for i in range(1, 4)])
            store.write = real_write
            assert len(calls) >= 2 and len(set(calls)) == 1  # sent again as the same batch of the same writer
            assert offsets == {0: (1, 4)}
            records, end = client.fetch_log(0, 0)
            assert [r["row"]["id"] for r in records] == [0, 1, 2, 3] and end == 4  # once each
    finally:
        cluster.close()
