"""A rebuild's download under a slow ``replica.rebuild.max-bytes-per-s``: the snapshot it downloads is leased
(newer snapshots subsume it meanwhile, it is not deleted), the lease is released after the install; a server
stopped mid-download stops at once and leaves no partial files. Three tablet servers in this process, a real
ZooKeeper, RocksDB, gRPC on loopback and file:// remote storage."""

from __future__ import annotations

import logging
import os
import time

import pytest

from kvlease.client.table import TableClient
from kvlease.ops.wait import wait_until
from tests.tablet.replication.test_rebuild import RETENTION, lose_follower, rows_of, snapshot_and_retain, write
from tests.tablet.replication.test_replicated_buckets import SCHEMA, server_by_id, three_servers, wait_in_sync
from kvlease.tablet.replication.rebuild import DOWNLOAD_DIR

pytestmark = pytest.mark.zk

#: ~34 KB snapshots at 1 KB/s: a download takes ~30 s unless a test lifts the limit
#: (``rebuilder.throttle.rate = 0``, seen by a waiting download within 0.1 s).
SLOW = {**RETENTION, "replica.rebuild.max-bytes-per-s": "1kb", "kv.snapshot.num-retained": "1"}


@pytest.fixture
def cluster(make_config, tmp_path):
    with three_servers(make_config, tmp_path, SLOW) as c:
        yield c


def rebuild_leases(c) -> list:
    return [lease for lease in c.admin.list_leases() if lease.lease_id.startswith("rebuild-tablet-")]


def kept_ids(c, table_id: int) -> set[int]:
    return {info.handle.snapshot_id for info in c.admin.list_kv_snapshots(table_id)}


def test_the_snapshot_being_downloaded_is_leased_and_survives_newer_snapshots(cluster, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kvlease.tablet.replication.rebuild")
    c = cluster
    table = c.admin.create_table("db.leased", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
    with TableClient(c.admin, "db.leased", retry_total_s=30) as client:
        wait_in_sync(c, table.table_id)
        write(client, 0, 200, "a")
        server_id, leader = lose_follower(c, table.table_id)
        first = snapshot_and_retain(leader, table.table_id)
        back = c.tablet(server_id, tmp_path / f"t{server_id}-new")  # a new, empty data dir
        (lease,) = wait_until(lambda: rebuild_leases(c), 10, "the rebuild's lease")
        assert lease.lease_id == f"rebuild-tablet-{server_id}-t{table.table_id}-b0"
        assert dict(lease.buckets) == {first.bucket: first.snapshot_id}
        for tag in ("b", "c"):  # num-retained 1: each newer snapshot subsumes the ones before
            write(client, 200, 20, tag)
            newest = snapshot_and_retain(leader, table.table_id)
        assert back.fetchers.rebuilder.busy(back.replicas.replica(table.table_id, 0))  # still downloading
        assert kept_ids(c, table.table_id) == {first.snapshot_id, newest.snapshot_id}  # the leased one stays
        back.fetchers.rebuilder.throttle.rate = 0  # the download may finish now
        store = back.replicas.replica(table.table_id, 0).store
        wait_in_sync(c, table.table_id)
        # rebuilt from the leased snapshot (its log start moves on by retention once the lease is released)
        wait_until(lambda: back.fetchers.rebuilder.rebuilt == 1, 10, "the rebuild")
        assert f"rebuilt from snapshot {first.snapshot_id}:" in caplog.text
        wait_until(lambda: not rebuild_leases(c), 10, "the lease released")
        wait_until(lambda: kept_ids(c, table.table_id) == {newest.snapshot_id}, 10, "the subsumed snapshot deleted")
        leader_store = leader.replicas.replica(table.table_id, 0).store
        wait_until(lambda: store.high_watermark >= leader_store.high_watermark, 20, "the follower to catch up")
        assert rows_of(store) == rows_of(leader_store)


def test_a_server_stopped_mid_download_stops_at_once_and_leaves_no_partial_files(make_config, tmp_path):
    with three_servers(make_config, tmp_path, SLOW) as c:
        table = c.admin.create_table("db.stopped", SCHEMA, ["id"], 1, replication_factor=3, min_insync_replicas=2)
        with TableClient(c.admin, "db.stopped", retry_total_s=30) as client:
            wait_in_sync(c, table.table_id)
            write(client, 0, 200, "a")
            server_id, leader = lose_follower(c, table.table_id)
            snapshot_and_retain(leader, table.table_id)
            back = c.tablet(server_id, tmp_path / f"t{server_id}-new")  # a new, empty data dir
            download = tmp_path / f"t{server_id}-new" / str(table.table_id) / "0" / DOWNLOAD_DIR
            wait_until(lambda: rebuild_leases(c) and os.path.isdir(download), 10, "the download to start")
            started = time.monotonic()
            c.tablets.remove(back)
            back.stop()
            assert time.monotonic() - started < 5  # not the download's ~30 s, nor the worker's 30 s join
            assert not os.path.exists(download)
            assert back.fetchers.rebuilder.rebuilt == 0
            wait_until(lambda: not rebuild_leases(c), 10, "the lease released")
            assert server_by_id(c, leader.server_id) is leader
