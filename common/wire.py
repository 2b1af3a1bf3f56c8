"""The wire form of kvlease's values: one place turns model objects and errors into protobufs and back.

Every response of every service carries an ``ErrorPb`` (code 0 = success);
servers build it with :func:`error_pb`, clients read it with
:func:`error_from_pb` / :func:`raise_for`. The other converters map the
shared vocabulary (:mod:`kvlease.common.model`, :mod:`kvlease.common.tables`) to messages.
:func:`refusing_partition_ids` makes both services refuse a request naming a
partition (there are no partitioned tables yet).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Mapping

from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from kvlease.common import errors
from kvlease.common.redaction import scrub
from kvlease.common.model import Lease, SnapshotFile, SnapshotHandle, TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.auto_partition import DEFAULT_TIME_ZONE, AutoPartition, TimeUnit
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


def _auto_partition_pb(auto: AutoPartition) -> pb.AutoPartitionPb:
    return pb.AutoPartitionPb(time_unit=auto.unit.name, precreate=auto.precreate, retention=auto.retention,
                              time_zone=auto.time_zone)


def _auto_partition_from_pb(msg: pb.AutoPartitionPb) -> AutoPartition:
    return AutoPartition(TimeUnit.parse(msg.time_unit), msg.precreate, msg.retention,
                         msg.time_zone or DEFAULT_TIME_ZONE)


def table_to_pb(table: TableInfo) -> pb.TableInfoPb:
    """A table, with its partitioning (docs/partitions.md); a partition's view also with its id and name."""
    msg = pb.TableInfoPb(
        table_id=table.table_id, database=table.database, name=table.name,
        columns=[{"name": c.name, "type": c.type} for c in table.columns],
        primary_key=list(table.primary_key), buckets=table.buckets, created_ms=table.created_ms,
        replication_factor=table.replication_factor, min_insync_replicas=table.min_insync_replicas,
        partition_key=list(table.partition_key), partition_id=table.partition_id,
        partition_name=table.partition_name or "")
    if table.partitioned:
        msg.max_partitions = table.max_partitions
    if table.auto_partition is not None:
        msg.auto_partition.CopyFrom(_auto_partition_pb(table.auto_partition))
    return msg


def table_from_pb(msg: pb.TableInfoPb) -> TableInfo:
    """The table :func:`table_to_pb` sent (an unset max_partitions: table.partition.max's default)."""
    partitioned = {}
    if msg.partition_key:
        partitioned = {"partition_key": tuple(msg.partition_key),
                       "max_partitions": msg.max_partitions or DEFAULT_MAX_PARTITIONS,
                       "auto_partition": _auto_partition_from_pb(msg.auto_partition)
                       if msg.HasField("auto_partition") else None}
    if msg.HasField("partition_id"):
        partitioned.update(partition_id=msg.partition_id, partition_name=msg.partition_name)
    return TableInfo(msg.table_id, msg.database, msg.name, tuple(Column(c.name, c.type) for c in msg.columns),
                     tuple(msg.primary_key), msg.buckets, msg.created_ms,
                     max(1, msg.replication_factor), max(1, msg.min_insync_replicas), **partitioned)


def table_spec_from_pb(msg: pb.CreateTableRequest) -> TableSpec:
    """The table a create asks for (checked by the coordinator: common/tables.validate_spec)."""
    auto = _auto_partition_from_pb(msg.auto_partition) if msg.HasField("auto_partition") else None
    return TableSpec(msg.database, msg.name, tuple(Column(c.name, c.type) for c in msg.columns),
                     tuple(msg.primary_key), msg.buckets, tuple(msg.partition_key),
                     msg.max_partitions if msg.HasField("max_partitions") else DEFAULT_MAX_PARTITIONS, auto)


def table_spec_to_pb(spec: TableSpec, **fields) -> pb.CreateTableRequest:
    """A create request for ``spec`` (``fields``: the request's others)."""
    msg = pb.CreateTableRequest(database=spec.database, name=spec.name,
                                columns=[pb.ColumnPb(name=c.name, type=c.type) for c in spec.columns],
                                primary_key=list(spec.primary_key), buckets=spec.buckets,
                                partition_key=list(spec.partition_key), **fields)
    if spec.partition_key:
        msg.max_partitions = spec.max_partitions
    if spec.auto_partition is not None:
        msg.auto_partition.CopyFrom(_auto_partition_pb(spec.auto_partition))
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


def bucket_snapshots_from_pb(msgs: Iterable[pb.BucketSnapshotPb]) -> dict[TableBucket, int]:
    return {bucket_from_pb(b.bucket): b.snapshot_id for b in msgs}


