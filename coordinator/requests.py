"""Requests the gRPC service hands to the event loop (one small frozen dataclass each).

Lease changes are not here: their requests are the lease state machine's own
events (:class:`kvlease.leases.state.Acquire`, ``Renew``, ``Release``, ``Drop``, and the
timer's ``Expire``), handed to the loop as they are. The one exception,
:class:`AcquireLatest`, becomes an ``Acquire`` on the loop once its snapshots are chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvlease.common import errors
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.schema_changes import Change
from kvlease.common.tables import TableInfo, TableSpec
from kvlease.leases.events import Acquire

__all__ = ["ConfirmRestore", "ElectLeader", "ReportLogEnds", "ReportReplicaLoss", "RestoreBucket", "AlterIsr", "CommitSnapshot", "ControlledShutdown", "CreateTable", "DescribeLease", "DropTable", "GetTable", "GetTableAssignment", "Guarded",
           "ListLeases", "ListSnapshots", "ListTables", "ListTabletServers", "RemoveOrphanLeaseFiles",
           "TabletServersChanged", "PushDelivered", "ReassignBucket", "DecommissionTablet", "RecommissionTablet",
           "Rebalance", "ListReassignments", "ResignLeadership", "CreatePartition", "DropPartition", "ListPartitions",
           "AlterTable", "CheckAutoPartitions", "AcquireLatest", "AlterSchema", "GetSchemaHistory"]


@dataclass(frozen=True)
class CreateTable:
    spec: TableSpec
    ignore_if_exists: bool = False
    #: None: the coordinator's default.replication-factor / min.insync-replicas
    replication_factor: int | None = None
    min_insync_replicas: int | None = None


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
    leader_epoch: int | None = None  # the epoch it was taken under (None: an older tablet server, not checked)
    server_id: int | None = None  # the committing tablet server (None: not checked)


@dataclass(frozen=True)
class ListSnapshots:
    table_id: int
    latest_only: bool = False
    #: A partitioned table's: that partition's only (None: every partition's)
    partition_id: int | None = None


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
class PushDelivered:
    """A tablet server took the leadership push numbered ``seq`` (coordinator/leader_leases.py)."""

    server_id: int
    seq: int


@dataclass(frozen=True)
class PushUndelivered:
    """A push to a tablet server ran out of retries: it is pushed again at the next expiry tick, if live."""

    server_id: int


@dataclass(frozen=True)
class RemoveOrphanLeaseFiles:
    """After a failover: the lease files listed in the background; delete those no lease names."""

    listed: tuple[str, ...]


@dataclass(frozen=True)
class GetTableAssignment:
    table_id: int
    partition_id: int | None = None


@dataclass(frozen=True)
class ListTabletServers:
    pass


@dataclass(frozen=True)
class AlterIsr:
    """A bucket's leader asks to change the bucket's ISR (fenced by its leader and bucket epochs)."""

    server_id: int
    table_id: int
    bucket: int
    leader_epoch: int
    bucket_epoch: int
    isr: tuple[int, ...]


@dataclass(frozen=True)
class ControlledShutdown:
    """A tablet server about to stop: move its leaderships away, take it out of the ISRs."""

    server_id: int


@dataclass(frozen=True)
class ResignLeadership:
    """A leader that cannot write some buckets (a full disk) gives their leadership up: ``(table id, bucket,
    leader epoch, reason)`` each (fenced by its leader epoch; the reason, its local failure, is logged)."""

    server_id: int
    buckets: tuple[tuple[int, int, int, str], ...]


@dataclass(frozen=True)
class ReassignBucket:
    """Move a bucket's replicas to ``replicas`` (coordinator/moves.py)."""

    database: str
    name: str
    bucket: int
    replicas: tuple[int, ...]
    #: A partitioned table's bucket: its partition, by name or by id
    partition: str = ""
    partition_id: int | None = None


@dataclass(frozen=True)
class DecommissionTablet:
    """Move every replica off a tablet server."""

    tablet_id: int


@dataclass(frozen=True)
class RecommissionTablet:
    """Clear a tablet server's decommission mark: it takes new replicas again."""

    tablet_id: int


