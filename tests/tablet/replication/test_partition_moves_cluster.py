"""A partition's buckets moved like a table's (docs/partitions.md, "Everything per partition bucket"): a
coordinator and three tablet servers in this process, a real ZooKeeper, real RocksDB, gRPC on loopback. A
``bucket reassign --partition`` moves that partition's bucket alone, a clean election names the partition,
and a decommission moves every partition bucket off the server; the rows of every partition stay whole and
the other partitions' replicas are not touched."""

from __future__ import annotations

import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_rebuild import rows_of
from tests.tablet.replication.test_replicated_buckets import FAST, server_by_id, three_servers

pytestmark = pytest.mark.zk

COLUMNS = [Column("day", "STRING"), Column("id", "BIGINT"), Column("v", "STRING")]
DAYS = ("20261128", "20261129")


@pytest.fixture
def cluster(make_config, tmp_path):
    with three_servers(make_config, tmp_path, FAST) as c:
        yield c


def states(c, table_id: int) -> dict[str, dict]:
    """``partition name -> {bucket: state}`` as the coordinator has them."""
    _table, by_partition = c.admin.partition_assignments(table_id)
    names = {p.partition_id: p.name for p in c.admin.list_partitions("db.events")[1]}
    return {names[partition_id]: buckets for partition_id, buckets in by_partition.items()}


def in_sync(c, table_id: int) -> dict[str, dict]:
    def lagging(now):
        return [f"{day}/{b}: isr {list(s.isr)}" for day, buckets in now.items() for b, s in buckets.items()
                if sorted(s.isr) != sorted(s.replicas) or s.reassign_target is not None]
    wait_until(lambda: not lagging(states(c, table_id)), 30, lambda: f"in sync: {lagging(states(c, table_id))}")
    return states(c, table_id)


def copies(c, table_id: int, partition_id: int, bucket: int, servers) -> list[dict]:
    """The bucket's rows on each of ``servers`` (once they agree on the high watermark)."""
    stores = [server_by_id(c, s).replicas.replica(partition_id, bucket).store for s in servers]
    wait_until(lambda: len({s.high_watermark for s in stores}) == 1, 20, "the replicas to apply")
    return [rows_of(s) for s in stores]


def test_a_partitions_bucket_moves_elects_and_leaves_a_decommissioned_server(cluster):
    c = cluster
    table = c.admin.create_table("db.events", COLUMNS, ["day", "id"], 2, replication_factor=2,
                                 partition_key=["day"])
    with TableClient(c.admin, "db.events", retry_total_s=30) as client:
        client.upsert([{"day": d, "id": i, "v": f"{d}-{i}"} for d in DAYS for i in range(40)])
    before = in_sync(c, table.table_id)
    ids = {p.name: p.partition_id for p in c.admin.list_partitions("db.events")[1]}

    # reassign bucket 0 of the first day: that bucket alone moves
    moved = before[DAYS[0]][0]
    new = next(s for s in (1, 2, 3) if s not in moved.replicas)
    target = [new, moved.leader_id]
    move = c.admin.reassign_bucket("db.events", 0, target, partition=DAYS[0])
    assert move["target"] == target and move.get("partition") == DAYS[0]
    assert c.admin.reassign_bucket("db.events", 0, target, partition=DAYS[0])["target"] == target  # resent
    wait_until(lambda: not c.admin.list_reassignments(), 30, "the move to complete")
    after = in_sync(c, table.table_id)
    assert list(after[DAYS[0]][0].replicas) == target
    assert after[DAYS[1]] == before[DAYS[1]] and after[DAYS[0]][1] == before[DAYS[0]][1]  # nothing else moved
    first, second = copies(c, table.table_id, ids[DAYS[0]], 0, target)
    with TableClient(c.admin, "db.events", partition=DAYS[0]) as day:
        assert first == second and len(first) == len(day.scan(buckets=[0]).rows) > 0

    # a clean election of that bucket's other replica
    other = next(s for s in target if s != after[DAYS[0]][0].leader_id)
    elected = c.admin.elect_leader("db.events", 0, unclean=False, tablet=other, partition=DAYS[0])
    assert elected["leader"] == other
    wait_until(lambda: states(c, table.table_id)[DAYS[0]][0].leader_id == other, 20, "the elected leader")
    with pytest.raises(errors.KvLeaseError, match="partition"):
        c.admin.elect_leader("db.events", 0, unclean=False, tablet=other)  # a partitioned table needs one

    # decommission a server: every partition bucket it held moves off it, and the rows stay
    gone = new
    c.admin.decommission_tablet(gone)
    wait_until(lambda: not c.admin.list_reassignments(), 60, "the decommission's moves")
    final = in_sync(c, table.table_id)
    assert all(gone not in s.replicas for buckets in final.values() for s in buckets.values())
    with TableClient(c.admin, "db.events", retry_total_s=30) as client:
        keys = [(d, i) for d in DAYS for i in range(40)]
        assert client.lookup(keys) == [{"day": d, "id": i, "v": f"{d}-{i}"} for d, i in keys]

