"""A Spark stream over a bucket that loses data, end to end: a real coordinator and tablet server (real
ZooKeeper, RocksDB, gRPC on loopback, ``file://`` remote storage) and real Spark. A one-replica bucket
whose disk is wiped is restored from its snapshot (``restore --accept-data-loss``) and new changes take the
lost offsets: a query that had read past the snapshot fails with DATA_LOST naming the bucket and the lost
range, and emits none of the new changes; one that had not read past it goes on; a batch read sees the
restored table."""

from __future__ import annotations

import shutil

import pytest
from pyspark.errors import StreamingQueryException

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.ops.wait import wait_until
from tests.spark_source.test_spark_stream import Collector, run
from tests.tablet.replication.test_replicated_buckets import FAST, SCHEMA, bucket_state, crash
from tests.tablet.test_tablet_server import Cluster

pytestmark = pytest.mark.slow

TABLE = "db.lost"


@pytest.fixture
def cluster(make_config, tmp_path):  # tmp_path outlives the server whose data dir it holds
    c = Cluster(make_config, {**FAST, "kv.snapshot.interval": "1h"})  # snapshots: taken by the test
    try:
        yield c
    finally:
        c.close()


def _served(client, ids):
    try:
        return client.lookup([{"id": i} for i in ids])
    except errors.RetriableError:  # the restored leader not serving yet
        return None


class _Killed(Exception):
    pass


def _die(batch_id: int) -> None:
    raise _Killed("killed mid-batch")


def _assert_data_lost(error: StreamingQueryException, snapshot_id: int) -> None:
    """What the user sees in the StreamingQueryException: the error, the bucket and the range read."""
    assert f"DataLostError: bucket 0 of {TABLE}: offsets 10..14 this query read were lost when the bucket was " \
           f"restored from snapshot {snapshot_id} at " in str(error), str(error)
    assert "start the query again from a new checkpoint" in str(error)


def test_a_stream_past_the_restored_offset_fails_with_data_lost_and_one_before_it_goes_on(spark, cluster,
                                                                                         tmp_path):
    c = cluster
    server = c.tablet(1, tmp_path / "t1")
    table = c.admin.create_table(TABLE, SCHEMA, ["id"], 1)
    with TableClient(c.admin, TABLE) as client:
        client.upsert([{"id": i, "v": "old"} for i in range(10)])  # offsets 0..9
    assert server.replicas.snapshot_changed() == 1  # the snapshot at log offset 10
    behind = Collector()  # bootstrapped from the snapshot: its position is the snapshot's log offset
    run(spark, c, tmp_path / "behind", behind, table=TABLE)
    assert sorted(r["id"] for r in behind.rows()) == list(range(10))
    with TableClient(c.admin, TABLE) as client:
        client.upsert([{"id": i, "v": "tail"} for i in range(10, 15)])  # offsets 10..14: the tail to be lost
    assert server.log_ends.run_once() == 1
    past = Collector()  # bootstrapped from the snapshot and the tail: its position is 15
    run(spark, c, tmp_path / "past", past, table=TABLE)
    assert sorted((r["id"], r["v"]) for r in past.rows()) == [(i, "old" if i < 10 else "tail") for i in range(15)]
    with pytest.raises(Exception, match="killed mid-batch"):  # the changelog 0..14 planned, never committed
        run(spark, c, tmp_path / "crashed", Collector(before=_die), table=TABLE, startup_mode="earliest")

    crash(c, server)  # the disk is lost: the server comes back with an empty data dir
    shutil.rmtree(tmp_path / "t1")
    c.tablet(1, tmp_path / "t1")
    wait_until(lambda: bucket_state(c, table.table_id).offline_reason, 20, "the bucket offline")
    loss = c.admin.restore_bucket(TABLE, 0, accept_data_loss=True)["loss"]
    assert (loss.from_offset, loss.last_known_end) == (10, 15)
    new = [{"id": i, "v": "new"} for i in range(100, 106)]  # offsets 10..15: reused, and one past the tail
    with TableClient(c.admin, TABLE) as client:
        wait_until(lambda: _served(client, [0]), 20, "the restored bucket to serve")
        client.upsert(new)

    again, crashed = Collector(), Collector()
    with pytest.raises(StreamingQueryException) as failed:  # planning its next micro-batch from 15
        run(spark, c, tmp_path / "past", again, table=TABLE)
    _assert_data_lost(failed.value, loss.snapshot_id)
    assert again.rows() == []  # none of the new changes at the reused offsets
    with pytest.raises(StreamingQueryException) as failed:  # Spark runs its planned batch 0..14 again
        run(spark, c, tmp_path / "crashed", crashed, table=TABLE, startup_mode="earliest")
    _assert_data_lost(failed.value, loss.snapshot_id)
    assert crashed.rows() == []

    run(spark, c, tmp_path / "behind", behind, table=TABLE)  # it never read the lost range: it goes on
    tail = [r for r in behind.rows() if r["_log_offset"] >= 10]
    assert sorted((r["_log_offset"], r["id"], r["v"], r["_change_type"]) for r in tail) == \
        [(10 + i, row["id"], "new", "insert") for i, row in enumerate(new)]

    batch = spark.read.format("kvlease").option("bootstrap", c.coordinator.address).option("table", TABLE).load()
    assert sorted((r["id"], r["v"]) for r in batch.collect()) == \
        [(i, "old") for i in range(10)] + [(r["id"], "new") for r in new]
