"""The wire form of kvlease's values: one place turns model objects and errors into protobufs and back.

Every response of every service carries an ``ErrorPb`` (code 0 = success);
servers build it with :func:`error_pb`, clients read it with
:func:`error_from_pb` / :func:`raise_for`. The other converters map the
shared vocabulary (:mod:`kvlease.common.model`, :mod:`kvlease.common.tables`) to messages.
A bucket is named by ``table_id`` and ``partition_id`` (unset: an
unpartitioned table's); :func:`physical_id` is the one id the servers keep a
bucket under (docs/partitions.md, "Partition ids").
"""

from __future__ import annotations

from typing import Iterable, Mapping

from google.protobuf.message import Message

from kvlease.common import errors
from kvlease.common.redaction import scrub
from kvlease.common.model import Lease, SnapshotFile, SnapshotHandle, TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.auto_partition import DEFAULT_TIME_ZONE, AutoPartition, TimeUnit
from kvlease.common.columns import UNASSIGNED
from kvlease.common.row_ttl import RowTtl
from kvlease.common.merge_engine import MergeEngine, parse_engine
from kvlease.common.tables import DEFAULT_MAX_PARTITIONS, Column, TableInfo, TableSpec


def error_pb(exc: errors.KvLeaseError) -> pb.ErrorPb:
    """The wire form of ``exc`` (with the active coordinator's address, if it names one); a credential the
    process holds never leaves in the message (:func:`kvlease.common.redaction.scrub`)."""
    return pb.ErrorPb(code=int(exc.code), message=scrub(exc.message),
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


def physical_id(msg: Message) -> int:
    """The physical table (common/tables.py) a message naming ``table_id`` and ``partition_id`` means: the
    partition's id when it names one, else the table's. For the requests of the cluster's own servers,
    which name only buckets they were told of."""
    return msg.partition_id if msg.HasField("partition_id") else msg.table_id


def partition_id_of(msg: Message) -> int | None:
    """A message's ``partition_id``; None when unset."""
    return msg.partition_id if msg.HasField("partition_id") else None


def table_to_pb(table: TableInfo) -> pb.TableInfoPb:
    """The wire form of a table, or of a partition's view of its table (``partition_id`` and ``partition_name``)."""
    msg = pb.TableInfoPb(
        table_id=table.table_id, database=table.database, name=table.name,
        columns=columns_to_pb(table.columns),
        primary_key=list(table.primary_key), buckets=table.buckets, created_ms=table.created_ms,
        replication_factor=table.replication_factor, min_insync_replicas=table.min_insync_replicas,
        partition_key=list(table.partition_key), partition_id=table.partition_id,
        partition_name=table.partition_name or "", schema_id=table.schema_id, comment=table.comment,
        past_schemas=[pb.PastSchemaPb(schema_id=sid, columns=columns_to_pb(columns))
                      for sid, columns in table.past_schemas], bucket_key=list(table.bucket_key))
    if table.partitioned:
        msg.max_partitions = table.max_partitions
    if table.auto_partition is not None:
        msg.auto_partition.CopyFrom(auto_partition_to_pb(table.auto_partition))
    if table.row_ttl is not None:
        msg.row_ttl.CopyFrom(row_ttl_to_pb(table.row_ttl))
    if table.merge_engine is not None:
        msg.merge_engine.CopyFrom(merge_engine_to_pb(table.merge_engine))
    return msg


def row_ttl_to_pb(ttl: RowTtl) -> pb.RowTtlPb:
    return pb.RowTtlPb(ttl_ms=ttl.ttl_ms, column=ttl.column, write_time=ttl.write_time, changelog=ttl.changelog)


def row_ttl_from_pb(msg: Message) -> RowTtl | None:
    """A message's ``row_ttl`` (None when unset); checked against the columns by ``validate_spec``."""
    if not msg.HasField("row_ttl"):
        return None
    t = msg.row_ttl
    return RowTtl(t.ttl_ms, t.column, t.write_time, t.changelog or "delete")


def merge_engine_to_pb(engine: MergeEngine) -> pb.MergeEnginePb:
    return pb.MergeEnginePb(kind=engine.kind.value, version_column=engine.version_column or "",
                            aggregates=[pb.AggregatePb(column=c, function=f) for c, f in engine.aggregates],
                            delete_behavior=engine.delete_behavior.value)


def merge_engine_from_pb(msg: Message) -> MergeEngine | None:
    """A message's ``merge_engine`` (None when unset); InvalidTableError for an unknown kind or option."""
    if not msg.HasField("merge_engine"):
        return None
    m = msg.merge_engine
    return parse_engine(m.kind, m.version_column or None, {a.column: a.function for a in m.aggregates},
                        m.delete_behavior or None if m.kind != "first_row" else None)


def auto_partition_to_pb(auto: AutoPartition) -> pb.AutoPartitionPb:
    return pb.AutoPartitionPb(time_unit=auto.unit.name, precreate=auto.precreate, retention=auto.retention,
                              time_zone=auto.time_zone)


def auto_partition_from_pb(msg: Message) -> AutoPartition | None:
    """A message's ``auto_partition`` (None when unset); InvalidTableError for a bad unit, zone or number."""
    if not msg.HasField("auto_partition"):
        return None
    a = msg.auto_partition
    return AutoPartition(TimeUnit.parse(a.time_unit), a.precreate, a.retention, a.time_zone or DEFAULT_TIME_ZONE)


def table_from_pb(msg: pb.TableInfoPb) -> TableInfo:
    """The table (or partition's view) :func:`table_to_pb` sent; InvalidTableError for bad auto-partitioning."""
    auto = auto_partition_from_pb(msg)
    view = msg.HasField("partition_id")  # a partition's view of its table
    return TableInfo(msg.table_id, msg.database, msg.name, columns_from_pb(msg.columns),
                     tuple(msg.primary_key), msg.buckets, msg.created_ms,
                     max(1, msg.replication_factor), max(1, msg.min_insync_replicas),
                     partition_key=tuple(msg.partition_key),
                     max_partitions=msg.max_partitions or DEFAULT_MAX_PARTITIONS, auto_partition=auto,
                     partition_id=msg.partition_id if view else None,
                     partition_name=msg.partition_name if view else None, schema_id=msg.schema_id or 1,
                     comment=msg.comment,
                     past_schemas=tuple((p.schema_id, columns_from_pb(p.columns)) for p in msg.past_schemas),
                     row_ttl=row_ttl_from_pb(msg), bucket_key=tuple(msg.bucket_key),
                     merge_engine=merge_engine_from_pb(msg))


def columns_to_pb(columns: Iterable[Column]) -> list[pb.ColumnPb]:
    """Columns on the wire: a column whose table has not numbered it yet (a create's) is sent without an id."""
    return [pb.ColumnPb(name=c.name, type=c.type, comment=c.comment, id=None if c.id == UNASSIGNED else c.id)
            for c in columns]


def columns_from_pb(msgs) -> tuple[Column, ...]:
    """The columns :func:`columns_to_pb` sent (one without an id: unassigned, its table numbers it by position)."""
    return tuple(Column(c.name, c.type, c.id if c.HasField("id") else UNASSIGNED, c.comment) for c in msgs)


def table_spec_from_pb(msg: pb.CreateTableRequest) -> TableSpec:
    """The table a create asks for (checked by the coordinator: common/tables.validate_spec)."""
    auto = auto_partition_from_pb(msg)
    return TableSpec(msg.database, msg.name, columns_from_pb(msg.columns),
                     tuple(msg.primary_key), msg.buckets, tuple(msg.partition_key),
                     msg.max_partitions if msg.HasField("max_partitions") else DEFAULT_MAX_PARTITIONS, auto,
                     row_ttl=row_ttl_from_pb(msg), bucket_key=tuple(msg.bucket_key),
                     merge_engine=merge_engine_from_pb(msg))


def table_spec_to_pb(spec: TableSpec, **fields) -> pb.CreateTableRequest:
    """A create request for ``spec`` (``fields``: the request's others)."""
    msg = pb.CreateTableRequest(database=spec.database, name=spec.name,
                                columns=columns_to_pb(spec.columns),
                                primary_key=list(spec.primary_key), buckets=spec.buckets,
                                partition_key=list(spec.partition_key), bucket_key=list(spec.bucket_key), **fields)
    if spec.partition_key:
        msg.max_partitions = spec.max_partitions
    if spec.auto_partition is not None:
        msg.auto_partition.CopyFrom(auto_partition_to_pb(spec.auto_partition))
    if spec.row_ttl is not None:
        msg.row_ttl.CopyFrom(row_ttl_to_pb(spec.row_ttl))
    if spec.merge_engine is not None:
        msg.merge_engine.CopyFrom(merge_engine_to_pb(spec.merge_engine))
    return msg


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


def add_bucket_snapshots(field, snapshots: Mapping[TableBucket, int]) -> None:
    """:func:`bucket_snapshots_to_pb` added to the repeated ``field`` in place: with upb's messages, filling
    entries the field made costs less than half of making messages and copying them in (4,000 entries of a
    ``lease acquire --latest`` answer: ~6 ms instead of ~14)."""
    add = field.add
    for tb, sid in sorted(snapshots.items(), key=lambda item: item[0].sort_key()):
        bucket = add(snapshot_id=sid).bucket
        bucket.table_id = tb.table_id
        bucket.bucket = tb.bucket
        if tb.partition_id is not None:
            bucket.partition_id = tb.partition_id


def bucket_snapshots_from_pb(msgs: Iterable[pb.BucketSnapshotPb]) -> dict[TableBucket, int]:
    """``bucket -> snapshot id`` (a bucket twice: the last). An acquire carries 4,000 of them for a table of
    1,000 partitions: read in one loop, :func:`bucket_from_pb` inlined (with upb's messages a field read
    costs less than the dict a ``ListFields()`` call makes; ``partition_id`` is set or not, and only a
    zero needs ``HasField`` to tell)."""
    out = {}
    for msg in msgs:
        b = msg.bucket
        pid = b.partition_id
        out[TableBucket(b.table_id, b.bucket, pid if pid or b.HasField("partition_id") else None)] = msg.snapshot_id
    return out


def lease_to_pb(lease: Lease) -> pb.KvSnapshotLeasePb:
    msg = pb.KvSnapshotLeasePb(lease_id=lease.lease_id, expiration_time_ms=lease.expiration_time,
                               owner=lease.owner or "")
    add_bucket_snapshots(msg.buckets, lease.buckets)
    return msg


def lease_from_pb(msg: pb.KvSnapshotLeasePb) -> Lease:
    return Lease(msg.lease_id, msg.expiration_time_ms, bucket_snapshots_from_pb(msg.buckets), owner=msg.owner or None)
