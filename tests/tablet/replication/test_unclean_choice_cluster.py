"""An unclean election without ``--tablet`` refuses to make a replica that lost its data lead (coordinator/data_loss_plan.py
``unclean_choice``), on real servers: a coordinator and two tablet servers in this process, a real ZooKeeper, real
RocksDB, gRPC on loopback. The follower's bucket dir is deleted while both servers are down; the follower comes back
first and reports its replica lost; the in-sync leader's return brings the bucket back with nothing lost."""

from __future__ import annotations

import shutil

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors, zkpaths
from kvlease.common.zk import loads
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_data_loss_cluster import _served, cluster, two_in_sync  # noqa: F401  (fixture)
from tests.tablet.replication.test_replicated_buckets import bucket_state, crash, server_by_id

pytestmark = pytest.mark.zk


def _stored(c, table_id: int) -> dict:
    return loads(c.coordinator.zk.get(zkpaths.table_assignment(table_id))[0])["buckets"]["0"]


def test_an_unclean_election_refuses_the_only_live_replica_when_it_lost_its_data(cluster, tmp_path):
    c = cluster
    table, leader, follower = two_in_sync(c, tmp_path, "db.choice")
    with TableClient(c.admin, "db.choice") as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(10)])
    emptied = server_by_id(c, follower)
    bucket_dir = emptied.replicas.bucket_dir(table.table_id, 0)
    wait_until(lambda: (tmp_path / f"t{follower}" / "held" / f"{table.table_id}-0").exists(), 10, "held")
    crash(c, emptied)
    shutil.rmtree(bucket_dir)
    crash(c, server_by_id(c, leader))
    offline = wait_until(lambda: (s := bucket_state(c, table.table_id)).leader_id == -1 and s, 20, "offline")
    assert offline.isr == (leader,)  # kept for the in-sync replica's return

    c.tablet(follower, tmp_path / f"t{follower}")  # back first, without its bucket dir: it reports the loss
    wait_until(lambda: _stored(c, table.table_id).get("lost") == [follower], 20, "the loss remembered")
    with pytest.raises(errors.InvalidRequestError, match=rf"every live replica \[{follower}\] lost its data.*"
                                                         rf"start its in-sync replica\(s\) \[{leader}\] again"):
        c.admin.elect_leader("db.choice", 0, unclean=True)
    assert bucket_state(c, table.table_id).losses == ()  # nothing accepted, nothing changed

    c.tablet(leader, tmp_path / f"t{leader}")  # the in-sync replica returns: it leads with every write
    with TableClient(c.admin, "db.choice") as client:
        rows = wait_until(lambda: _served(client), 20, "the bucket served again")
    assert rows[:10] == [{"id": i, "v": f"v{i}"} for i in range(10)]
    wait_until(lambda: len(bucket_state(c, table.table_id).isr) == 2, 30, "the emptied replica rebuilt, in sync")
    assert "lost" not in _stored(c, table.table_id)
