"""A tablet server's own calls to the coordinator: ISR changes, controlled shutdown, resigning leaderships,
and the data-loss reports (a replica's data lost, leaders' log ends, a restore carried out).

These are internal calls: with security on, only the cluster's own principal
may make them, and no user process makes them, so :class:`ServerCalls` is not
part of the public :class:`kvlease.client.admin.AdminClient` (nor of ``kvlease``); the
tablet server (``tablet/``) uses it. It is built on a coordinator call
(:meth:`kvlease.client.coordinator_caller.CoordinatorCaller.call`: the active
coordinator, retries, errors), in a tablet server the one its admin client
owns (``ServerCalls(admin.caller.call)``). Every call is safe to resend after a
lost answer (:data:`kvlease.client.coordinator_caller.IDEMPOTENT` names the
replication ones; a resent report changes nothing).

A bucket is named by its table's id and, for a bucket of a partitioned table's partition, the
partition's id (``partition_id``; None: an unpartitioned table's bucket), as every request does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

from kvlease.client.admin_types import BucketLeader, bucket_leader
from kvlease.client.coordinator_caller import CoordinatorCall
from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.wire import error_from_pb


@dataclass(frozen=True)
class AlterIsrResult:
    """A bucket's state after an AlterIsr."""

    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    bucket_epoch: int


@dataclass(frozen=True)
class Resigned:
    """One bucket's answer to :meth:`ServerCalls.resign_leadership`: its state after the call and why the
    leadership was kept ("" when it moved, or was over already: a resent call), or the error that refused it
    (``state`` None; FencedLeaderEpochError: the server leads it at another epoch)."""

    table_id: int
    bucket: int
    state: BucketLeader | None
    refused: str
    error: errors.KvLeaseError | None
    partition_id: int | None = None


class ResignBucket(NamedTuple):
    """A bucket :meth:`ServerCalls.resign_leadership` gives up (a plain tuple of its fields will do)."""

    table_id: int
    bucket: int
    leader_epoch: int
    reason: str
    partition_id: int | None = None


class LogEnd(NamedTuple):
    """A led bucket's committed log end for :meth:`ServerCalls.report_log_ends` (a plain tuple will do)."""

    table_id: int
    bucket: int
    leader_epoch: int
    log_end: int
    partition_id: int | None = None


class ServerCalls:
    """The coordinator calls only tablet servers make; thread-safe as its ``call`` is."""

    def __init__(self, call: CoordinatorCall) -> None:
        """``call``: sends a coordinator call (:meth:`kvlease.client.coordinator_caller.CoordinatorCaller.call`)."""
        self._call = call

    # -- replication --------------------------------------------------------------------------------

    def alter_isr(self, server_id: int, table_id: int, bucket: int, leader_epoch: int, bucket_epoch: int,
                  isr: Iterable[int], *, partition_id: int | None = None) -> AlterIsrResult:
        """Set the bucket's ISR (the call of its leader, ``server_id``, at ``leader_epoch`` and
        ``bucket_epoch``); returns the bucket's state after it. FencedLeaderEpochError if the caller does
        not lead at those epochs (its ``details``: the current ``leader``, ``leader_epoch``,
        ``bucket_epoch`` and ``isr``); InvalidRequestError for an ISR without the leader, with a
        server that is not a replica, or adding one that is not live."""
        request = pb.AlterIsrRequest(server_id=server_id, table_id=table_id, bucket=bucket, leader_epoch=leader_epoch,
                                     bucket_epoch=bucket_epoch, isr=list(isr), partition_id=partition_id)
        response = self._call("AlterIsr", request, answered=(errors.FencedLeaderEpochError,))
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
        response = self._call("ControlledShutdown", pb.ControlledShutdownRequest(server_id=server_id))
        return response.remaining_leaders

    def resign_leadership(self, server_id: int, buckets: Iterable[ResignBucket | tuple]) -> list[Resigned]:
        """Give up the leadership of ``buckets`` (:class:`ResignBucket` each) that tablet server ``server_id``
        leads at those epochs and cannot write (``reason``: its local failure; ``tablet/replicas/step_down.py``):
        for each, another live in-sync replica leads and ``server_id`` leaves the ISR. Returns one
        :class:`Resigned` per bucket, in order."""
        asked = [ResignBucket(*bucket) for bucket in buckets]
        request = pb.ResignLeadershipRequest(server_id=server_id, buckets=[
            pb.ResignBucketPb(table_id=a.table_id, bucket=a.bucket, leader_epoch=a.leader_epoch, reason=a.reason,
                              partition_id=a.partition_id) for a in asked])
        response = self._call("ResignLeadership", request)
        return [Resigned(a.table_id, a.bucket, None, "", error, a.partition_id) if (error := error_from_pb(r.error))
                else Resigned(a.table_id, a.bucket, bucket_leader(r.bucket), r.refused, None, a.partition_id)
                for a, r in zip(asked, response.buckets)]

    # -- data loss ------------------------------------------------------------------------------------

    def report_replica_loss(self, server_id: int, table_id: int, bucket: int, reason: str, *,
                            partition_id: int | None = None) -> None:
        """Tell the coordinator that ``server_id``'s replica of the bucket lost its data (``reason``): it
        leaves the ISR, and the bucket goes offline if it was its last in-sync replica."""
        self._call("ReportReplicaLoss", pb.ReportReplicaLossRequest(
            server_id=server_id, table_id=table_id, bucket=bucket, reason=reason, partition_id=partition_id))

    def confirm_restore(self, server_id: int, table_id: int, bucket: int, leader_epoch: int, *,
                        partition_id: int | None = None) -> None:
        """Tell the coordinator that ``server_id``'s replica of the bucket carried out the restore that gave
        it ``leader_epoch``: it no longer owes it. Resending it changes nothing."""
        self._call("ConfirmRestore", pb.ConfirmRestoreRequest(
            server_id=server_id, table_id=table_id, bucket=bucket, leader_epoch=leader_epoch,
            partition_id=partition_id))

    def report_log_ends(self, server_id: int, ends: Iterable[LogEnd | tuple], takeover: bool = False) -> None:
        """``ends``: the committed log ends of buckets ``server_id`` leads (:class:`LogEnd` each)."""
        self._call("ReportLogEnds", pb.ReportLogEndsRequest(server_id=server_id, takeover=takeover, buckets=[
            pb.BucketLogEndPb(table_id=e.table_id, bucket=e.bucket, leader_epoch=e.leader_epoch, log_end=e.log_end,
                              partition_id=e.partition_id) for e in (LogEnd(*end) for end in ends)]))
