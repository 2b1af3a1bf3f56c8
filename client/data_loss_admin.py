"""The data-loss part of the admin client: restore a lost bucket, elect a bucket's leader, and the tablet
servers' internal reports (a replica's data lost, leaders' log ends, a restore carried out).

:class:`DataLossAdmin` is mixed into :class:`client.admin.AdminClient`; it uses
the admin client's transport (its ``_call``). Every call is safe to resend
after a lost answer: a retried restore or election answers the same record.
"""

from __future__ import annotations

from typing import Iterable

from client.admin_types import BucketLeader
from common.data_loss import DataLoss
from common.proto import coordinator_pb2 as pb


def bucket_leader(b: pb.BucketAssignmentPb) -> BucketLeader:
    return BucketLeader(b.bucket, b.leader_id, b.leader_address, b.leader_epoch, tuple(b.replicas), tuple(b.isr),
                        b.bucket_epoch, reassign_target=tuple(b.reassign_target) if b.reassigning else None,
                        offline_reason=b.offline_reason, losses=tuple(DataLoss.from_pb(loss) for loss in b.losses),
                        lost=tuple(b.lost))


class DataLossAdmin:
    """Mixed into :class:`client.admin.AdminClient`."""

    def restore_bucket(self, path: str, bucket: int, accept_data_loss: bool, tablet: int | None = None) -> dict:
        """Restore a bucket that is offline because its data is lost, or none of its replicas is live (their
        servers gone for good), from its latest kept snapshot (none: empty at offset 0), accepting the loss
        of the changes after it. ``tablet``: the live server to restore onto (None: a live replica, else the
        least loaded live server); one outside the replicas leads and the dead replicas are replaced.
        Returns ``{"bucket", "leader", "leader_epoch", "replicas", "loss": DataLoss}``. InvalidRequestError
        without ``accept_data_loss`` (its message says what would be lost) or for a bucket in another state."""
        table = self.get_table(path)  # type: ignore[attr-defined]
        request = pb.RestoreBucketRequest(table_id=table.table_id, bucket=bucket, accept_data_loss=accept_data_loss)
        if tablet is not None:
            request.tablet = tablet
        response = self._call("RestoreBucket", request)  # type: ignore[attr-defined]
        return {"table": table.path, "bucket": bucket, "leader": response.bucket.leader_id,
                "leader_epoch": response.bucket.leader_epoch, "replicas": list(response.bucket.replicas),
                "replication_factor": table.replication_factor, "loss": DataLoss.from_pb(response.loss)}

    def elect_leader(self, path: str, bucket: int, unclean: bool, tablet: int | None = None) -> dict:
        """Elect the bucket's leader: clean (the first live in-sync replica, or ``tablet``), or with
        ``unclean`` (an offline replicated bucket: the first live replica, or ``tablet``, leads alone;
        what it missed is lost). Returns ``{"bucket", "leader", "leader_epoch", "isr", "loss": DataLoss |
        None}``."""
        table = self.get_table(path)  # type: ignore[attr-defined]
        request = pb.ElectLeaderRequest(table_id=table.table_id, bucket=bucket, unclean=unclean)
        if tablet is not None:
            request.tablet = tablet
        response = self._call("ElectLeader", request)  # type: ignore[attr-defined]
        return {"table": table.path, "bucket": bucket, "leader": response.bucket.leader_id,
                "leader_epoch": response.bucket.leader_epoch, "isr": list(response.bucket.isr),
                "loss": DataLoss.from_pb(response.loss) if response.HasField("loss") else None}

    # -- the tablet servers' internal calls ------------------------------------------------------------

    def report_replica_loss(self, server_id: int, table_id: int, bucket: int, reason: str) -> None:
        """Tell the coordinator that ``server_id``'s replica of the bucket lost its data (``reason``): it
        leaves the ISR, and the bucket goes offline if it was its last in-sync replica."""
        self._call("ReportReplicaLoss", pb.ReportReplicaLossRequest(  # type: ignore[attr-defined]
            server_id=server_id, table_id=table_id, bucket=bucket, reason=reason))

    def confirm_restore(self, server_id: int, table_id: int, bucket: int, leader_epoch: int) -> None:
        """Tell the coordinator that ``server_id``'s replica of the bucket carried out the restore that gave
        it ``leader_epoch``: it no longer owes it. Resending it changes nothing."""
        self._call("ConfirmRestore", pb.ConfirmRestoreRequest(  # type: ignore[attr-defined]
            server_id=server_id, table_id=table_id, bucket=bucket, leader_epoch=leader_epoch))

    def report_log_ends(self, server_id: int, ends: Iterable[tuple[int, int, int, int]],
                        takeover: bool = False) -> None:
        """``ends``: (table id, bucket, leader epoch, committed log end) of buckets ``server_id`` leads."""
        self._call("ReportLogEnds", pb.ReportLogEndsRequest(  # type: ignore[attr-defined]
            server_id=server_id, takeover=takeover,
            buckets=[pb.BucketLogEndPb(table_id=t, bucket=b, leader_epoch=e, log_end=end) for t, b, e, end in ends]))
