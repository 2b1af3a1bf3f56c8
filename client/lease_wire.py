"""Snapshot listings and lease acquires to and from the wire, at a few microseconds a bucket.

``lease acquire --latest`` of a 1,000-partition table lists and acquires 4,000 buckets. Reading each
field of a protobuf message is a Python call of its own (a nested bucket message, ``HasField``, ...):
:func:`kvlease.common.wire.handle_from_pb` took ~20 us a snapshot, building a request entry from keyword
arguments ~10 us. Here each message is read in one loop body, no helper called per field (``HasField``
only for a ``partition_id`` of 0), and request entries are filled in place.
What comes out is what the :mod:`kvlease.common.wire` functions give (a test compares them).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from kvlease.client.admin_types import SnapshotInfo
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.wire import add_bucket_snapshots, bucket_snapshots_from_pb


def snapshot_infos(snapshots: Iterable[pb.KvSnapshotPb]) -> dict[TableBucket, SnapshotInfo]:
    """Each listed snapshot by its bucket (a bucket listed twice: the last one)."""
    out = {}
    for msg in snapshots:
        b = msg.bucket
        pid = b.partition_id
        tb = TableBucket(b.table_id, b.bucket, pid if pid or b.HasField("partition_id") else None)
        files = msg.files
        handle = SnapshotHandle(tb, msg.snapshot_id, msg.log_offset, msg.metadata_path,
                                tuple([SnapshotFile(x.path, x.size) for x in files]) if files else (),
                                msg.commit_time_ms)
        out[tb] = SnapshotInfo(handle, tuple(msg.leased_by), msg.retained)
    return out


def acquire_request(lease_id: str, snapshots: Mapping[TableBucket, int], duration_ms: int,
                    owner: str) -> pb.AcquireKvSnapshotLeaseRequest:
    """The acquire request, its buckets in :meth:`TableBucket.sort_key` order. Raises what protobuf raises for
    a bad value (TypeError, ValueError)."""
    request = pb.AcquireKvSnapshotLeaseRequest(lease_id=lease_id, duration_ms=duration_ms, owner=owner)
    add_bucket_snapshots(request.snapshots, snapshots)
    return request


def acquired(response: pb.AcquireKvSnapshotLeaseResponse, asked: Mapping[TableBucket, int]) -> dict[TableBucket, int]:
    """The snapshots an acquire answered it holds. The coordinator answers every snapshot asked for, in
    ``acquired`` or ``unavailable``: with none unavailable, ``acquired`` is what was asked (not read again)."""
    if not response.unavailable and len(response.acquired) == len(asked):
        return dict(asked)
    return bucket_snapshots_from_pb(response.acquired)
