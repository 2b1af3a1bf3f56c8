"""A leadership push's bucket entries, encoded once per bucket state instead of once per push.

Every push tells a tablet server all the buckets it holds (2,666 each at 1,000 partitions x 4 buckets x
2 replicas on 3 servers); building each entry as a message (:func:`bucket_role_pb`: its table's
description, its state) cost ~12 us, ~35 ms a push, for entries that mostly did not change since the
last push. :class:`BucketRoles` keeps each table's description encoded (for the table object it was built
from) and each bucket's entry (for the table object, state object and leader address; all immutable: another
one is encoded again), and appends what differs from push to push (``removed``, ``restore_owed``,
``lease_wait_ms``) as fields of their own: a protobuf message is its fields in any order, so the request
parsed from these bytes is the one the messages would build (a test compares them). The wire protocol does
not change.
"""

from __future__ import annotations

import threading

from kvlease.common.proto import coordinator_pb2 as coordinator_pb
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import TableInfo
from kvlease.common.wire import table_to_pb
from kvlease.coordinator.assignment import BucketAssignment
from kvlease.coordinator.snapshot_wire import varint

#: Buckets' entries kept at most (one per bucket pushed; beyond it the cache starts again); tables' likewise.
MAX_CACHED = 262_144

_TABLE = 0x0A  # BucketLeadershipPb.table (1, length-delimited)
_REMOVED = b"\xa0\x01\x01"  # BucketLeadershipPb.removed (20, varint) = true
_RESTORE_OWED = b"\x80\x02"  # BucketLeadershipPb.restore_owed (32, varint), its value follows
_LEASE_WAIT = b"\x88\x02"  # BucketLeadershipPb.lease_wait_ms (33, varint), its value follows
_BUCKETS = 0x1A  # UpdateLeadershipRequest.buckets (3, length-delimited)


def bucket_state_pb(bucket: int, state: BucketAssignment, leader_address: str, removed: bool = False,
                    server_id: int | None = None, lease_wait_ms: int = 0) -> pb.BucketLeadershipPb:
    """:func:`bucket_role_pb` without its table."""
    msg = pb.BucketLeadershipPb(bucket=bucket, leader_epoch=state.leader_epoch,
                                leader=state.leader, leader_address=leader_address, replicas=list(state.replicas),
                                isr=list(state.isr), bucket_epoch=state.bucket_epoch, removed=removed,
                                offline_reason=state.offline_reason, lease_wait_ms=lease_wait_ms)
    if state.losses:
        msg.latest_loss.CopyFrom(state.losses[-1].to_pb(coordinator_pb.DataLossPb))
        owed = None if server_id is None else state.losses[-1].owes(server_id)
        if owed is not None:
            msg.restore_owed = owed
    return msg


def bucket_role_pb(table: TableInfo, bucket: int, state: BucketAssignment, leader_address: str,
                   removed: bool = False, server_id: int | None = None, lease_wait_ms: int = 0) -> pb.BucketLeadershipPb:
    """One bucket as its replicas are told it: ``leader`` always set (-1: none), ``leader_address`` "" if
    the leader is not live; ``removed``: told to a server a completed move took the bucket off;
    ``server_id``: the server told, whether it still owes the latest restore (``restore_owed``);
    ``lease_wait_ms``: told to its leader (coordinator/leader_leases.py)."""
    msg = bucket_state_pb(bucket, state, leader_address, removed, server_id, lease_wait_ms)
    msg.table.CopyFrom(table_to_pb(table))
    return msg


class BucketRoles:
    """Thread-safe (the notifier's sender threads share one)."""

    def __init__(self, max_cached: int = MAX_CACHED) -> None:
        self.max_cached = max_cached
        self._tables: dict[int, tuple[TableInfo, bytes]] = {}
        self._buckets: dict[tuple[int, int], tuple[TableInfo, BucketAssignment, str, bytes]] = {}
        self._lock = threading.Lock()

    def _keep(self, cache: dict, key, value) -> None:
        with self._lock:
            if len(cache) >= self.max_cached:
                cache.clear()
            cache[key] = value

    def table(self, table: TableInfo) -> bytes:
        """The table's description as an entry's field, encoded once per table object."""
        cached = self._tables.get(table.physical_id)
        if cached is not None and cached[0] is table:
            return cached[1]
        data = table_to_pb(table).SerializeToString()
        data = bytes((_TABLE,)) + varint(len(data)) + data
        self._keep(self._tables, table.physical_id, (table, data))
        return data

    def common(self, table: TableInfo, bucket: int, state: BucketAssignment, leader_address: str) -> bytes:
        """The entry's fields every server of the bucket is told alike, encoded."""
        key = (table.physical_id, bucket)
        cached = self._buckets.get(key)
        if cached is not None and cached[0] is table and cached[1] is state and cached[2] == leader_address:
            return cached[3]
        data = self.table(table) + bucket_state_pb(bucket, state, leader_address).SerializeToString()
        self._keep(self._buckets, key, (table, state, leader_address, data))
        return data

    def entry(self, table: TableInfo, bucket: int, state: BucketAssignment, leader_address: str, *,
              removed: bool = False, server_id: int | None = None, lease_wait_ms: int = 0) -> bytes:
        """The bucket's entry of a push to ``server_id``, framed as a field of the request (the arguments of
        :func:`bucket_role_pb`)."""
        data = self.common(table, bucket, state, leader_address)
        if removed:
            data += _REMOVED
        if state.losses and server_id is not None:
            owed = state.losses[-1].owes(server_id)
            if owed is not None:
                data += _RESTORE_OWED + (b"\x01" if owed else b"\x00")
        if lease_wait_ms:
            data += _LEASE_WAIT + varint(lease_wait_ms)
        return bytes((_BUCKETS,)) + varint(len(data)) + data

    @staticmethod
    def request(header: pb.UpdateLeadershipRequest, entries: list[bytes]) -> pb.UpdateLeadershipRequest:
        """``header`` (a request without buckets) with ``entries`` as its buckets, in order."""
        return pb.UpdateLeadershipRequest.FromString(header.SerializeToString() + b"".join(entries))
