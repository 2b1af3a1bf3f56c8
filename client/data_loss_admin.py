"""The data-loss part of the admin client: restore a lost bucket, elect a bucket's leader.

:class:`DataLossAdmin` is a part of :class:`kvlease.client.admin.AdminClient`, built on
a coordinator call (:meth:`kvlease.client.coordinator_caller.CoordinatorCaller.call`)
and the admin client's ``get_table``. Every call is safe to resend after a
lost answer: a retried restore or election answers the same record. (The
tablet servers' own reports, a replica's data lost, leaders' log ends, a
restore carried out, are :class:`kvlease.client.server_calls.ServerCalls`'.)
"""

from __future__ import annotations

from typing import Callable

from kvlease.client.coordinator_caller import CoordinatorCall
from kvlease.common.data_loss import DataLoss
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.tables import TableInfo


class DataLossAdmin:
    """Restores and elections; a part of :class:`kvlease.client.admin.AdminClient` (``admin.restore_bucket(...)``)."""

    def __init__(self, call: CoordinatorCall, get_table: Callable[[str], TableInfo],
                 find_partition: Callable[[TableInfo, str], TableInfo]) -> None:
        """``call``: sends a coordinator call; ``get_table``: the table ``DB.NAME`` (TableNotExistError if
        none); ``find_partition``: a partitioned table's view of its partition of a name
        (:func:`kvlease.client.partitions_admin.find_partition`)."""
        self._call = call
        self._get_table = get_table
        self._find_partition = find_partition

    def _bucket_of(self, path: str, partition: str | None) -> TableInfo:
        """The table ``path``, or its partition ``partition``'s view."""
        table = self._get_table(path)
        return table if partition is None else self._find_partition(table, partition)

    def restore_bucket(self, path: str, bucket: int, accept_data_loss: bool, tablet: int | None = None,
                       partition: str | None = None) -> dict:
        """Restore a bucket that is offline because its data is lost, or none of its replicas is live (their
        servers gone for good), from its latest kept snapshot (none: empty at offset 0), accepting the loss
        of the changes after it. ``tablet``: the live server to restore onto (None: a live replica, else the
        least loaded live server); one outside the replicas leads and the dead replicas are replaced.
        ``partition``: the name of the partition whose bucket it is (a partitioned table's).
        Returns ``{"table", "partition" (None: an unpartitioned table's), "bucket", "leader", "leader_epoch",
        "replicas", "loss": DataLoss}``. InvalidRequestError without ``accept_data_loss`` (its message says what
        would be lost) or for a bucket in another state; PartitionNotExistsError."""
        table = self._bucket_of(path, partition)
        request = pb.RestoreBucketRequest(table_id=table.table_id, bucket=bucket, accept_data_loss=accept_data_loss,
                                          partition_id=table.partition_id)
        if tablet is not None:
            request.tablet = tablet
        response = self._call("RestoreBucket", request)
        return {"table": table.path, "partition": table.partition_name, "bucket": bucket,
                "leader": response.bucket.leader_id, "leader_epoch": response.bucket.leader_epoch,
                "replicas": list(response.bucket.replicas), "replication_factor": table.replication_factor,
                "loss": DataLoss.from_pb(response.loss)}

    def elect_leader(self, path: str, bucket: int, unclean: bool, tablet: int | None = None,
                     partition: str | None = None) -> dict:
        """Elect the bucket's leader: clean (the first live in-sync replica, or ``tablet``), or with
        ``unclean`` (an offline replicated bucket: the first live replica, or ``tablet``, leads alone;
        what it missed is lost); ``partition`` as for :meth:`restore_bucket`. Returns ``{"table",
        "partition", "bucket", "leader", "leader_epoch", "isr", "loss": DataLoss | None}``."""
        table = self._bucket_of(path, partition)
        request = pb.ElectLeaderRequest(table_id=table.table_id, bucket=bucket, unclean=unclean,
                                        partition_id=table.partition_id)
        if tablet is not None:
            request.tablet = tablet
        response = self._call("ElectLeader", request)
        return {"table": table.path, "partition": table.partition_name, "bucket": bucket,
                "leader": response.bucket.leader_id, "leader_epoch": response.bucket.leader_epoch,
                "isr": list(response.bucket.isr),
                "loss": DataLoss.from_pb(response.loss) if response.HasField("loss") else None}
