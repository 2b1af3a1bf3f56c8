"""A leader whose disk is full gives its leadership up (tablet/replicas/step_down.py), on real tablet server processes:
one bucket, replication factor 2, the leader's data dir on a 30 MB tmpfs (root only; skipped otherwise), an
in-process coordinator on the test's ZooKeeper, the client over gRPC on loopback.

The disk fills: writes fail; within 10 s the in-sync follower leads and takes reads and writes, and the old
leader reports why in its health; it cannot catch up while its disk is full; once space is freed it rejoins the
ISR as a follower, and led again it holds exactly the rows the other replica holds, every acknowledged write
among them. With no other in-sync replica the leader keeps the bucket and says why; a follower on a full disk
leaves the ISR by lag and rejoins once it has room (in-process servers, their data dirs on the tmpfs)."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.coordinator.server import CoordinatorServer
from kvlease.ops.local_cluster import ServerProcess, free_ports, read_health, status_fields
from kvlease.ops.wait import wait_until
from tests.support.fixtures.small_disk import fill, small_disk
from tests.support.local_cluster import LocalCluster

SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]
PAYLOAD = "x" * 2000  # ~100 KB per batch of 50 rows
STEP_DOWN_S = 10.0  # the bound: from the first failed write to another leader


@pytest.fixture
def cluster(make_config, tmp_path):
    """``(admin, {id: ServerProcess}, disk)``: tablet 1's data dir on the tmpfs ``disk``, tablet 2's on tmp_path."""
    with small_disk(tmp_path / "disk", size_mb=30) as disk:
        coordinator = CoordinatorServer(make_config()).start()
        tablets: dict[int, ServerProcess] = {}
        try:
            assert coordinator.wait_active(30)
            base = {k: v for k, v in make_config().as_dict().items() if k.startswith(("zookeeper.", "remote."))}
            for i, data_dir in ((1, disk / "data"), (2, tmp_path / "t2-data")):
                port, metrics_port = free_ports(2)
                tablets[i] = ServerProcess(tmp_path / f"t{i}", "tablet", {
                    **base, "tablet.id": i, "tablet.port": port, "metrics.port": metrics_port,
                    "tablet.data-dir": str(data_dir), "kv.snapshot.interval": "1h",
                    # a failed bucket is not reopened for 5 s: the step-down (3 s) comes first
                    "tablet.bucket.reopen-backoff": "5s", "tablet.bucket.reopen-backoff.max": "5s"})
            with AdminClient([coordinator.address], retry_total_s=30) as admin:
                wait_until(lambda: {s.id for s in admin.list_tablet_servers()} == {1, 2}, 60, "both registered")
                yield admin, tablets, disk
        except BaseException:
            for i, t in tablets.items():
                print(f"--- tablet {i} log ---\n{t.log_tail(80)}")
            raise
        finally:
            for t in tablets.values():
                t.stop()
            coordinator.stop()


def bucket_state(admin: AdminClient, table_id: int):
    return admin.get_table_assignment(table_id)[1][0]


def health_of(tablet: ServerProcess) -> dict:
    return read_health(f"127.0.0.1:{tablet.values['metrics.port']}")


def rows_of(admin: AdminClient) -> dict[int, str]:
    with TableClient(admin, "db.t", retry_total_s=20) as table:
        return {row["id"]: row["v"] for b in table.scan().batches for row in b.to_pylist()}


def led_by(admin: AdminClient, table_id: int, leader: int):
    """Leadership to ``leader`` (an operator's clean election) once both replicas are in sync."""
    wait_until(lambda: set(bucket_state(admin, table_id).isr) == {1, 2}, 30, "both replicas in sync")
    if bucket_state(admin, table_id).leader_id != leader:
        admin.elect_leader("db.t", 0, unclean=False, tablet=leader)
    state = wait_until(lambda: (s := bucket_state(admin, table_id)).leader_id == leader and s.leader_address and s,
                       30, f"tablet {leader} to lead")
    with TableClient(admin, "db.t", retry_total_s=20) as table:
        table.lookup([{"id": -1}])  # it serves (it took its push, and no earlier leader's lease lasts)
    return state


def write_until_the_disk_is_full(admin: AdminClient, acked: dict[int, str]) -> errors.KvLeaseError:
    """Batches of 50 rows until one fails (each acknowledged one recorded in ``acked``); returns its error."""
    with TableClient(admin, "db.t", retry_total_s=0) as table:
        for i in range(10_000):
            batch = {i * 50 + j: f"{i}-{PAYLOAD}" for j in range(50)}
            try:
                table.upsert([{"id": k, "v": v} for k, v in batch.items()])
            except errors.KvLeaseError as exc:
                return exc
            acked.update(batch)
    raise AssertionError("the disk never filled up")


def write_one(table: TableClient, key: int, acked: dict[int, str], refused: list[str]) -> None:
    """Write one row: recorded in ``acked``, or its error's message in ``refused``."""
    try:
        table.upsert([{"id": key, "v": PAYLOAD}])
        acked[key] = PAYLOAD
    except errors.KvLeaseError as exc:
        refused.append(exc.message)


def keep_writing_until_led_by(admin: AdminClient, table_id: int, leader: int, acked: dict[int, str],
                              refused: list[str]):
    """One write after another (:func:`write_one`) until ``leader`` leads; returns the bucket's state then."""
    keys = itertools.count(10**6)
    with TableClient(admin, "db.t", retry_total_s=0) as table:
        def led():
            state = bucket_state(admin, table_id)
            if state.leader_id == leader:
                return state
            write_one(table, next(keys), acked, refused)
            return None
        return wait_until(led, STEP_DOWN_S, f"tablet {leader} to lead")


def test_a_leader_on_a_full_disk_steps_down_and_rejoins_as_a_follower_once_it_has_room(cluster):
    admin, tablets, disk = cluster
    info = admin.create_table("db.t", SCHEMA, ["id"], 1, replication_factor=2)
    first = led_by(admin, info.table_id, 1)
    acked: dict[int, str] = {}
    filler = fill(disk, leave_bytes=2 << 20)
    failure = write_until_the_disk_is_full(admin, acked)
    failed_at = time.monotonic()
    assert acked and "No space left on device" in failure.message, failure.message

    # clients keep writing (a reopen may succeed: each write fails again); the follower leads within 10 s, the
    # full server out of the ISR; reads and writes go on there. A client that retries rides through: its write,
    # refused by the full leader as LEADER_NOT_AVAILABLE, lands on the new one
    riding: dict[int, str] = {}
    rider = threading.Thread(target=lambda: write_one(TableClient(admin, "db.t", retry_total_s=30), -10**6, riding,
                                                      riding.setdefault("refused", [])))
    rider.start()
    refused: list[str] = []
    moved = keep_writing_until_led_by(admin, info.table_id, 2, acked, refused)
    assert time.monotonic() - failed_at < STEP_DOWN_S
    rider.join(30)
    assert -10**6 in riding and not riding["refused"], riding.get("refused")
    acked[-10**6] = riding[-10**6]
    assert any("No space left on device" in m for m in refused), refused  # the writes meanwhile failed for it
    assert moved.isr == (2,) and moved.leader_epoch == first.leader_epoch + 1

    # the full server says why: its health, its metric, `cluster status --json`'s fields (it cannot reopen and
    # rejoin before its reopen backoff passed)
    health = wait_until(lambda: (h := health_of(tablets[1]))["stepped_down"] and h, 10, "the step-down reported")
    assert not health["healthy"] and health["resignations"] == 1
    assert health["stepped_down"] == [{"table_id": info.table_id, "table": "db.t", "bucket": 0,
                                       "cause": "ENOSPC: No space left on device"}]
    assert any("gave up leading 1 bucket(s)" in p and "bucket 0 of table db.t (ENOSPC" in p for p in health["problems"])
    status = status_fields(f"127.0.0.1:{tablets[1].values['metrics.port']}", True)
    assert status["stepped_down"] == health["stepped_down"]

    # the new leader takes reads and 4 MB of writes, more than the full disk could take: the old leader cannot
    # catch up, it stays out of the ISR
    with TableClient(admin, "db.t", retry_total_s=20) as table:
        for i in range(40):
            batch = {-(i * 50 + j + 1): f"new-{PAYLOAD}" for j in range(50)}
            table.upsert([{"id": k, "v": v} for k, v in batch.items()])
            acked.update(batch)
        keys = sorted(acked)
        assert [row["v"] for row in table.lookup(keys)] == [acked[k] for k in keys]
    assert bucket_state(admin, info.table_id).isr == (2,)

    # room again: it reopens, truncates what it did not commit, catches up and rejoins the ISR as a follower
    filler.unlink()
    wait_until(lambda: set(bucket_state(admin, info.table_id).isr) == {1, 2}, 30, "back in sync")
    # (led by tablet 2 still, or by tablet 1 again: its preferred replica, in sync, with room)
    wait_until(lambda: health_of(tablets[1])["healthy"], 10, "its health clear again")
    on_the_new_leader = rows_of(admin)
    assert all(on_the_new_leader.get(k) == v for k, v in acked.items())

    led_by(admin, info.table_id, 1)  # led again, it holds exactly what the other replica held
    assert rows_of(admin) == on_the_new_leader


def test_a_leader_on_a_full_disk_with_no_other_in_sync_replica_keeps_the_bucket_and_says_why(make_config, tmp_path):
    """In-process servers (their data dirs on one tmpfs): the follower is stopped, so the ISR is the leader alone;
    the coordinator refuses the resignation, the leader keeps the bucket and its health says why, and serves
    again once space is freed."""
    with small_disk(tmp_path / "disk", size_mb=30) as disk:
        c = LocalCluster(make_config, disk, 2, {"metrics.port": 0, "replica.max-lag": "1s",
                                                "replica.leader.failure-timeout": "500ms",
                                                "tablet.bucket.reopen-backoff": "100ms",
                                                "tablet.bucket.reopen-backoff.max": "200ms"})
        try:
            info = c.admin.create_table("db.t", SCHEMA, ["id"], 1, replication_factor=2)
            state = wait_until(lambda: (s := bucket_state(c.admin, info.table_id)).leader_address and s, 30, "led")
            leader, follower = state.leader_id, next(r for r in state.replicas if r != state.leader_id)
            c.stop_tablet(follower)
            wait_until(lambda: bucket_state(c.admin, info.table_id).isr == (leader,), 30, "the ISR of the leader alone")
            metrics = f"127.0.0.1:{c.tablets[leader].metrics_port}"
            acked: dict[int, str] = {}
            filler = fill(disk, leave_bytes=2 << 20)
            write_until_the_disk_is_full(c.admin, acked)
            refused: list[str] = []
            keys = itertools.count(10**6)
            with TableClient(c.admin, "db.t", retry_total_s=0) as table:
                def kept():  # clients keep writing: each write fails
                    write_one(table, next(keys), acked, refused)
                    return next((p for p in read_health(metrics)["problems"] if "keep their leadership" in p), None)
                problem = wait_until(kept, 10, "the refusal reported")
            assert "bucket 0 of table db.t has no other live in-sync replica" in problem, problem
            assert bucket_state(c.admin, info.table_id).leader_id == leader

            filler.unlink()  # it reopens by itself, still the leader
            wait_until(lambda: read_health(metrics)["healthy"], 10, "its health clear again")
            with TableClient(c.admin, "db.t", retry_total_s=20) as table:
                table.upsert([{"id": -1, "v": "after"}])
                acked[-1] = "after"
                keys = sorted(acked)
                assert [row["v"] for row in table.lookup(keys)] == [acked[k] for k in keys]
            assert bucket_state(c.admin, info.table_id).leader_id == leader
        finally:
            c.close()


def test_a_follower_on_a_full_disk_leaves_the_isr_and_rejoins_once_it_has_room(make_config, tmp_path):
    """In-process servers, the follower's data dir on the tmpfs: it cannot append, leaves the ISR by lag (writes
    go on), and once space is freed it reopens, catches up and rejoins; led then, it has every write."""
    with small_disk(tmp_path / "disk", size_mb=30) as disk:
        c = LocalCluster(make_config, tmp_path, 1, {"replica.max-lag": "1s", "tablet.bucket.reopen-backoff": "100ms",
                                                    "tablet.bucket.reopen-backoff.max": "200ms"})
        try:
            c.tablet_overrides["tablet.data-dir"] = str(disk / "t2")
            c.start_tablet(2)
            info = c.admin.create_table("db.t", SCHEMA, ["id"], 1, replication_factor=2)
            led_by(c.admin, info.table_id, 1)
            filler = fill(disk, leave_bytes=1 << 20)
            acked: dict[int, str] = {}
            with TableClient(c.admin, "db.t", retry_total_s=20) as table:
                for i in range(30):  # 3 MB: more than the follower's disk has room for
                    batch = {i * 50 + j: f"{i}-{PAYLOAD}" for j in range(50)}
                    table.upsert([{"id": k, "v": v} for k, v in batch.items()])
                    acked.update(batch)
            assert bucket_state(c.admin, info.table_id).isr == (1,)  # it could not keep up: out by lag
            filler.unlink()
            wait_until(lambda: bucket_state(c.admin, info.table_id).isr == (1, 2), 30, "the follower back in sync")
            led_by(c.admin, info.table_id, 2)
            assert rows_of(c.admin) == acked
        finally:
            c.close()
