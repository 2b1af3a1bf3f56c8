"""The coordinator service's schema RPCs (docs/schemas.md, "Schema evolution"): request to loop event,
result to response. ``AlterTable`` carries either one schema change (here) or partitioning settings
(coordinator/partition_service.py); altering a table's schema takes ALTER on it, its history DESCRIBE."""

from __future__ import annotations

from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.schema_wire import change_from_pb, version_to_pb
from kvlease.common.security.acl import Operation, Resource
from kvlease.common.wire import error_pb, table_to_pb
from kvlease.coordinator import partition_service
from kvlease.coordinator import requests as rq


def _table(request) -> Resource:
    return Resource.table(f"{request.database}.{request.name}")


def alter_table(service, request):
    try:
        change = change_from_pb(request)
    except errors.KvLeaseError as exc:
        return pb.AlterTableResponse(error=error_pb(exc))
    if change is None:
        return partition_service.alter_table(service, request)
    return service._run(rq.AlterSchema(request.database, request.name, change), pb.AlterTableResponse,
                        lambda t: {"table": table_to_pb(t)},
                        check=service._check(Operation.ALTER, lambda: _table(request)))


def get_schema_history(service, request):
    def build(result):
        table, versions = result
        return {"table": table_to_pb(table), "versions": [version_to_pb(v) for v in versions]}
    return service._run(rq.GetSchemaHistory(request.database, request.name), pb.GetSchemaHistoryResponse, build,
                        check=service._check(Operation.DESCRIBE, lambda: _table(request)))
