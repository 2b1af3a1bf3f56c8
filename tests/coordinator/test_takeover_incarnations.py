"""A new active coordinator knows which tablet servers its predecessor saw (coordinator/seen_servers.py): the
buckets of servers still registered as they were keep their leader epochs and serve on at once after a
failover (a new epoch would make each wait out a leader lease), while a server that restarted while no
coordinator was active is seen as restarted: its one-replica buckets get a new leader epoch, as a live
coordinator would have given them."""

from __future__ import annotations

import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.coordinator.server import CoordinatorServer
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]


def _take_over(c: LocalCluster) -> None:
    """Stop the active coordinator, start another on the same ZooKeeper, point the admin client at it."""
    c.coordinator.stop()
    c.admin.close()
    c.coordinator = CoordinatorServer(c.make_config()).start()
    assert c.coordinator.wait_active(30), "no active coordinator"
    c.admin = AdminClient([c.coordinator.address], retry_total_s=10)


def _epochs(c: LocalCluster, table_id: int) -> dict[int, tuple[int, int]]:
    return {b: (s.leader_id, s.leader_epoch) for b, s in c.admin.get_table_assignment(table_id)[1].items()}


def test_a_failover_keeps_the_leader_epochs_of_servers_registered_as_they_were(make_config, tmp_path):
    c = LocalCluster(make_config, tmp_path, 1)
    try:
        table = c.create_table("db.t", SCHEMA, ["id"], 2)
        with TableClient(c.admin, "db.t", retry_total_s=10) as client:
            client.upsert([{"id": 1, "v": "a"}])
        before = _epochs(c, table.table_id)
        _take_over(c)
        wait_until(lambda: 1 in {s.id for s in c.admin.list_tablet_servers()}, 30, "the server seen again")
        assert _epochs(c, table.table_id) == before  # the same leaders, the same epochs
        server = c.tablets[1]  # told all it holds by the new coordinator all the same
        wait_until(lambda: server.replicas.coordinator_epoch == c.coordinator.epoch, 15, "the new coordinator's push")
        with TableClient(c.admin, "db.t", retry_total_s=0) as client:  # no lease to wait out: served at once
            assert client.lookup([{"id": 1}]) == [{"id": 1, "v": "a"}]

        c.coordinator.stop()  # no active coordinator while the server restarts
        c.tablets.pop(1).stop()
        from kvlease.tablet.server import TabletServer
        c.tablets[1] = TabletServer(c.tablet_config(1)).start()
        _take_over(c)
        bumped = wait_until(lambda: (e := _epochs(c, table.table_id)) != before and e, 30, "new leader epochs")
        assert all(bumped[b] == (1, epoch + 1) for b, (_leader, epoch) in before.items())
        with TableClient(c.admin, "db.t", retry_total_s=30) as client:
            assert client.lookup([{"id": 1}]) == [{"id": 1, "v": "a"}]
    finally:
        c.close()
