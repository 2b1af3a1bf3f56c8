"""A seeded random sequence of the faults the other drills make, --rounds faults (default 6), while lease
clients, writers, readers and a Spark stream run; every drill's invariants checked at the end.

Checks: every acknowledged lease reads back as acknowledged (describe and
list on the active coordinator, ZooKeeper + files); no file of a leased
snapshot is deleted; no write is accepted from a deposed coordinator
(ZooKeeper's transaction log); every acknowledged write is in the table
(lookup and scan; an unacknowledged one may or may not be); the Spark query's
bootstrap has one row per key, every change after it is in its output
exactly once, and its output applied in order equals the table; every
lookup made during the faults is linearizable with the writes (it shows the
write last acknowledged before it was sent or a later one, and no earlier
write than a lookup answered before it was sent); the cluster is whole
again, every replica of the row table back in its ISR. Needs --coordinators 2
and --tablets 1 or more. The load and the faults start once the query wrote its
bootstrap: the query tails the changes through every fault.

The faults (:mod:`kvlease.ops.drills.chaos_plan`): ZooKeeper node restart, ZooKeeper leader
loss (3-node ensembles), kill -9 of the active coordinator, SIGSTOP/SIGCONT of
it (up to the session timeout + 2 s), tablet server restart, remote storage
outage (``file://`` remotes), SIGSTOP/SIGCONT of the leader of a bucket of the
row table (up to the session timeout + 2 s; the table has min(3, tablet
servers) replicas, so a longer pause makes another server its leader), a
full disk of such a leader (1 s up to replica.leader.failure-timeout + 4 s:
it steps down in the longer ones; only on tablet servers on small disks of
their own, kvlease cluster start --tablet-disk SIZE); each after a gap of
0-2 s, so it often meets the cluster still recovering from the one before.
--seed fixes the sequence (not the traffic's timing); a
failed run prints the command that replays it.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvlease.client.table import TableClient
import kvlease.ops.drills.chaos_disks as chaos_disks
import kvlease.ops.drills.chaos_faults as chaos_faults
import kvlease.ops.drills.chaos_plan as cp
from kvlease.ops.streaming import ChaosStream
from kvlease.ops import local_cluster
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.chaos_readers import Readers
from kvlease.ops.drills.cluster import DrillCluster, failure_timeout_s, in_sync_since, require, session_timeout_s
from kvlease.ops.drills.leases import LeaseDrill
from kvlease.ops.drills.read_checks import ReadOp, reads_in_order, reads_see_acknowledged_writes
from kvlease.ops.drills.faults import RemoteOutage
from kvlease.ops.drills.row_checks import rows_as_acknowledged
from kvlease.ops.drills.workload import Writers

NAME = "chaos"
OPTIONS = ("rounds", "clients", "seed")
KEYS = 400
LEASE_CLIENTS = 8
MAX_REPLICATION = 3
IN_SYNC_BOUND_S = 30.0


def check_shape(doc: dict) -> None:
    require(doc, NAME, coordinators=2, tablets=1)


def run(cluster_dir: str, rounds: int = 6, clients: int = LEASE_CLIENTS, seed: int = 0, spark=None) -> Report:
    """Run the drill; ``spark``: a SparkSession to use (left running), else a local one is started."""
    doc = local_cluster.load(cluster_dir)
    check_shape(doc)
    faults = cp.plan(seed, rounds, doc, session_timeout_s(doc), failure_timeout_s(doc))
    remote = RemoteOutage(doc["remote"]) if str(doc.get("remote", "")).startswith("file://") else None
    if remote is not None:
        remote.restore_interrupted()
    freed = chaos_disks.restore_interrupted(cluster_dir, doc)  # a disk a killed drill left full
    report = Report(NAME)
    report.figures.update(seed=seed, rounds=rounds, plan=[f.describe() for f in faults],
                          allowed_kinds=cp.allowed_kinds(doc), kinds_left_out=cp.left_out(doc),
                          **({"interrupted_disk_fills_freed": freed} if freed else {}))
    own_spark = spark is None
    scratch = Path(tempfile.mkdtemp(prefix="kvlease-drill-chaos-spark-"))
    try:
        if own_spark:
            from kvlease.ops.streaming import local_session

            _progress(f"starting Spark (local[2]; its log: {scratch / 'spark.log'})")
            spark = local_session(scratch, cores=2, app="kvlease-drill-chaos", log_file=scratch / "spark.log")
        with DrillCluster(cluster_dir, NAME, retry_total_s=60.0) as cluster:
            _run(cluster, spark, faults, remote, clients, seed, report)
    finally:
        if own_spark and spark is not None:
            from kvlease.ops.streaming import stop_local_session

            stop_local_session(spark, log_file=scratch / "spark.log")
        shutil.rmtree(scratch, ignore_errors=True)
    if not report.ok:
        report.figures["replay"] = (f"kvlease drill chaos --cluster DIR --seed {seed} --rounds {rounds} "
                                    f"--clients {clients} (on a cluster of the same shape)")
    return report


def _run(cluster: DrillCluster, spark, faults: list[cp.Fault], remote: RemoteOutage | None, clients: int,
         seed: int, report: Report) -> None:
    replication = min(MAX_REPLICATION, len(cluster.doc["tablets"]))
    table = cluster.create_table(cp.ROW_BUCKETS, "rows", replication_factor=replication,
                                 min_insync_replicas=max(1, replication - 1))
    stream = None
    try:
        with LeaseDrill(cluster, clients, seed, retry_total_s=60.0) as leases, \
                TableClient(cluster.admin, table, retry_total_s=60.0, request_timeout_s=5.0) as client:
            in_sync_since(cluster, client.table.table_id, time.time(), IN_SYNC_BOUND_S)  # a new table's followers join
            keys = list(range(KEYS))
            bucket_of = {k: b for b, _rows, idx in client.split(client.key_batch(keys)) for k in (keys[i] for i in idx)}
            writers = Writers(client, bucket_of, seed)
            writers.write({k: k for k in keys})
            client.trigger_snapshot(wait=True)
            stream = ChaosStream(spark, cluster.addresses, table, _progress)
            report.figures["stream_bootstrap_s"] = stream.wait_for_bootstrap()  # then the load and the faults
            targets = chaos_faults.Targets(remote, client.table.table_id)
            leases.start()
            writers.start()
            done: list[dict[str, Any]] = []
            readers = None
            ended = time.time()
            try:
                readers = Readers(cluster.admin, table, keys, seed)
                readers.start()
                ended = _inject_all(cluster, faults, targets, client, stream, done)
                time.sleep(1.0)  # writes and reads after the last fault
            finally:
                if readers is not None:
                    readers.stop()
                writers.stop()
            report.add(Check.of("the Spark query ran through every fault", [f for f in [stream.failed()] if f], 1))
            report.add(reads_see_acknowledged_writes(writers.history, readers.reads))
            report.add(reads_in_order(writers.history, readers.reads))
            report.figures.update(replication_factor=replication, faults_done=done, **_write_figures(writers),
                                  **_read_figures(readers, done), **_disk_figures(done, writers))
            whole = cluster.whole_again(timeout_s=60.0)  # every bucket served again before reading back
            in_sync, _leaders, in_sync_s = in_sync_since(cluster, client.table.table_id, ended, IN_SYNC_BOUND_S)
            report.figures.update(in_sync_after_s=in_sync_s)
            if stream.query.isActive:
                checks, figures = stream.finish(client)
                report.checks.extend(checks)
                report.figures.update(figures)
            looked_up = dict(zip(keys, (None if row is None else row["v"] for row in client.lookup(keys))))
            scanned = {row["id"]: row["v"] for row in client.scan().rows}
            report.add(rows_as_acknowledged(writers.history, {"lookup": looked_up, "scan": scanned}))
            for check in leases.checks():
                report.add(check)
            report.figures.update(**leases.figures())
            report.add(whole)
            report.add(in_sync)
    finally:
        if stream is not None:
            stream.close()
        cluster.drop_table(table)


def _inject_all(cluster: DrillCluster, faults: list[cp.Fault], targets: chaos_faults.Targets, client: TableClient,
                stream: ChaosStream, done: list[dict[str, Any]]) -> float:
    """Make each fault in turn (what was done into ``done``), until the last or the stream failed; returns when
    the last one was undone."""
    for number, fault in enumerate(faults, 1):
        _progress(f"fault {number}/{len(faults)}: {fault.describe()}")
        done.append(chaos_faults.inject(cluster, fault, targets))
        _snapshot(client)
        if stream.failed():
            break
    return time.time()


def _snapshot(client: TableClient) -> None:
    """Ask for snapshots of the stream's table (not waiting): the bootstrap's leased ones get old."""
    try:
        client.trigger_snapshot(wait=False)
    except Exception as exc:  # noqa: BLE001 - a fault may be under way: the next one is asked after the next fault
        _progress(f"snapshot request failed: {exc}")


def _write_figures(writers: Writers) -> dict[str, Any]:
    writes = [w for ws in writers.history.values() for w in ws]
    return {"write_calls": len(writers.calls), "unacknowledged_writes": sum(not w.acked for w in writes),
            "write_failures": dict(writers.failures)}


def _read_figures(readers: Readers, done: list[dict[str, Any]]) -> dict[str, Any]:
    """How many lookups, what failed, and how many answered lookups were under way while a leader was paused
    or its disk full."""
    pauses, fulls = ([(d["at"], d["at"] + d["seconds"]) for d in done if d["kind"] == kind
                      and d["node"].startswith("tablet")] for kind in (cp.TABLET_PAUSE, cp.DISK_FULL))
    answered = [r for r in readers.reads if not r.error]
    return {"read_calls": readers.calls, "reads_checked": len(answered), "read_failures": dict(readers.failures),
            "tablet_pauses": len(pauses), "reads_across_tablet_pauses": sum(_overlaps(r, pauses) for r in answered),
            **({"reads_across_full_disks": sum(_overlaps(r, fulls) for r in answered)} if fulls else {})}


def _disk_figures(done: list[dict[str, Any]], writers: Writers) -> dict[str, Any]:
    """How many full disks, in how many the leader had given the bucket up by the time it was freed, and per
    full disk how many write calls to its bucket were sent while it was full (none: nothing asked the leader to
    write, so it had no reason to step down)."""
    fulls = [d for d in done if d["kind"] == cp.DISK_FULL and "leader" in d]
    if not fulls:
        return {}
    moved = [d for d in fulls if d["leader_when_freed"] is not None and d["leader_when_freed"] != d["leader"]]
    sent = [sum(d["at"] <= t0 <= d["at"] + d["seconds"] and d["bucket"] in buckets
                for t0, _t1, buckets, _acked in writers.calls) for d in fulls]
    return {"disk_fulls": len(fulls), "disk_full_step_downs": len(moved), "writes_sent_to_full_disks": sent}


def _overlaps(read: ReadOp, windows: list[tuple[float, float]]) -> bool:
    return any(read.t0 < end and read.t1 > start for start, end in windows)


def _progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
