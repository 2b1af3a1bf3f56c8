"""kill -9 the active coordinator, --rounds times (default 2), while rows are written into an auto-partitioned
table (a partition per second) and retention drops old partitions, one of them held by a lease.

Checks: no partition within retention at the end is lost (each listed, every acknowledged row of it found);
the leased partition outlives its retention while the lease holds it and its snapshot reads the same rows
each time (after every failover too); after the lease is released the partition is dropped within a few
auto-partition check intervals; no local bucket dir (any tablet server) and no remote directory
``kv/{table}/p{id}/`` of a partition that no longer exists is left once the drops settle (a leftover is
reported with its path, partition and when it was dropped); the writers saw no error but retriable ones
(counted). Needs --coordinators 2, --tablets 2 and a file:// remote, started with a short check interval:
``kvlease cluster start --dir D --coordinators 2 --tablets 2 --set auto-partition.check-interval=1s``.

The table: ``drill.partitions_<run id>`` (ts STRING, id BIGINT, v BIGINT; primary key ts, id; partitioned by
ts, unit SECOND, precreate 2, retention 10, 2 buckets, replication factor 2). Writer threads upsert batches
into the current second's partition (created on write); a second one's partition is snapshotted and leased
early. The kills are spread over --seconds of writing (default 30); each killed coordinator is restarted at
once as a standby. At the end retention is turned off (so no drop is under way) before the dirs are looked
at, and the table is dropped.
"""

from __future__ import annotations

import calendar
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from kvlease.client.snapshot_read import read_snapshot
from kvlease.client.table import TableClient
from kvlease.common.auto_partition import AutoPartition, TimeUnit
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.drills import partition_checks as checks
from kvlease.ops.drills.cluster import DRILL_DB, ClusterShapeError, DrillCluster, auto_partition_interval_s, require
from kvlease.ops.drills.partition_traffic import PartitionWatch, Writers, second_of
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.wait import poll

NAME = "partitions"
OPTIONS = ("seconds", "rounds")
MAX_CHECK_INTERVAL_S = 5.0
PRECREATE, RETENTION, BUCKETS = 2, 10, 2
WRITERS = 2
START = "kvlease cluster start --dir D --coordinators 2 --tablets 2 --set auto-partition.check-interval=1s"


def check_shape(doc: dict) -> None:
    require(doc, NAME, coordinators=2, tablets=2, file_remote=True)
    interval = auto_partition_interval_s(doc)
    if interval > MAX_CHECK_INTERVAL_S:
        raise ClusterShapeError(f"drill {NAME} needs auto-partition.check-interval of {MAX_CHECK_INTERVAL_S:g}s "
                                f"or less (the cluster's coordinators use {interval:g}s); start one with: {START}")


def run(cluster_dir: str, seconds: float = 30.0, rounds: int = 2) -> Report:
    doc = local_cluster.load(cluster_dir)
    check_shape(doc)
    interval = auto_partition_interval_s(doc)
    report = Report(NAME)
    with DrillCluster(cluster_dir, NAME) as cluster:
        path = f"{DRILL_DB}.partitions_{cluster.run_id}"
        table = cluster.admin.create_table(
            path, [Column("ts", "STRING"), Column("id", "BIGINT"), Column("v", "BIGINT")], ["ts", "id"], BUCKETS,
            replication_factor=2, partition_key=["ts"], auto_partition=AutoPartition(TimeUnit.SECOND, PRECREATE,
                                                                                    RETENTION))
        try:
            _drill(cluster, path, table.table_id, float(seconds), rounds, interval, report)
        finally:
            cluster.drop_table(path)
        report.add(cluster.whole_again())
    return report


def _drill(cluster: DrillCluster, path: str, table_id: int, seconds: float, rounds: int, interval: float,
           report: Report) -> None:
    lease_id = f"drill-partitions-{cluster.run_id}"
    with PartitionWatch(cluster.admin, path) as watch, Writers(cluster.admin, path, WRITERS, RETENTION) as writers:
        started = time.time()
        writers.wait_for_acks(1, 30.0)
        time.sleep(1.5)
        held = Held(cluster, path, lease_id, second_of(time.time() - 1), seconds + 120)
        kills = []
        for k in range(rounds):
            time.sleep(max(0.0, started + seconds * (k + 1) / (rounds + 1) - time.time()))
            victim = cluster.active_coordinator()
            kills.append(cluster.kill("coordinators", victim["id"]))
            cluster.restart("coordinators", victim["id"])
            held.read()
        time.sleep(max(0.0, started + seconds - time.time()))
        writers.wait_for_acks(len(writers.ack_times) + WRITERS, 30.0)  # rows within retention to look for: a
        writers.stop()  # run that ends inside the write pause after the last kill would have none
        report.add(_within_retention(cluster, path, writers))
        report.add(checks.writers_only_retriable(writers.errors, writers.calls))
        _release(held, watch, interval, report)
        cluster.admin.alter_table(path, retention=-1)  # no drop under way while the dirs are looked at
        report.add(_orphans(cluster, table_id, watch, interval))
        report.figures.update(
            seconds=seconds, kills=len(kills), writers=WRITERS, write_calls=writers.calls,
            rows_acknowledged=writers.rows, retriable_errors=writers.retriable,
            writes_past_retention=writers.expired,
            write_gap_after_kill_s=[writers.gap_after(at) for at in kills], partitions_seen=len(watch.seen),
            partitions_dropped=sum(1 for s in watch.seen.values() if s.gone is not None),
            leased_partition=held.name, leased_rows=held.first_rows, snapshot_reads=len(held.reads) + 1,
            held_dropped_after_release_s=held.dropped_after_s)


