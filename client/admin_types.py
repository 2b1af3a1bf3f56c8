"""What the admin client (:mod:`client.admin`) answers with: small frozen dataclasses.

:mod:`client.admin` re-exports them (``from client.admin import SnapshotInfo`` works).
"""

from __future__ import annotations

from dataclasses import dataclass

from common import config as cfg
from common.model import SnapshotHandle, TableBucket
from common.storage import RemoteStorage, open_storage


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


@dataclass(frozen=True)
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
    bucket: int
    leader_id: int  # -1: not assigned yet
    leader_address: str  # "": the leader's tablet server is not live
    leader_epoch: int


@dataclass(frozen=True)
class TabletServerInfo:
    id: int
    address: str
    buckets: int


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
