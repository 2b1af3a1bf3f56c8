"""Leases of partition buckets, as the pure lease machine sees them: a bucket names its partition, a
partition that is gone or of another table is refused, dropping one partition takes only its buckets out
of the leases that hold them, and the refcounts tell which partitions a lease holds (what retention asks:
coordinator/partitions.py)."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.leases.state import LeaseState, PersistLease, RemoveTable
from tests.support.lease_harness import MAX_MS, Harness, reply_of

pytestmark = pytest.mark.unit

TABLE, FLAT = 10, 20
P1, P2 = 11, 12  # partitions of TABLE, 2 buckets each


class PartitionCatalog:
    """TABLE is partitioned (P1, P2: 2 buckets each), FLAT is not (3 buckets)."""

    def __init__(self, store) -> None:
        self.store = store
        self.partitions = {P1: TABLE, P2: TABLE}

    def buckets_of(self, tb: TableBucket) -> tuple[str, int]:
        if tb.table_id == FLAT:
            if tb.partition_id is not None:
                raise errors.InvalidRequestError("table db.flat is not partitioned")
            return "table db.flat", 3
        if tb.table_id != TABLE:
            raise errors.TableNotExistError(f"table id {tb.table_id} does not exist", table_id=tb.table_id)
        if self.partitions.get(tb.partition_id) != TABLE:
            raise errors.PartitionNotExistsError(f"partition id {tb.partition_id} of table db.t does not exist")
        return f"table db.t partition p{tb.partition_id}", 2

    def has_snapshot(self, bucket: TableBucket, snapshot_id: int) -> bool:
        return self.store.has_snapshot(bucket, snapshot_id)


@pytest.fixture
def h():
    harness = Harness()
    harness.catalog = PartitionCatalog(harness.store)
    harness.state = LeaseState(harness.catalog, max_duration_ms=MAX_MS)
    return harness


def tb(partition: int | None, bucket: int, table: int = TABLE) -> TableBucket:
    return TableBucket(table, bucket, partition)


def test_a_lease_holds_buckets_of_several_partitions_and_the_refcounts_tell_which(h):
    for bucket in (tb(P1, 0), tb(P1, 1), tb(P2, 0)):
        h.commit(bucket, 1)
    h.lease("a", {tb(P1, 0): 1, tb(P2, 0): 1})
    h.lease("b", {tb(P1, 1): 1})
    assert h.state.refs.held_partitions(TABLE) == {P1: {"a", "b"}, P2: {"a"}}
    assert h.state.refs.holders_of_partition(TABLE, P2) == {"a"}
    assert h.state.refs.holders_of_partition(FLAT, P2) == set()


@pytest.mark.parametrize("bucket, error", [
    (tb(None, 0), errors.PartitionNotExistsError),  # a partitioned table's bucket names its partition
    (tb(99, 0), errors.PartitionNotExistsError),  # a partition that is not there (dropped)
    (tb(P1, 2), errors.BucketOutOfRangeError),
    (tb(P1, 0, table=FLAT), errors.InvalidRequestError),  # a partition of an unpartitioned table
])
def test_an_acquire_naming_a_wrong_partition_bucket_writes_nothing(h, bucket, error):
    out = h.handle(h.acquire("a", {bucket: 1}))
    assert isinstance(reply_of(out).error, error)
    assert not [i for i in out if isinstance(i, PersistLease)] and h.state.get("a") is None


def test_dropping_one_partition_takes_only_its_buckets_out_of_the_leases(h):
    for bucket in (tb(P1, 0), tb(P2, 0), tb(None, 1, table=FLAT)):
        h.commit(bucket, 1)
    h.lease("a", {tb(P1, 0): 1, tb(P2, 0): 1, tb(None, 1, table=FLAT): 1})
    h.lease("b", {tb(P1, 0): 1})
    h.run(RemoveTable(TABLE, P1, event_id=h.next_id()))
    assert h.state.get("a").buckets == {tb(P2, 0): 1, tb(None, 1, table=FLAT): 1}
    assert h.state.get("b") is None  # it held only the dropped partition
    assert h.state.refs.held_partitions(TABLE) == {P2: {"a"}}


def test_the_leases_and_leased_snapshots_per_partition_follow_acquires_releases_and_drops(h):
    """What kvlease_partition_leases / kvlease_partition_leased_snapshots publish: a lease counts once per
    partition it holds a bucket of; a partition no lease holds has no count (validate() recounts both)."""
    for bucket in (tb(P1, 0), tb(P1, 1), tb(P2, 0), tb(None, 0, table=FLAT)):
        h.commit(bucket, 1)
    h.commit(tb(P1, 0), 2)
    h.lease("a", {tb(P1, 0): 1, tb(P1, 1): 1, tb(P2, 0): 1, tb(None, 0, table=FLAT): 1})
    h.lease("b", {tb(P1, 0): 2})
    assert h.state.partition_lease_counts() == {(TABLE, P1): 2, (TABLE, P2): 1}  # FLAT is not partitioned
    assert h.state.refs.leased_count_by_partition() == {(TABLE, P1): 3, (TABLE, P2): 1}
    assert h.state.lease_counts() == (2, {TABLE: 2, FLAT: 1})
    h.run(h.release("a", tb(P2, 0)))
    assert h.state.partition_lease_counts() == {(TABLE, P1): 2}
    assert h.state.refs.leased_count_by_partition() == {(TABLE, P1): 3}
    h.run(RemoveTable(TABLE, P1, event_id=h.next_id()))
    assert h.state.partition_lease_counts() == {} and h.state.refs.leased_count_by_partition() == {}
    assert h.state.lease_counts() == (1, {FLAT: 1})