def lease_to_pb(lease: Lease) -> pb.KvSnapshotLeasePb:
    return pb.KvSnapshotLeasePb(lease_id=lease.lease_id, expiration_time_ms=lease.expiration_time,
                                buckets=bucket_snapshots_to_pb(lease.buckets), owner=lease.owner or "")


def lease_from_pb(msg: pb.KvSnapshotLeasePb) -> Lease:
    return Lease(msg.lease_id, msg.expiration_time_ms, bucket_snapshots_from_pb(msg.buckets), owner=msg.owner or None)


def refuse_partition_ids(request: Message) -> None:
    """Raise PartitionNotExistsError if ``request`` sets a ``partition_id`` anywhere (nested messages included).

    There are no partitioned tables yet, so every partition a request names is
    one that does not exist; an unset ``partition_id`` is the unpartitioned
    bucket. The error names the table, the bucket(s) and the partition.
    """
    found = _set_partition(request, None)
    if found is None:
        return
    table_id, buckets, partition_id = found
    where = f"bucket {buckets}" if isinstance(buckets, int) else \
        "every bucket" if not buckets else f"buckets {sorted(buckets)}"
    table = table_id if table_id is not None else _table_path(request)
    raise errors.PartitionNotExistsError(
        f"partition {partition_id} of table {table} ({where}) does not exist: kvlease has no partitioned "
        f"tables yet, leave partition_id unset", table_id=table_id, bucket=buckets, partition_id=partition_id)


def _table_path(request: Message) -> str:
    """The table a request names by ``database`` and ``name`` (ReassignBucket), or "?"."""
    fields = request.DESCRIPTOR.fields_by_name
    if "database" in fields and "name" in fields:
        return f"{request.database}.{request.name}"
    return "?"


def _set_partition(msg: Message, table_id: int | None) -> tuple[int | None, int | list[int], int] | None:
    """``(table_id, bucket or buckets, partition_id)`` of the first set ``partition_id`` under ``msg``."""
    plan = _partition_plan(msg.DESCRIPTOR)
    if plan.table_id:
        table_id = msg.table_id
    elif plan.table and msg.HasField("table"):
        table_id = msg.table.table_id
    if plan.partition_id and msg.HasField("partition_id"):
        buckets = msg.bucket if plan.bucket and isinstance(msg.bucket, int) else \
            list(msg.buckets) if plan.buckets else []
        return table_id, buckets, msg.partition_id
    for name, repeated in plan.nested:
        if repeated:
            children = getattr(msg, name)
        elif msg.HasField(name):
            children = (getattr(msg, name),)
        else:
            continue
        for child in children:
            found = _set_partition(child, table_id)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class _PartitionPlan:
    """What :func:`_set_partition` looks at in a message type: its own fields, and the message fields
    (in field-number order) whose type can hold a ``partition_id`` somewhere (no others are walked)."""
    table_id: bool
    table: bool
    partition_id: bool
    bucket: bool
    buckets: bool
    nested: tuple[tuple[str, bool], ...]  # (field name, repeated)


@functools.cache
def _partition_plan(descriptor) -> _PartitionPlan:
    names = descriptor.fields_by_name
    nested = tuple((field.name, field.is_repeated) for field in sorted(descriptor.fields, key=lambda f: f.number)
                   if field.message_type is not None and _holds_partition_id(field.message_type))
    return _PartitionPlan("table_id" in names, "table" in names, "partition_id" in names, "bucket" in names,
                          "buckets" in names, nested)


@functools.cache
def _holds_partition_id(descriptor, _seen: frozenset = frozenset()) -> bool:
    """A message of this type can set a ``partition_id`` (its own, or a nested message's)."""
    if "partition_id" in descriptor.fields_by_name:
        return True
    seen = _seen | {descriptor.full_name}
    return any(field.message_type is not None and field.message_type.full_name not in seen
               and _holds_partition_id(field.message_type, seen) for field in descriptor.fields)


def refusing_partition_ids(service: ServiceDescriptor):
    """Class decorator for a gRPC servicer: each RPC of ``service`` first refuses a set partition id.

    The one place a service checks ``partition_id``: a request that sets one
    anywhere is answered ``PARTITION_NOT_EXISTS`` (a streaming RPC: a stream of
    that one response) before its handler runs, so it changes nothing.
    """
    def decorate(cls):
        for method in service.methods:
            setattr(cls, method.name, _refusing_partition_ids(getattr(cls, method.name), method))
        return cls
    return decorate


def _refusing_partition_ids(handler, method: MethodDescriptor):
    response_cls = message_factory.GetMessageClass(method.output_type)

    @functools.wraps(handler)
    def guarded(self, request, context):
        try:
            refuse_partition_ids(request)
        except errors.PartitionNotExistsError as exc:
            response = response_cls(error=error_pb(exc))
            return iter([response]) if method.server_streaming else response
        return handler(self, request, context)
    return guarded