class Held:
    """Partition ``name``'s buckets snapshotted and leased (``lease_id``); :meth:`read` reads the snapshot."""

    def __init__(self, cluster: DrillCluster, path: str, lease_id: str, name: str, duration_s: float) -> None:
        self.admin, self.name, self.lease_id = cluster.admin, name, lease_id
        self.storage = cluster.storage
        with TableClient(self.admin, path, partition=name) as client:
            client.trigger_snapshot()
            self.table = client.table
        infos = self.admin.get_latest_kv_snapshots(self.table.table_id, self.table.partition_id)
        self.admin.acquire_lease(lease_id, {i.bucket: i.snapshot_id for i in infos.values()},
                                 int(duration_s * 1000))
        self.handles = [i.handle for i in infos.values()]
        self.reads: list[int | str] = []
        self.first_rows = self._rows()
        self.dropped_after_s: float | None = None

    def _rows(self) -> int:
        table = self.admin.get_table_by_id(self.table.table_id)
        return sum(read_snapshot(self.admin, h, table=table, storage=self.storage).num_rows for h in self.handles)

    def read(self) -> None:
        try:
            self.reads.append(self._rows())
        except Exception as exc:  # noqa: BLE001 - a failed read is what the check reports
            self.reads.append(f"{type(exc).__name__}: {exc}")


def _within_retention(cluster: DrillCluster, path: str, writers: Writers) -> checks.Check:
    """Partitions written within the newest RETENTION-1 seconds before the listing: listed, rows all found."""
    listed_at = time.time()
    _table, partitions = cluster.admin.list_partitions(path)
    oldest_kept = second_of(listed_at - (RETENTION - 1))
    expected = [name for name in writers.acked if name >= oldest_kept]
    found = {}
    with TableClient(cluster.admin, path, create_partitions=False) as client:
        for name in expected:
            keys = [{"ts": name, "id": i} for i in writers.acked[name]]
            found[name] = sum(1 for row in client.lookup(keys) if row is not None) if keys else 0
    acked = {name: len(writers.acked[name]) for name in expected}
    return checks.kept_within_retention(expected, [p.name for p in partitions], acked, found)


def _release(held: Held, watch: PartitionWatch, interval: float, report: Report) -> None:
    """Wait until the leased partition is past retention (listed as held), read it, release, time its drop."""
    past = calendar.timegm(time.strptime(held.name, "%Y%m%d%H%M%S")) + RETENTION + 1
    time.sleep(max(0.0, past + 2 * interval - time.time()))
    info = watch.current().get(held.name)
    held.read()
    report.add(checks.leased_kept(held.name, info is not None, info.held_by if info else (), held.lease_id,
                                  held.reads, held.first_rows))
    released = time.time()
    held.admin.drop_lease(held.lease_id)
    bound = 3 * interval + 5.0
    _, gone = poll(lambda: held.name not in watch.current(), bound, interval_s=0.2)
    held.dropped_after_s = round(time.time() - released, 3) if gone else None
    report.add(checks.dropped_after_release(held.name, held.dropped_after_s, bound))


def _scan(cluster: DrillCluster, table_id: int) -> tuple[dict[str, int], dict[str, int]]:
    """Every local bucket dir of a physical id above ``table_id`` that is not another table's or another
    table's partition (any tablet server: ids of tables and partitions share one counter), and every remote
    dir of the table's partitions that holds a file: (local, remote), each path -> partition id."""
    others = _other_physical_ids(cluster, table_id)
    local: dict[str, int] = {}
    for tablet in cluster.doc["tablets"]:
        home = local_cluster.tablet_disks.data_dir(cluster.directory, tablet["id"])
        for entry in home.iterdir() if home.is_dir() else ():
            if entry.is_dir() and entry.name.isdigit() and int(entry.name) > table_id and int(entry.name) not in others:
                local[str(entry)] = int(entry.name)
    remote: dict[str, int] = {}
    root = Path(unquote(urlparse(cluster.doc["remote"]).path)) / "kv" / str(table_id)
    for entry in root.iterdir() if root.is_dir() else ():
        if entry.name.startswith("p") and entry.name[1:].isdigit() and any(p.is_file() for p in entry.rglob("*")):
            remote[str(entry)] = int(entry.name[1:])
    return local, remote


def _orphans(cluster: DrillCluster, table_id: int, watch: PartitionWatch, interval: float) -> checks.Check:
    """Poll until no dir of a partition that no longer exists is left (or 3 check intervals + 10 s)."""
    leftovers: tuple[dict[str, int], dict[str, int]] = ({}, {})
    scanned = 0

    def settled() -> bool:
        nonlocal leftovers, scanned
        local, remote = _scan(cluster, table_id)
        existing = {s.partition_id for s in watch.current().values()}  # listed after the scan
        scanned = len(local) + len(remote)
        leftovers = tuple({p: pid for p, pid in found.items() if pid not in existing} for found in (local, remote))
        return not any(leftovers)
    poll(settled, 3 * interval + 10.0, interval_s=0.5)
    return checks.no_orphans(leftovers[0], leftovers[1], watch.seen, scanned)


def _other_physical_ids(cluster: DrillCluster, table_id: int) -> set[int]:
    """The ids of the cluster's other tables and of their partitions."""
    others = set()
    for table in cluster.admin.list_tables():
        if table.table_id != table_id:
            others.add(table.table_id)
            if table.partitioned:
                others.update(p.partition_id for p in cluster.admin.list_partitions(table_id=table.table_id)[1])
    return others


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
