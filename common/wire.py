"""The wire form of kvlease's values: one place turns model objects and errors into protobufs and back.

Every response of every service carries an ``ErrorPb`` (code 0 = success);
servers build it with :func:`error_pb`, clients read it with
:func:`error_from_pb` / :func:`raise_for`. The other converters map the
shared vocabulary (:mod:`common.model`, :mod:`common.tables`) to messages.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from common import errors
from common.model import Lease, SnapshotFile, SnapshotHandle, TableBucket
from common.proto import coordinator_pb2 as pb
from common.tables import Column, TableInfo


def error_pb(exc: errors.KvLeaseError) -> pb.ErrorPb:
    """The wire form of ``exc`` (with the active coordinator's address, if it names one)."""
    return pb.ErrorPb(code=int(exc.code), message=exc.message,
                      active_address=str(exc.details.get("active_address", "") or ""))


def error_from_pb(error: pb.ErrorPb) -> errors.KvLeaseError | None:
    """The typed exception for a response's error; None for success."""
    if not error.code:
        return None
    if error.active_address:
        return errors.error_for(error.code, error.message, active_address=error.active_address)
    return errors.error_for(error.code, error.message)


def raise_for(error: pb.ErrorPb) -> None:
    """Raise the typed exception for a response's error, if any."""
    exc = error_from_pb(error)
    if exc is not None:
        raise exc


def bucket_to_pb(tb: TableBucket) -> pb.TableBucketPb:
    msg = pb.TableBucketPb(table_id=tb.table_id, bucket=tb.bucket)
    if tb.partition_id is not None:
        msg.partition_id = tb.partition_id
    return msg


def bucket_from_pb(msg: pb.TableBucketPb) -> TableBucket:
    return TableBucket(msg.table_id, msg.bucket, msg.partition_id if msg.HasField("partition_id") else None)


def table_to_pb(table: TableInfo) -> pb.TableInfoPb:
    return pb.TableInfoPb(
        table_id=table.table_id, database=table.database, name=table.name,
        columns=[{"name": c.name, "type": c.type} for c in table.columns],
        primary_key=list(table.primary_key), buckets=table.buckets, created_ms=table.created_ms)


def table_from_pb(msg: pb.TableInfoPb) -> TableInfo:
    return TableInfo(msg.table_id, msg.database, msg.name, tuple(Column(c.name, c.type) for c in msg.columns),
                     tuple(msg.primary_key), msg.buckets, msg.created_ms)


def handle_to_pb(handle: SnapshotHandle, leased_by: Iterable[str] = (), retained: bool = True) -> pb.KvSnapshotPb:
    return pb.KvSnapshotPb(
        bucket=bucket_to_pb(handle.bucket), snapshot_id=handle.snapshot_id,
        log_offset=handle.log_offset, metadata_path=handle.metadata_path,
        files=[pb.SnapshotFilePb(path=f.path, size=f.size) for f in handle.files],
        commit_time_ms=handle.commit_time_ms, leased_by=sorted(leased_by), retained=retained)


def handle_from_pb(msg: pb.KvSnapshotPb) -> SnapshotHandle:
    return SnapshotHandle(bucket_from_pb(msg.bucket), msg.snapshot_id, msg.log_offset, msg.metadata_path,
                          tuple(SnapshotFile(f.path, f.size) for f in msg.files), msg.commit_time_ms)


def bucket_snapshots_to_pb(snapshots: Mapping[TableBucket, int]) -> list[pb.BucketSnapshotPb]:
    return [pb.BucketSnapshotPb(bucket=bucket_to_pb(tb), snapshot_id=sid)
            for tb, sid in sorted(snapshots.items(), key=lambda item: item[0].sort_key())]


def bucket_snapshots_from_pb(msgs: Iterable[pb.BucketSnapshotPb]) -> dict[TableBucket, int]:
    return {bucket_from_pb(b.bucket): b.snapshot_id for b in msgs}


def lease_to_pb(lease: Lease) -> pb.KvSnapshotLeasePb:
    return pb.KvSnapshotLeasePb(lease_id=lease.lease_id, expiration_time_ms=lease.expiration_time,
                                buckets=bucket_snapshots_to_pb(lease.buckets))


def lease_from_pb(msg: pb.KvSnapshotLeasePb) -> Lease:
    return Lease(msg.lease_id, msg.expiration_time_ms, bucket_snapshots_from_pb(msg.buckets))
