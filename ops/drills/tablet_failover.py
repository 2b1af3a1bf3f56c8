"""kill -9 the leader of some buckets of an RF-3 table during writes, lookups and a live scan, --rounds
times (default 2), the last round a SIGSTOP past the ZooKeeper session timeout, then SIGCONT.

Checks (ops/drills/failover_checks.py): every acknowledged write is in every
replica's changelog exactly once, at the offsets the server answered, and
its effect in every replica's table; no value a reader (lookup, scan) saw is
missing from the committed changelog afterwards; the replicas' changelogs are
byte for byte identical below the high watermark; every bucket a killed or paused
leader led is served again within ``zookeeper.session-timeout`` + 2 s; every
replica is back in the ISR afterwards; scans return only right data and resume;
a Spark streaming query (bootstrap, then the changes) runs through every fault,
and its rows applied in (bucket, offset) order equal the table. Needs --tablets 3
(a table with replication factor 3 and min.insync-replicas 2).

Writers (threads, each owning its keys) upsert and delete through
:class:`~kvlease.client.table.TableClient` with idempotent retries; a reader looks up
keys of every bucket all along, one bucket per call with a short request
timeout, which also times when a bucket is served again; each round a scanner
(resume=True) reads one of the victim's buckets, one batch before the fault
and the rest after it. Once every replica is back in the ISR, each replica's
changelog is read from its data dir (ops/drills/replica_logs.py); a replica's
table is its changelog applied up to the high watermark (its RocksDB is not
read: the tablet server keeps it open and RocksDB's WAL is off, so memtable
rows are only in the changelog). The Spark query is the chaos drill's
(:class:`kvlease.ops.streaming.ChaosStream`: Parquet, one directory per micro-batch,
checked by ops/streaming/feed_check.py once it read every bucket to its end).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.streaming import BOOTSTRAP_BOUND_S, ChaosStream
from kvlease.ops.drills.cluster import DRILL_DB, DrillCluster, in_sync_since, require, session_timeout_s
from kvlease.ops.drills.faults import paused
from kvlease.ops.drills.failover_checks import (Outage, Read, acknowledged_writes_in_changelog, apply_changes,
                                                leaders_served_within, reads_committed, replicas_identical,
                                                tables_as_acknowledged)
from kvlease.ops.drills.replica_logs import ReplicaLogs, change_records, describe_frame, fingerprints, read_replica_logs
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.row_checks import ScanRecord, scans_end_cleanly, scans_match
from kvlease.ops.drills.workload import AckedWriters, scan_after_kill

NAME = "tablet-failover"
OPTIONS = ("rounds", "seed")
KEYS = 400
BUCKETS = 4
REPLICATION = 3
MIN_INSYNC = 2
SCAN_BATCH_BYTES = 1024
PROBE_TIMEOUT_S = 0.5  # a lookup of a paused leader gives up this soon; the next one asks for the new leader
PROBE_KEYS = 4
IN_SYNC_BOUND_S = 30.0


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=REPLICATION)


class Lookups:
    """A thread looking up keys of every bucket all along, one bucket per call, through a client of its own
    with a short request timeout (a call to a paused leader gives up after ``PROBE_TIMEOUT_S`` and the
    routing is fetched again): every value seen kept as a :class:`Read`, every answered call as
    ``(sent, answered)`` per bucket, which times when a bucket is served again."""

    def __init__(self, admin, table: str, bucket_of: dict[int, int], seed: int) -> None:
        self.client = TableClient(admin, table, retry_total_s=1.0, request_timeout_s=PROBE_TIMEOUT_S)
        self.keys_of: dict[int, list[int]] = {}
        for key, bucket in sorted(bucket_of.items()):
            self.keys_of.setdefault(bucket, []).append(key)
        self.rng = random.Random(seed)
        self.reads: list[Read] = []
        self.served: dict[int, list[tuple[float, float]]] = {}
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drill-lookups", daemon=True)

    def __enter__(self) -> "Lookups":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for bucket, keys in self.keys_of.items():
                self._look(bucket, self.rng.sample(keys, min(PROBE_KEYS, len(keys))))

    def _look(self, bucket: int, keys: list[int]) -> None:
        t0 = time.time()
        try:
            rows = self.client.lookup(keys)
        except errors.KvLeaseError:
            self.failures += 1
            try:
                self.client.refresh()  # a timeout to a paused leader does not refresh the routing by itself
            except errors.KvLeaseError:
                pass
            return
        t1 = time.time()
        self.reads += [Read("lookup", k, None if r is None else r["v"], t1) for k, r in zip(keys, rows)]
        self.served.setdefault(bucket, []).append((t0, t1))


def create_replicated_table(cluster: DrillCluster) -> str:
    path = f"{DRILL_DB}.tablet_failover_{cluster.run_id}"
    columns = [Column("id", "BIGINT"), Column("v", "BIGINT"), Column("pad", "STRING")]
    cluster.admin.create_table(path, columns, ["id"], BUCKETS, replication_factor=REPLICATION,
                               min_insync_replicas=MIN_INSYNC)
    return path


def run(cluster_dir: str, rounds: int = 2, seed: int = 0, spark=None) -> Report:
    """Run the drill; ``spark``: a SparkSession for the stream (left running), else a local one is started."""
    doc = local_cluster.load(cluster_dir)
    check_shape(doc)
    report = Report(NAME)
    with _spark_session(spark) as session, DrillCluster(cluster_dir, NAME, retry_total_s=60.0) as cluster:
        table = create_replicated_table(cluster)
        try:
            _run(cluster, session, table, rounds, seed, session_timeout_s(doc) + 2.0, report)
        finally:
            cluster.drop_table(table)
    return report


@contextlib.contextmanager
def _spark_session(spark) -> Iterator[Any]:
    """``spark`` if given, else a local SparkSession (local[2]) stopped at the end."""
    if spark is not None:
        yield spark
        return
    from kvlease.ops.streaming import local_session, stop_local_session

    scratch = Path(tempfile.mkdtemp(prefix="kvlease-drill-tablet-failover-spark-"))
    session = None
    try:
        _progress(f"starting Spark (local[2]; its log: {scratch / 'spark.log'})")
        session = local_session(scratch, cores=2, app="kvlease-drill-tablet-failover", log_file=scratch / "spark.log")
        yield session
    finally:
        if session is not None:
            stop_local_session(session, log_file=scratch / "spark.log")
        shutil.rmtree(scratch, ignore_errors=True)


def _run(cluster: DrillCluster, spark, table: str, rounds: int, seed: int, bound_s: float, report: Report) -> None:
    """The traffic, the faults and the stream on ``table``; then what is read back, judged into ``report``."""
    stream = None
    try:
        with TableClient(cluster.admin, table, retry_total_s=60.0, request_timeout_s=5.0) as client:
            table_id = client.table.table_id
            in_sync_since(cluster, table_id, time.time(), IN_SYNC_BOUND_S)  # a new table's followers join
            keys = list(range(KEYS))
            bucket_of = {k: b for b, _rows, idx in client.split(client.key_batch(keys)) for k in (keys[i] for i in idx)}
            writers = AckedWriters(client, bucket_of, seed)
            writers.write({k: k for k in keys})
            client.trigger_snapshot(wait=True)  # the stream's bootstrap reads it
            stream = ChaosStream(spark, cluster.addresses, table, _progress)
            report.figures["stream_bootstrap_s"] = stream.wait_for_bootstrap(BOOTSTRAP_BOUND_S)
            outcome = _drill(cluster, client, table, writers, rounds, seed, bound_s)
            report.add(Check.of("the Spark query ran through every fault", [f for f in [stream.failed()] if f], 1))
            in_sync, outcome["leaders"], outcome["in_sync_s"] = in_sync_since(
                cluster, table_id, outcome["last_fault"], IN_SYNC_BOUND_S)
            report.add(in_sync)
            if stream.query.isActive:
                checks, figures = stream.finish(client)
                report.checks.extend(checks)
                report.figures.update(figures)
            hws = {b: latest for b, (_, latest) in client.list_offsets().items()}
            outcome["looked_up"] = {k: None if r is None else r["v"] for k, r in zip(keys, client.lookup(keys))}
            codec = client.codec
        logs = read_replica_logs(cluster.doc["tablets"], table_id)
        report.add(cluster.whole_again())
        _judge(report, outcome, logs, hws, codec)
    finally:
        if stream is not None:
            stream.close()


def _drill(cluster: DrillCluster, client: TableClient, table: str, writers: AckedWriters, rounds: int, seed: int,
           bound_s: float) -> dict[str, Any]:
    bucket_of = writers.bucket_of
    outages: list[Outage] = []
    scans: list[ScanRecord] = []
    with Lookups(cluster.admin, table, bucket_of, seed) as lookups:
        writers.start()
        try:
            for round_no in range(rounds):
                time.sleep(0.5)  # writes under way
                pause = round_no == rounds - 1 and rounds > 1
                outages.append(_fault(cluster, client, round_no, pause, bound_s, scans))
            last_fault = time.time()
            time.sleep(0.5)  # writes after the last fault
        finally:
            writers.stop()
    served = writers.successes()
    for bucket, calls in lookups.served.items():
        served[bucket] = served.get(bucket, []) + calls
    scanned = [Read(s.name, k, v) for s in scans for k, v in s.rows]
    return {"writers": writers, "outages": outages, "scans": scans, "reads": lookups.reads + scanned,
            "served": served, "lookup_failures": lookups.failures, "bucket_of": bucket_of, "bound_s": bound_s,
            "last_fault": last_fault}


def _fault(cluster: DrillCluster, client: TableClient, round_no: int, pause: bool, bound_s: float,
           scans: list[ScanRecord]) -> Outage:
    """One round: the leader of bucket ``round_no % BUCKETS`` killed (or paused past the session timeout)
    while a scan of that bucket is open; it is started again (or continued) afterwards."""
    _table, leaders = cluster.admin.get_table_assignment(client.table.table_id)
    bucket = round_no % BUCKETS
    victim = str(leaders[bucket].leader_id)
    buckets = frozenset(b for b, leader in leaders.items() if str(leader.leader_id) == victim)
    scanner = client.scanner(bucket, resume=True, batch_size_bytes=SCAN_BATCH_BYTES)
    t_open = time.time()
    first = scanner.poll()
    name = f"round {round_no + 1}: {'SIGSTOP' if pause else 'kill -9'} tablet {victim}"
    if pause:
        entry = next(t for t in cluster.doc["tablets"] if str(t["id"]) == victim)
        at = time.time()
        with paused(entry["pid"]):
            scan_after_kill(scanner, f"{name} scan", bucket, True, t_open, first, scans)
            time.sleep(max(0.0, at + bound_s - time.time()))  # past the session timeout: it is deposed
    else:
        at = cluster.kill("tablets", victim)
        scan_after_kill(scanner, f"{name} scan", bucket, True, t_open, first, scans)
        cluster.restart("tablets", victim)
    return Outage(name, at, buckets)


def _judge(report: Report, outcome: dict[str, Any], logs: ReplicaLogs, hws: dict[int, int], codec) -> None:
    """Every replica's changelog and table (its changelog applied) below the high watermarks ``hws``, and
    what the clients were told and saw, through the pure checkers."""
    writers: AckedWriters = outcome["writers"]
    changelogs = {name: {b: change_records(codec, frames, hws.get(b, 0)) for b, frames in buckets.items()}
                  for name, buckets in logs.items()}
    tables = {name: apply_changes(r for records in buckets.values() for r in records)
              for name, buckets in changelogs.items()}
    committed = {b: changelogs.get(f"tablet {leader}", {}).get(b, []) for b, leader in outcome["leaders"].items()}
    prints = {name: {b: fingerprints(frames, hws.get(b, 0)) for b, frames in buckets.items()}
              for name, buckets in logs.items()}
    report.add(acknowledged_writes_in_changelog(writers.acked, changelogs))
    report.add(tables_as_acknowledged(writers.history, {"the leaders' lookup": outcome["looked_up"], **tables}))
    report.add(reads_committed(outcome["reads"], committed))
    report.add(replicas_identical(prints, hws, describe_frame))
    check, delays = leaders_served_within(outcome["outages"], outcome["served"], outcome["bound_s"])
    report.add(check)
    report.add(scans_match(outcome["scans"], writers.history, outcome["bucket_of"]))
    report.add(scans_end_cleanly(outcome["scans"]))
    writes = [w for ws in writers.history.values() for w in ws]
    report.figures.update(
        rounds=len(outcome["outages"]), faults=[o.name for o in outcome["outages"]], served_again_s=delays,
        in_sync_again_s=outcome["in_sync_s"], acknowledged_writes=len(writers.acked), writes=len(writes),
        unacknowledged_writes=sum(not w.acked for w in writes), write_failures=dict(writers.failures),
        reads=len(outcome["reads"]), lookup_failures=outcome["lookup_failures"], high_watermarks=hws,
        replicas=sorted(logs))


def _progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
