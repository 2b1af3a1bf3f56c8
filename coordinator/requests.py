"""Requests the gRPC service hands to the event loop (one small frozen dataclass each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from common.tables import TableSpec
from common.model import SnapshotHandle, TableBucket


@dataclass(frozen=True)
class CreateTable:
    spec: TableSpec
    ignore_if_exists: bool = False


@dataclass(frozen=True)
class DropTable:
    database: str
    name: str
    ignore_if_not_exists: bool = False


@dataclass(frozen=True)
class ListTables:
    database: str = ""


@dataclass(frozen=True)
class GetTable:
    database: str = ""
    name: str = ""
    table_id: int = 0


@dataclass(frozen=True)
class CommitSnapshot:
    handle: SnapshotHandle


@dataclass(frozen=True)
class ListSnapshots:
    table_id: int
    latest_only: bool = False


@dataclass(frozen=True)
class AcquireLease:
    lease_id: str
    snapshots: Mapping[TableBucket, int]
    duration_ms: int


@dataclass(frozen=True)
class RenewLease:
    lease_id: str
    duration_ms: int


@dataclass(frozen=True)
class ReleaseLease:
    lease_id: str
    buckets: frozenset[TableBucket]


@dataclass(frozen=True)
class DropLease:
    lease_id: str


@dataclass(frozen=True)
class ListLeases:
    pass


@dataclass(frozen=True)
class DescribeLease:
    lease_id: str


@dataclass(frozen=True)
class TabletServersChanged:
    """The live tablet servers changed; None: read them from ``/tabletservers/ids``."""

    servers: Mapping[int, str] | None = None


@dataclass(frozen=True)
class RemoveOrphanLeaseFiles:
    """After a failover: the lease files listed in the background; delete those no lease names."""

    listed: tuple[str, ...]


@dataclass(frozen=True)
class GetTableAssignment:
    table_id: int


@dataclass(frozen=True)
class ListTabletServers:
    pass


@dataclass(frozen=True)
class ExpireTick:
    """Timer event: drop the leases whose deadline passed."""


LEASE_WRITES = (AcquireLease, RenewLease, ReleaseLease, DropLease, ExpireTick)
QUERIES = (ListTables, GetTable, ListSnapshots, ListLeases, DescribeLease, GetTableAssignment, ListTabletServers)
