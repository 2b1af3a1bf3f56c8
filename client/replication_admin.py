"""The replication part of the admin client: the cluster's health (live servers, offline and under-replicated
buckets, decommissioned servers).

:class:`ReplicationAdmin` is a part of :class:`kvlease.client.admin.AdminClient`, built
on a coordinator call (:meth:`kvlease.client.coordinator_caller.CoordinatorCaller.call`).
The tablet servers' own replication calls (``alter_isr``,
``controlled_shutdown``, ``resign_leadership``) are
:class:`kvlease.client.server_calls.ServerCalls`'.
"""

from __future__ import annotations

from kvlease.client.admin_types import BucketRef, ClusterHealth, TabletServerInfo
from kvlease.client.coordinator_caller import CoordinatorCall
from kvlease.common.proto import coordinator_pb2 as pb


class ReplicationAdmin:
    """The cluster's health; a part of :class:`kvlease.client.admin.AdminClient` (``admin.cluster_health()``)."""

    def __init__(self, call: CoordinatorCall) -> None:
        """``call``: sends a coordinator call."""
        self._call = call

    def cluster_health(self) -> ClusterHealth:
        """The live tablet servers (buckets each leads, replicas each holds, whether it is decommissioned), the
        offline buckets (no live leader), the under-replicated ones (a live leader, an ISR smaller than the
        replicas) and every decommissioned server id (live or not)."""
        response = self._call("ListTabletServers", pb.ListTabletServersRequest())
        def refs(buckets) -> tuple[BucketRef, ...]:
            return tuple(BucketRef(b.table_id, b.table, b.bucket, b.offline_reason,
                                   *((b.partition_id, b.partition) if b.HasField("partition_id") else ()))
                         for b in buckets)
        servers = tuple(TabletServerInfo(s.id, s.address, s.buckets, s.replicas, s.decommissioned)
                        for s in response.servers)
        return ClusterHealth(servers, refs(response.offline), refs(response.under_replicated),
                             tuple(response.decommissioned))
