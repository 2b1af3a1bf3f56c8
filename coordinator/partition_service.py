"""The coordinator service's partition RPCs (docs/partitions.md): request to loop event, result to response.

Who may: a writer creates partitions by writing (WRITE on the table: dynamic
creation sends ``CreatePartition`` with ``ignore_if_exists``), dropping one
takes DROP on its table, altering the table's partitioning ALTER, listing
DESCRIBE.
"""

from __future__ import annotations

from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.security.acl import Operation, Resource
from kvlease.common.wire import table_to_pb
from kvlease.coordinator import requests as rq


def partition_pb(view, created_ms: int = 0, held_by: tuple[str, ...] = ()) -> pb.PartitionPb:
    return pb.PartitionPb(partition_id=view.partition_id, name=view.partition_name, created_ms=created_ms,
                          held_by=list(held_by))


def _table(request) -> Resource:
    return Resource.table(f"{request.database}.{request.name}")


def create_partition(service, request):
    create = rq.CreatePartition(request.database, request.name, request.partition, request.ignore_if_exists)
    return service._run(create, pb.CreatePartitionResponse,
                        lambda made: {"table": table_to_pb(made[0]), "partition": partition_pb(made[1])},
                        check=service._check(Operation.WRITE, lambda: _table(request)))


def drop_partition(service, request):
    drop = rq.DropPartition(request.database, request.name, request.partition, request.ignore_if_not_exists)
    return service._run(drop, pb.DropPartitionResponse, lambda _r: {},
                        check=service._check(Operation.DROP, lambda: _table(request)))


def list_partitions(service, request):
    listing = rq.ListPartitions(request.database, request.name, request.table_id)

    def build(result):
        table, rows = result
        return {"table": table_to_pb(table), "partitions": [partition_pb(*row) for row in rows]}
    if request.database or request.name:
        return service._run(listing, pb.ListPartitionsResponse, build,
                            check=service._check(Operation.DESCRIBE, lambda: _table(request)))
    return service._run(service._guarded(listing, Operation.DESCRIBE, [request.table_id]),
                        pb.ListPartitionsResponse, build)


def alter_table(service, request):
    alter = rq.AlterTable(request.database, request.name,
                          *(getattr(request, f) if request.HasField(f) else None
                            for f in ("precreate", "retention", "max_partitions")))
    return service._run(alter, pb.AlterTableResponse, lambda t: {"table": table_to_pb(t)},
                        check=service._check(Operation.ALTER, lambda: _table(request)))
