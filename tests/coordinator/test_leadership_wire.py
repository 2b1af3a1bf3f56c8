"""A leadership push built from kept entry bytes (coordinator/leadership_wire.py) is the request the
messages of :func:`~kvlease.coordinator.notifier.bucket_role_pb` build; a partition's lease wait and
removed buckets are keyed by the partition's id."""

from __future__ import annotations

import threading

import pytest

from kvlease.common.data_loss import RESTORE, DataLoss
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import Column, TableInfo
from kvlease.coordinator.assignment import UNASSIGNED, BucketAssignment
from kvlease.coordinator.leader_leases import PushLease
from kvlease.coordinator.leadership_wire import BucketRoles, bucket_role_pb
from kvlease.coordinator.notifier import LeadershipNotifier

pytestmark = pytest.mark.unit

TABLE = TableInfo(7, "db", "t", (Column("day", "STRING"), Column("id", "BIGINT")), ("day", "id"), 4,
                  replication_factor=3, partition_key=("day",))
P1, P2 = TABLE.of_partition(11, "a"), TABLE.of_partition(12, "b")
FLAT = TableInfo(20, "db", "flat", (Column("id", "BIGINT"),), ("id",), 2)
OWED = BucketAssignment(1, 5, (1, 2, 3), (1,), 9, losses=(DataLoss(RESTORE, 5, 100, 120, 3, 0, 1, owed_by=(2,)),))
UNKNOWN = BucketAssignment(1, 5, (1, 2, 3), (1, 2), 9, losses=(DataLoss(RESTORE, 5, 100, 120, 3, 0, 1),))
HELD = [(P1, 0, BucketAssignment(1, 1, (1, 2), (1, 2), 1), "h:1"),
        (P2, 0, BucketAssignment(2, 3, (2, 1), (2,), 7), "h:2"),
        (P1, 3, OWED, "h:1"), (P2, 1, UNKNOWN, "h:1"),
        (FLAT, 1, BucketAssignment(UNASSIGNED, 4, (1, 3), (3,), 8, offline_reason="lost"), "")]
GONE = [(P2, 2, BucketAssignment(3, 2, (3,), (3,), 3), "h:3")]


def plain(server_id: int, waits: dict) -> pb.UpdateLeadershipRequest:
    return pb.UpdateLeadershipRequest(
        coordinator_epoch=4, server_id=server_id, dropped_tables=[30], dir_id="d", session_id=77, demotions=2,
        buckets=[bucket_role_pb(*h, server_id=server_id, lease_wait_ms=waits.get((h[0].physical_id, h[1]), 0))
                 for h in HELD] + [bucket_role_pb(*g, removed=True) for g in GONE])


@pytest.mark.parametrize("server_id", [1, 2, 3])
def test_a_push_from_kept_entries_is_the_one_messages_build(server_id):
    roles = BucketRoles()
    waits = {(11, 0): 1500, (12, 0): 2**40}
    header = pb.UpdateLeadershipRequest(coordinator_epoch=4, server_id=server_id, dropped_tables=[30], dir_id="d",
                                        session_id=77, demotions=2)
    for _ in range(2):  # the second push from the kept bytes
        entries = ([roles.entry(*h, server_id=server_id, lease_wait_ms=waits.get((h[0].physical_id, h[1]), 0))
                    for h in HELD] + [roles.entry(*g, removed=True) for g in GONE])
        assert roles.request(header, entries) == plain(server_id, waits)


def test_a_changed_state_table_or_leader_address_is_encoded_again():
    roles = BucketRoles()
    table, bucket, state, address = HELD[0]
    roles.common(table, bucket, state, address)
    for changed in [(table, bucket, BucketAssignment(2, 2, (1, 2), (2,), 2), address),
                    (TABLE.of_partition(11, "renamed"), bucket, state, address),
                    (table, bucket, state, "h:9")]:
        assert roles.common(*changed) == bucket_role_pb(*changed).SerializeToString()


class Stub:
    def __init__(self, sent: list) -> None:
        self.sent = sent

    def UpdateLeadership(self, request, timeout):
        self.sent.append(request)
        return pb.UpdateLeadershipResponse()


def test_the_notifier_tells_a_partition_s_leader_its_wait_by_the_partition_s_id():
    notifier = LeadershipNotifier(4, retry_total_s=1)
    sent: list = []
    delivered = threading.Event()
    notifier._channels.stub = lambda address, cls: Stub(sent)
    notifier.on_delivered = lambda server_id, seq: delivered.set()
    try:
        lease = PushLease(77, 2, {(11, 0): 1500, (12, 0): 2500}, 1)
        notifier.push(1, "h:1", HELD, [30], GONE, "d", lease=lease)
        assert delivered.wait(10)
    finally:
        notifier.close()
    assert sent == [plain(1, lease.waits)]
    waits = {(b.table.partition_id, b.bucket): b.lease_wait_ms for b in sent[0].buckets if not b.removed}
    assert waits[(11, 0)] == 1500 and waits[(12, 0)] == 2500