@dataclass(frozen=True)
class Rebalance:
    """Even out replicas over the live tablet servers; spread preferred leaders and move leaders back to them
    (``leaders_only``: only that, no replica moves)."""

    leaders_only: bool = False


@dataclass(frozen=True)
class ListReassignments:
    pass


@dataclass(frozen=True)
class ReportReplicaLoss:
    """A tablet server found its replica of a bucket lost (corrupt or missing files). Requests from tablet
    servers name buckets by physical id (common/tables.py): the service maps the wire's table and partition."""

    server_id: int
    table_id: int
    bucket: int
    reason: str


@dataclass(frozen=True)
class ReportLogEnds:
    """(table id, bucket, leader epoch, log end) of buckets the server leads; ``takeover``: an unclean
    leader's log end before it serves."""

    server_id: int
    ends: tuple[tuple[int, int, int, int], ...]
    takeover: bool = False


@dataclass(frozen=True)
class ConfirmRestore:
    """A replica of a restored bucket carried out the restore that gave it ``leader_epoch``."""

    server_id: int
    table_id: int
    bucket: int
    leader_epoch: int


@dataclass(frozen=True)
class RestoreBucket:
    table_id: int
    bucket: int
    accept_data_loss: bool
    tablet: int | None = None  # the server to restore onto (None: chosen; coordinator/data_loss_plan.py)
    partition_id: int | None = None


@dataclass(frozen=True)
class ElectLeader:
    table_id: int
    bucket: int
    unclean: bool
    tablet: int | None = None
    partition_id: int | None = None


# -- partitions (coordinator/partitions.py) ----------------------------------------------------------

@dataclass(frozen=True)
class CreatePartition:
    database: str
    name: str
    partition: str
    ignore_if_exists: bool = False


@dataclass(frozen=True)
class DropPartition:
    database: str
    name: str
    partition: str
    ignore_if_not_exists: bool = False


@dataclass(frozen=True)
class ListPartitions:
    database: str = ""
    name: str = ""
    table_id: int = 0


@dataclass(frozen=True)
class AlterTable:
    """Change a partitioned table's settings; None: unchanged."""

    database: str
    name: str
    precreate: int | None = None
    retention: int | None = None
    max_partitions: int | None = None


@dataclass(frozen=True)
class AlterSchema:
    """One change of a table's schema (coordinator/schemas.py; the rules: common/schema_changes.py)."""

    database: str
    name: str
    change: Change


@dataclass(frozen=True)
class GetSchemaHistory:
    """A table and every version of its schema."""

    database: str
    name: str


@dataclass(frozen=True)
class CheckAutoPartitions:
    """The auto-partition timer: make the upcoming partitions, drop those past retention no lease holds."""


@dataclass(frozen=True)
class Guarded:
    """``request``, handled only once ``guard(controller)`` returned: a check that must see the loop's state
    as the request will (a table id's path, the tables a lease holds). The guard raises to refuse (e.g.
    AuthorizationFailedError) and then nothing is handled."""

    request: Any
    guard: Callable[[Any], None]


@dataclass(frozen=True)
class AcquireLatest:
    """``lease acquire --latest``: an acquire of the latest snapshot of every bucket of table ``table_id`` (of
    partition ``partition_id``'s, or of every partition's) that has one, chosen on the loop as it is acquired."""

    lease_id: str
    table_id: int
    partition_id: int | None
    duration_ms: int
    owner: str | None = None

    def acquire(self, snapshots: Mapping[TableBucket, int], table: TableInfo, views: list[TableInfo]) -> Acquire:
        """The lease state machine's acquire of ``snapshots``, the latest of the buckets of ``views`` (the
        physical tables named: ``table``'s or one partition's; none: SnapshotNotFoundError, nothing to hold)."""
        if not snapshots:
            where = views[0].where if self.partition_id is not None else table.where
            every = " of any partition" if table.partitioned and self.partition_id is None else ""
            raise errors.SnapshotNotFoundError(f"{where} has no snapshot in any bucket{every} yet; nothing to lease",
                                               table_id=self.table_id)
        return Acquire(self.lease_id, snapshots, self.duration_ms, owner=self.owner)
