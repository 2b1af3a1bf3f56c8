"""The replication part of the admin client: the cluster's health, and the tablet servers' internal calls.

:class:`ReplicationAdmin` is mixed into :class:`client.admin.AdminClient`; it
uses the admin client's transport (its ``_call``: the active coordinator,
retries, errors). ``alter_isr``, ``controlled_shutdown`` and
``resign_leadership`` are internal calls (with security on, only the cluster's
own principal may make them); each is safe to resend after a lost answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from client.admin_types import AlterIsrResult, BucketLeader, BucketRef, ClusterHealth, TabletServerInfo
from client.data_loss_admin import bucket_leader
from common import errors
from common.proto import coordinator_pb2 as pb
from common.wire import error_from_pb


class ReplicationAdmin:
    """Mixed into :class:`client.admin.AdminClient` (``admin.cluster_health()``)."""

    def cluster_health(self) -> ClusterHealth:
        """The live tablet servers (buckets each leads, replicas each holds, whether it is decommissioned), the
        offline buckets (no live leader), the under-replicated ones (a live leader, an ISR smaller than the
        replicas) and every decommissioned server id (live or not)."""
        response = self._call("ListTabletServers", pb.ListTabletServersRequest())  # type: ignore[attr-defined]
        def refs(buckets) -> tuple[BucketRef, ...]:
            return tuple(BucketRef(b.table_id, b.table, b.bucket, b.offline_reason) for b in buckets)
        servers = tuple(TabletServerInfo(s.id, s.address, s.buckets, s.replicas, s.decommissioned)
                        for s in response.servers)
        return ClusterHealth(servers, refs(response.offline), refs(response.under_replicated),
                             tuple(response.decommissioned))

    def alter_isr(self, server_id: int, table_id: int, bucket: int, leader_epoch: int, bucket_epoch: int,
                  isr: Iterable[int]) -> AlterIsrResult:
        """Set the bucket's ISR (the call of its leader, ``server_id``, at ``leader_epoch`` and
        ``bucket_epoch``); returns the bucket's state after it. FencedLeaderEpochError if the caller does
        not lead at those epochs (its ``details``: the current ``leader``, ``leader_epoch``,
        ``bucket_epoch`` and ``isr``); InvalidRequestError for an ISR without the leader, with a
        server that is not a replica, or adding one that is not live."""
        request = pb.AlterIsrRequest(server_id=server_id, table_id=table_id, bucket=bucket, leader_epoch=leader_epoch,
                                     bucket_epoch=bucket_epoch, isr=list(isr))
        response = self._call("AlterIsr", request,  # type: ignore[attr-defined]
                              answered=(errors.FencedLeaderEpochError,))
        result = AlterIsrResult(tuple(response.isr), response.leader, response.leader_epoch, response.bucket_epoch)
        if response.error.code:
            raise errors.FencedLeaderEpochError(response.error.message, leader=result.leader,
                                                leader_epoch=result.leader_epoch, bucket_epoch=result.bucket_epoch,
                                                isr=list(result.isr))
        return result

    def controlled_shutdown(self, server_id: int) -> int:
        """Move the leaderships of tablet server ``server_id`` (about to stop) to other live in-sync replicas
        and take it out of the ISRs; returns how many buckets it still leads that could not move (0: it may
        stop). Call it again until 0 (or a timeout)."""
        response = self._call("ControlledShutdown",  # type: ignore[attr-defined]
                              pb.ControlledShutdownRequest(server_id=server_id))
        return response.remaining_leaders

    def resign_leadership(self, server_id: int, buckets: Iterable[tuple[int, int, int, str]]) -> list[Resigned]:
        """Give up the leadership of ``buckets``, ``(table id, bucket, leader epoch, reason)`` each, that tablet
        server ``server_id`` leads at those epochs and cannot write (``reason``: its local failure;
        ``tablet/step_down.py``): for each, another live in-sync replica leads and ``server_id`` leaves the ISR.
        Returns one :class:`Resigned` per bucket, in order."""
        asked = list(buckets)
        request = pb.ResignLeadershipRequest(server_id=server_id, buckets=[
            pb.ResignBucketPb(table_id=t, bucket=b, leader_epoch=epoch, reason=why) for t, b, epoch, why in asked])
        response = self._call("ResignLeadership", request)  # type: ignore[attr-defined]
        return [Resigned(t, b, None, "", error) if (error := error_from_pb(r.error))
                else Resigned(t, b, bucket_leader(r.bucket), r.refused, None)
                for (t, b, _epoch, _reason), r in zip(asked, response.buckets)]


@dataclass(frozen=True)
class Resigned:
    """One bucket's answer to :meth:`ReplicationAdmin.resign_leadership`: its state after the call and why the
    leadership was kept ("" when it moved, or was over already: a resent call), or the error that refused it
    (``state`` None; FencedLeaderEpochError: the server leads it at another epoch)."""

    table_id: int
    bucket: int
    state: BucketLeader | None
    refused: str
    error: errors.KvLeaseError | None
