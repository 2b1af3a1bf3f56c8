"""The per-bucket shortcuts of a lease's write give what the plain forms give: a table file's bytes are
``json.dumps``' of the documented layout (leases/store.py), a lease's grouped buckets are its buckets."""

from __future__ import annotations

import json

import pytest

from kvlease.common.model import Lease, TableBucket
from kvlease.leases.store import decode_table_file, encode_table_file

pytestmark = pytest.mark.unit


def plain_file(table_id: int, leases: dict[str, dict[TableBucket, int]]) -> bytes:
    rows = {lease_id: [{"partition_id": tb.partition_id, "bucket": tb.bucket, "snapshot_id": sid}
                       for tb, sid in sorted(buckets.items(), key=lambda item: item[0].sort_key())]
            for lease_id, buckets in leases.items()}
    return json.dumps({"version": 2, "table_id": table_id, "leases": rows}, separators=(",", ":")).encode()


@pytest.mark.parametrize("leases", [
    {"a": {TableBucket(7, 2): 5, TableBucket(7, 0): 3, TableBucket(7, 10): 0}},
    {"a": {TableBucket(7, b, p): 100 + b for p in (12, 9, 300) for b in (3, 0, 1)},
     "b.c_d-1": {TableBucket(7, 0, 0): 2 ** 40}},
    {},
])
def test_a_table_file_is_the_json_of_its_layout(leases):
    data = encode_table_file(7, leases)
    assert data == plain_file(7, leases)
    assert decode_table_file(data) == leases


def test_a_lease_groups_its_buckets_by_table_and_partition():
    buckets = {TableBucket(1, 0): 4, TableBucket(2, 1, 20): 5, TableBucket(2, 0, 21): 6, TableBucket(2, 3, 20): 7}
    lease = Lease("x", 10, buckets)
    assert lease.tables() == {1, 2}
    assert lease.partitions() == {(2, 20), (2, 21)}
    assert lease.table_buckets(2) == {tb: sid for tb, sid in buckets.items() if tb.table_id == 2}
    assert lease.table_buckets(3) == {}
    lease.tables().add(9)  # the answers are the caller's to change
    lease.table_buckets(1).clear()
    assert lease.tables() == {1, 2} and lease.table_buckets(1) == {TableBucket(1, 0): 4}
    assert lease == Lease("x", 10, dict(buckets))  # the groups are not fields


def test_a_table_bucket_is_a_value():
    tb = TableBucket(3, 1, 8)
    assert tb == TableBucket(table_id=3, bucket=1, partition_id=8) and hash(tb) == hash(TableBucket(3, 1, 8))
    assert TableBucket(3, 1) != TableBucket(3, 1, 8) and TableBucket(3, 1).partition_id is None
    assert sorted([TableBucket(3, 2), TableBucket(3, 1), TableBucket(2, 9)]) == [
        TableBucket(2, 9), TableBucket(3, 1), TableBucket(3, 2)]
    assert str(tb) == "3/p8/1" and tb.physical_id == 8 and TableBucket.from_json(tb.to_json()) == tb
    with pytest.raises(AttributeError):
        tb.bucket = 2  # type: ignore[misc]
