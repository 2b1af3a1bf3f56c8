"""A bucket on a disk that fills up: its writes fail, then, once space is freed, it reopens by itself
after a backoff and keeps every acknowledged write. A real small tmpfs (root only; skipped otherwise)."""

from __future__ import annotations

import pytest

from common.errors import KvLeaseError
from tablet.bucket import BucketStore, BucketStoreError
from tablet.bucket_files import Backoff
from tests.fixtures.small_disk import fill, small_disk
from tests.test_bucket import TABLE, fold, keys, kv_rows, log_records, rows, state

pytestmark = pytest.mark.unit

PAYLOAD = "x" * 2000  # ~100 KB per write of 50 rows


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write_until_full(store: BucketStore, acked: dict[int, str], start: int) -> KvLeaseError:
    """Write 50 rows at a time until a write fails; record the acknowledged rows; return the error."""
    for i in range(start, start + 10_000):
        batch = {i * 50 + j: f"{i}-{PAYLOAD}" for j in range(50)}
        try:
            store.write(rows(*[(k, v, None) for k, v in batch.items()]))
        except KvLeaseError as exc:
            return exc
        acked.update(batch)
    raise AssertionError("the disk never filled up")


@pytest.mark.parametrize("memtable_bytes", [None, 256 << 10], ids=["changelog-fills", "rocksdb-flushes-too"])
def test_a_bucket_failed_on_a_full_disk_reopens_by_itself_and_keeps_acknowledged_writes(tmp_path, memtable_bytes):
    with small_disk(tmp_path / "disk", size_mb=30) as disk:
        clock = Clock()
        store = BucketStore.open(str(disk / "bucket"), TABLE, segment_bytes=4 << 20, fsync=True,
                                 memtable_bytes=memtable_bytes, backoff=Backoff(1.0, 8.0), monotonic=clock)
        try:
            acked: dict[int, str] = {}
            filler = fill(disk, leave_bytes=2 << 20)
            write_until_full(store, acked, 0)
            assert acked  # some writes fit
            with pytest.raises(BucketStoreError, match="failed earlier.*reopened in 1.0s"):
                store.write(rows((1, "refused", None)))
            found, _ = store.lookup(keys(*list(acked)[:10]))
            assert found.all()  # reads go on

            # the backoff passed, the disk is still full: the reopen (or the write after it) fails again
            second = fill(disk, leave_bytes=0, name="filler2")
            clock.now += 1.0
            with pytest.raises(KvLeaseError):
                store.write(rows(*[(10**6 + j, PAYLOAD, None) for j in range(50)]))
            with pytest.raises(KvLeaseError, match="in 2.0s"):  # the backoff doubled
                store.write(rows((1, "refused", None)))

            filler.unlink()
            second.unlink()
            clock.now += 2.0
            assert store.write(rows((10**7, "after", None)))[1] == store.log_end_offset
            acked[10**7] = "after"
            got = state(store)
            assert {k: got[k][1] for k in acked} == acked
            assert fold(log_records(store)) == kv_rows(store)
        finally:
            store.close()
        with BucketStore.open(str(disk / "bucket"), TABLE, segment_bytes=4 << 20, fsync=True) as reopened:
            got = state(reopened)
            assert {k: got[k][1] for k in acked} == acked
