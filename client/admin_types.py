"""What the admin client (:mod:`kvlease.client.admin`) answers with: small frozen dataclasses (and
:func:`bucket_leader`, which reads a :class:`BucketLeader` from the wire).

:mod:`kvlease.client.admin` re-exports them (``from client.admin import SnapshotInfo`` works).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlease.common import config as cfg
from kvlease.common.data_loss import DataLoss
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.storage import RemoteStorage, open_storage


@dataclass(frozen=True)
class CoordinatorInfo:
    address: str
    active: bool
    active_address: str
    epoch: int
    remote_data_dir: str = ""
    s3_endpoint: str = ""
    s3_region: str = ""

    def remote_storage(self) -> RemoteStorage:
        """The cluster's remote storage as a reader opens it: URI, endpoint and region from the
        coordinator; credentials (if any) from this process's environment, never from the cluster."""
        overrides = {cfg.S3_ENDPOINT.name: self.s3_endpoint, cfg.S3_REGION.name: self.s3_region or "us-east-1"}
        return open_storage(self.remote_data_dir, cfg.Config(overrides))


@dataclass(frozen=True, slots=True)  # slots: made 4,000 at a time (a listing of 1,000 partitions)
class SnapshotInfo:
    handle: SnapshotHandle
    leased_by: tuple[str, ...] = ()
    retained: bool = True

    @property
    def bucket(self) -> TableBucket:
        return self.handle.bucket

    @property
    def snapshot_id(self) -> int:
        return self.handle.snapshot_id

    @property
    def log_offset(self) -> int:
        return self.handle.log_offset


@dataclass(frozen=True)
class BucketLeader:
    """A bucket's replicas and leader (docs/architecture.md, "Losing and moving replicas")."""

    bucket: int
    leader_id: int  # -1: none (not assigned yet, or offline: no live in-sync replica)
    leader_address: str  # "": the leader's tablet server is not live
    leader_epoch: int
    replicas: tuple[int, ...] = ()  # tablet ids, the preferred leader first
    isr: tuple[int, ...] = ()  # the in-sync replicas (the leader among them)
    bucket_epoch: int = 0  # +1 on every change of leader or ISR
    reassign_target: tuple[int, ...] | None = None  # a move in progress: the replicas it moves to
    offline_reason: str = ""  # no leader because its data is lost: why
    losses: tuple[DataLoss, ...] = ()  # the losses of committed changes operators accepted, oldest first
    lost: tuple[int, ...] = ()  # replicas that reported their data lost since they were last in sync

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


def bucket_leader(b: pb.BucketAssignmentPb) -> BucketLeader:
    """A ``BucketAssignmentPb`` as a :class:`kvlease.client.admin_types.BucketLeader`."""
    return BucketLeader(b.bucket, b.leader_id, b.leader_address, b.leader_epoch, tuple(b.replicas), tuple(b.isr),
                        b.bucket_epoch, reassign_target=tuple(b.reassign_target) if b.reassigning else None,
                        offline_reason=b.offline_reason, losses=tuple(DataLoss.from_pb(loss) for loss in b.losses),
                        lost=tuple(b.lost))


@dataclass(frozen=True)
class TabletServerInfo:
    id: int
    address: str
    buckets: int  # buckets it leads
    replicas: int = 0  # bucket replicas it holds (led or followed)
    decommissioned: bool = False  # `cluster decommission`ed: it takes no new replicas until recommissioned


@dataclass(frozen=True)
class BucketRef:
    table_id: int
    table: str  # DB.NAME
    bucket: int
    offline_reason: str = ""  # offline because its data is lost: why
    partition_id: int | None = None  # a partition's bucket: the partition's id and name (None: of a table)
    partition: str | None = None


@dataclass(frozen=True)
class ClusterHealth:
    """The live tablet servers, the buckets with no live leader (offline) and those whose ISR is smaller
    than their replicas (under-replicated, with a live leader)."""

    servers: tuple[TabletServerInfo, ...]
    offline: tuple[BucketRef, ...]
    under_replicated: tuple[BucketRef, ...]
    decommissioned: tuple[int, ...] = ()  # every decommissioned tablet server id, live or not


@dataclass(frozen=True)
class AcquireResult:
    lease_id: str
    expiration_time: int
    acquired: dict[TableBucket, int]
    unavailable: dict[TableBucket, int]


@dataclass(frozen=True)
class ReleaseResult:
    lease_id: str
    released: bool  # False: the lease held none of the buckets, or there was no (live) lease
    lease_remains: bool  # False: the lease is gone (emptied by this release) or never was
