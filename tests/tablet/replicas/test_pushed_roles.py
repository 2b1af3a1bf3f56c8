"""A push lists all of a tablet server's buckets, mostly unchanged: an unchanged bucket's role is the object taken
before (tablet/replication/roles.py, ``PushedRoles``) and the replica manager skips it; a changed one is parsed and
taken as before. Pushes given to a real TabletService (no gRPC) over real stores in a temp dir, no processes."""

from __future__ import annotations

import pytest

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.storage.file import FileStorage
from kvlease.common.tables import Column, TableInfo
from kvlease.common.wire import table_to_pb
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.tablet.replication.roles import PushedRoles
from kvlease.tablet.service import TabletService

pytestmark = pytest.mark.unit

COLUMNS = (Column("id", "BIGINT"), Column("day", "STRING"))
EVENTS = TableInfo(3, "db", "events", COLUMNS, ("id", "day"), 2, replication_factor=2, partition_key=("day",))
P4, P5 = EVENTS.of_partition(4, "20261127"), EVENTS.of_partition(5, "20261128")


def bucket(view: TableInfo, number: int, leader: int = 1, leader_epoch: int = 1, isr=(1, 2), bucket_epoch: int = 1,
           **fields) -> pb.BucketLeadershipPb:
    return pb.BucketLeadershipPb(table=table_to_pb(view), bucket=number, leader_epoch=leader_epoch, leader=leader,
                                 leader_address="" if leader == 1 else "127.0.0.1:1", replicas=[1, 2], isr=list(isr),
                                 bucket_epoch=bucket_epoch, **fields)


def test_an_unchanged_message_gives_the_role_parsed_before_and_a_view_is_parsed_once_a_push():
    pushed = PushedRoles(1)
    first = pushed.parse([bucket(P4, 0), bucket(P4, 1), bucket(P5, 0, leader=2)])
    assert first[0].table is first[1].table and first[0].table == P4  # one view, parsed once
    assert [r.leads(1) for r in first] == [True, True, False] and first[2].table == P5
    again = pushed.parse([bucket(P4, 0), bucket(P4, 1, isr=[1], bucket_epoch=2), bucket(P5, 0, leader=2)])
    assert again[0] is first[0] and again[2] is first[2]  # byte for byte the same: the same objects
    assert again[1] is not first[1] and again[1].isr == (1,) and again[1].bucket_epoch == 2
    with pytest.raises(errors.InvalidRequestError, match="partition_id 5"):
        pushed.parse([bucket(P4, 0), bucket(P4, 1, partition_id=5)])  # refused whole: nothing remembered
    assert pushed.parse([bucket(P4, 0)])[0] is first[0]
    assert PushedRoles(1).parse([bucket(P4, 0)])[0] is not first[0]  # another server's parser: parsed anew


@pytest.fixture
def service(tmp_path):
    config = cfg.Config({"log.flush.fsync": False})
    replicas = ReplicaManager(str(tmp_path / "data"), config, FileStorage(str(tmp_path / "remote")), admin=None,
                              server_id=1)
    yield TabletService(replicas)
    replicas.close()


def push(service: TabletService, *buckets: pb.BucketLeadershipPb) -> None:
    response = service.UpdateLeadership(pb.UpdateLeadershipRequest(coordinator_epoch=1, server_id=1,
                                                                   buckets=list(buckets)), None)
    assert not response.error.code, response.error


def test_a_repeated_push_leaves_unchanged_replicas_as_they_are_and_takes_the_changed_ones(service):
    manager = service.replicas
    everything = [bucket(P4, 0), bucket(P4, 1, leader=2), bucket(P5, 0)]
    push(service, *everything)
    led, followed, other = manager.replica(4, 0), manager.replica(4, 1), manager.replica(5, 0)
    lead = led.leadership()  # opens its store, at leader epoch 1
    roles = led.role, followed.role, other.role
    assert followed in manager.followed() and not followed.leads

    push(service, *everything)
    assert (manager.replica(4, 0), manager.replica(4, 1), manager.replica(5, 0)) == (led, followed, other)
    assert all(now is before for now, before in zip((led.role, followed.role, other.role), roles))  # not taken again
    assert led.lead is lead and not lead.ended

    # the same leadership with a smaller ISR; the follower made leader; partition 5's bucket gone
    push(service, bucket(P4, 0, isr=[1], bucket_epoch=2), bucket(P4, 1, leader_epoch=2, bucket_epoch=2))
    assert led.role.isr == (1,) and led.lead is lead and lead.isr == frozenset({1}) and lead.bucket_epoch == 2
    assert manager.replica(4, 1) is followed and followed.leads and followed.role.leader_epoch == 2
    assert other.closed and [r.key for r in manager.all_replicas()] == [(4, 0), (4, 1)]
    assert followed.leadership().epoch == 2 and followed.store.leader_epoch == 2
