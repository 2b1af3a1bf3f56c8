"""The leader's side of replication: answering followers' ``ReplicaFetch`` long polls.

One request carries every bucket a follower follows on this server. For each:
the follower's leader epoch is checked (older: FENCED_LEADER_EPOCH, newer:
NOT_LEADER); its log is checked against this one by the epoch of its last
entry (a mismatch answers the divergence point, no entries: the follower
truncates there and asks again, ``tablet/log/epochs.py``); its fetch
offset is its log end, which may move the HW (the leadership applies it);
then the entries from there on are read whole, byte for byte. A leader with
loss work (a restore or unclean takeover not carried out and confirmed yet, a
replica it found lost: ``tablet/replicas/loss.py``) answers LEADER_NOT_AVAILABLE
instead: what it holds is not the bucket's yet. The call waits
up to ``max_wait_ms`` while no bucket has entries or a HW the follower has not
been told, woken by :meth:`ReplicaFetchService.notify` (every append and HW
move of a replicated bucket here); once :meth:`ReplicaFetchService.close` was
called (the server stops) every call answers at once.
"""

from __future__ import annotations

import time
from typing import Callable

from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.wire import error_pb
from kvlease.tablet.log.epochs import EpochEnd
from kvlease.tablet.log.waits import LogWaits, wait_seconds
from kvlease.tablet.replication.leader import check_epoch


class ReplicaFetchService:
    def __init__(self, replicas, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        """``replicas``: the server's :class:`~kvlease.tablet.replicas.manager.ReplicaManager`."""
        self.replicas = replicas
        self.clock_ms = clock_ms
        self._waits = LogWaits(max_waiting=None)  # every follower's fetch may wait (one call per follower)

    def notify(self) -> None:
        """Something a waiting fetch may want happened (an append, a HW move)."""
        self._waits.notify()

    def close(self) -> None:
        """The server stops: waiting calls answer what they have now, later ones do not wait (its gRPC
        server's stop then has no long poll to wait for)."""
        self._waits.close()

    def fetch(self, request: pb.ReplicaFetchRequest, time_remaining_s: float | None = None) -> pb.ReplicaFetchResponse:
        """``time_remaining_s``: the call's own deadline (the wait ends before it)."""
        wait_s = wait_seconds(request.max_wait_ms, time_remaining_s) if request.buckets else 0.0
        first = [True]  # the follower's progress is taken once, when its fetch arrives

        def once() -> tuple[list, bool]:
            answer = self._fetch_once(request, first[0])
            first[0] = False
            return answer

        results, _ready = self._waits.poll(once, lambda answer: answer[1], wait_s)
        return pb.ReplicaFetchResponse(buckets=results)

    def _fetch_once(self, request, first: bool) -> tuple[list, bool]:
        results, told, ready = [], [], False
        for item in request.buckets:
            result = pb.ReplicaFetchBucketResultPb(table_id=item.table_id, bucket=item.bucket,
                                                   partition_id=_partition(item))
            try:
                news, lead = self._fetch_bucket(request.replica_id, item, result, first)
                ready |= news
                told.append((lead, result.high_watermark))
            except errors.KvLeaseError as exc:
                del result.entries[:]
                result.error.CopyFrom(error_pb(exc))
                ready = True
            results.append(result)
        if ready:  # what is answered now is told: later fetches wait for newer
            for lead, high_watermark in told:
                lead.answered(request.replica_id, high_watermark)
        return results, ready

    def _led(self, item):
        """The replica of a bucket this server leads (not :meth:`ReplicaManager.get`: a new leader answers
        its followers before it serves reads — their fetches move its HW). A partition's bucket is held by the
        partition's id; one held of another table than the fetch names is not the bucket asked for (no
        ZooKeeper read: a follower whose leader lost the bucket waits for the coordinator's next push)."""
        partition_id = _partition(item)
        try:
            replica = self.replicas.replica(item.table_id if partition_id is None else partition_id, item.bucket)
        except errors.NotLeaderError:
            replica = None
        if replica is None or (replica.table.table_id, replica.table.partition_id) != (item.table_id, partition_id):
            part = "" if partition_id is None else f"partition {partition_id} of "
            raise errors.NotLeaderError(f"this tablet server does not lead bucket {item.bucket} of {part}table "
                                        f"{item.table_id}", table_id=item.table_id, bucket=item.bucket)
        if not replica.leads:
            raise errors.NotLeaderError(f"this tablet server does not lead {replica.where}", **replica.details)
        if replica.loss_work is not None:  # what it holds is not the bucket's yet (tablet/replicas/lost_data.py)
            raise errors.LeaderNotAvailableError(
                f"the leader of {replica.where} answers its followers once it has carried out (and the coordinator "
                "knows) its restore or unclean takeover, or the coordinator took its lost replica out of the ISR",
                **replica.details)
        return replica

    def _fetch_bucket(self, follower: int, item, result, first: bool) -> tuple[bool, object]:
        """Fill ``result``; whether it is worth answering now, and the bucket's leadership. Only the ``first``
        look of a fetch tells the leadership where the follower is: a long poll that looks again after the
        follower left the ISR (it died; its channel closed, the call still waits here) must not bring back the
        log end the leadership forgot then — a wiped replica restarting would join the ISR before it holds
        anything."""
        replica = self._led(item)
        lead = replica.leadership()
        if lead is None:
            raise errors.InvalidRequestError(f"{replica.where} has one replica")
        check_epoch(lead.epoch, item.leader_epoch, lead.where)
        if follower not in lead.view.replicas or follower == lead.server_id:
            raise errors.InvalidRequestError(f"tablet server {follower} is not a follower of {lead.where}")
        store = replica.store
        start, _ = store.list_offsets()
        result.log_start_offset = start
        base = replica.uploader.base  # its followers re-base on it (tablet/replication/rebase.py)
        result.latest_snapshot_id = base.snapshot_id if base is not None else 0
        if item.last_fetched_epoch >= 0 and item.fetch_offset > 0:
            answer = store.end_offset_for(item.last_fetched_epoch)
            if answer.epoch != item.last_fetched_epoch or answer.end_offset < item.fetch_offset:
                result.diverging_epoch = -1 if answer.epoch is None else answer.epoch
                result.diverging_end_offset = answer.end_offset
                result.high_watermark = lead.high_watermark
                result.log_end_offset = store.log_end_offset
                return True, lead
        hw, news = lead.on_fetch(follower, item.fetch_offset, self.clock_ms()) if first else lead.polled(follower)
        entries: list[bytes] = []
        end = store.log_end_offset
        if item.fetch_offset < end:
            entries, end = store.fetch_log(item.fetch_offset, max(item.max_bytes, 1), committed=False)
        result.entries.extend(entries)
        result.log_end_offset = end
        result.high_watermark = hw
        return bool(entries) or news, lead


def _partition(item) -> int | None:
    """The partition a fetched bucket is of (None: an unpartitioned table's)."""
    return item.partition_id if item.HasField("partition_id") else None


def answer_of(result) -> EpochEnd:
    """A divergence answer as the follower's :class:`EpochEnd`."""
    return EpochEnd(None if result.diverging_epoch < 0 else result.diverging_epoch, result.diverging_end_offset)
