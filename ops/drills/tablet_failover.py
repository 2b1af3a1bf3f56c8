"""kill -9 the leader of some buckets of an RF-3 table during writes, lookups and a live scan, --rounds
times (default 2), the last round a SIGSTOP past the ZooKeeper session timeout, then SIGCONT.

Checks (ops/drills/failover_checks.py): every acknowledged write is in every
replica's changelog exactly once, at the offsets the server answered, and
its effect in every replica's table; no value a reader (lookup, scan) saw is
missing from the committed changelog afterwards; the replicas' changelogs are
identical below the high watermark; every bucket a killed or paused leader led
is served again within ``zookeeper.session-timeout`` + 2 s; scans return only
right data. Needs --tablets 3 (a table with replication factor 3 and
min.insync-replicas 2).

Writers (threads, each owning its keys) upsert and delete through
:class:`~client.table.TableClient` with idempotent retries; a reader looks
keys up all along; each round a scanner (resume=True) reads one of the
victim's buckets, one batch before the fault and the rest after it. At the
end each replica's changelog is read from its data
dir (``<tablet home>/data/<table id>/<bucket>/log``, read-only); a replica's
table is its changelog applied. The Spark stream
of the issue's drill is not run here yet.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

from client.log_records import decode_records, entry_records
from client.table import TableClient
from common import errors
from common.logentry import CorruptLogError, decode_entry, read_header
from common.tables import Column
from ops import local_cluster
from ops.drills.leases import error_name
from ops.drills.chaos_faults import session_timeout_s
from ops.drills.cluster import DRILL_DB, DrillCluster, require
from ops.drills.failover_checks import (AckedWrite, ChangeRecord, Outage, Read, acknowledged_writes_in_changelog,
                                        apply_changes, leaders_served_within, reads_committed, replicas_identical,
                                        tables_as_acknowledged)
from ops.drills.report import Report, finish
from ops.drills.row_checks import ScanRecord, WriteOp, scans_match
from ops.drills.tablet_restart import PAD, Writers, scan_after_kill

NAME = "tablet-failover"
OPTIONS = ("rounds", "seed")
KEYS = 400
BUCKETS = 4
REPLICATION = 3
MIN_INSYNC = 2
SCAN_BATCH_BYTES = 1024
_SHORT = {0: "+I", 1: "-U", 2: "+U", 3: "-D"}  # common.logentry.ChangeType


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=REPLICATION)


class AckedWriters(Writers):
    """The tablet-restart drill's writers, also keeping the offsets each acknowledged write was answered."""

    def __init__(self, client: TableClient, bucket_of: dict[int, int], seed: int) -> None:
        super().__init__(client, bucket_of, seed)
        self.acked: list[AckedWrite] = []

    def write(self, values: dict[int, int | None]) -> None:
        t0 = time.time()
        deletes = all(v is None for v in values.values())
        try:
            offsets = (self.client.delete(list(values)) if deletes else
                       self.client.upsert([{"id": k, "v": v, "pad": PAD} for k, v in values.items()]))
            error = None
        except Exception as exc:  # recorded: the checkers judge what may have happened
            offsets, error = dict(getattr(exc, "details", {}).get("written", {}) or {}), exc
        self._record(values, t0, offsets, error)

    def _record(self, values: dict[int, int | None], t0: float, offsets: dict, error: Exception | None) -> None:
        t1 = time.time()
        buckets = frozenset(self.bucket_of[k] for k in values)
        with self._lock:
            if error is not None:
                self.failures[error_name(error)] += 1
            self.calls.append((t0, t1, buckets, set(offsets) == set(buckets)))
            for bucket, (base, end) in offsets.items():
                rows = {k: v for k, v in values.items() if self.bucket_of[k] == bucket}
                self.acked.append(AckedWrite(bucket, base, end, rows))
        for key, value in values.items():
            self.history[key].append(WriteOp(key, value, t0, t1, self.bucket_of[key] in offsets))

    def successes(self) -> dict[int, list[float]]:
        """bucket -> end times of the calls that wrote to it."""
        out: dict[int, list[float]] = {}
        with self._lock:
            for _t0, t1, buckets, ok in self.calls:
                for bucket in buckets if ok else ():
                    out.setdefault(bucket, []).append(t1)
        return out


class Lookups:
    """A thread looking random keys up all along; every value seen kept as a :class:`Read`."""

    def __init__(self, client: TableClient, keys: list[int], seed: int) -> None:
        self.client, self.keys, self.rng = client, keys, random.Random(seed)
        self.reads: list[Read] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drill-lookups", daemon=True)

    def __enter__(self) -> "Lookups":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            keys = self.rng.sample(self.keys, 8)
            try:
                rows = self.client.lookup(keys)
            except errors.KvLeaseError:
                continue  # a failover under way: the next lookup waits for it within the retries
            self.reads += [Read("lookup", k, None if r is None else r["v"], time.time()) for k, r in zip(keys, rows)]


def create_replicated_table(cluster: DrillCluster) -> str:
    path = f"{DRILL_DB}.tablet_failover_{cluster.run_id}"
    columns = [Column("id", "BIGINT"), Column("v", "BIGINT"), Column("pad", "STRING")]
    try:
        cluster.admin.create_table(path, columns, ["id"], BUCKETS, replication_factor=REPLICATION,
                                   min_insync_replicas=MIN_INSYNC)
    except TypeError:
        raise errors.InvalidRequestError("this admin client cannot create replicated tables yet "
                                         "(AdminClient.create_table(replication_factor=…))") from None
    return path


def run(cluster_dir: str, rounds: int = 2, seed: int = 0) -> Report:
    doc = local_cluster.load(cluster_dir)
    check_shape(doc)
    report = Report(NAME)
    bound_s = session_timeout_s(doc) + 2.0
    with DrillCluster(cluster_dir, NAME, retry_total_s=60.0) as cluster:
        table = create_replicated_table(cluster)
        try:
            with TableClient(cluster.admin, table, retry_total_s=60.0, request_timeout_s=5.0) as client:
                outcome = _drill(cluster, client, rounds, seed, bound_s)
                hws = {b: latest for b, (_, latest) in client.list_offsets().items()}
                outcome["looked_up"] = {k: None if r is None else r["v"]
                                        for k, r in zip(outcome["bucket_of"], client.lookup(list(outcome["bucket_of"])))}
                table_id, codec = client.table.table_id, client.codec
            logs = _replica_logs(cluster, table_id)
            report.add(cluster.whole_again())
            _judge(report, outcome, logs, hws, codec)
        finally:
            cluster.drop_table(table)
    return report


def _drill(cluster: DrillCluster, client: TableClient, rounds: int, seed: int, bound_s: float) -> dict[str, Any]:
    keys = list(range(KEYS))
    bucket_of = {k: b for b, _rows, idx in client.split(client.key_batch(keys)) for k in (keys[i] for i in idx)}
    writers = AckedWriters(client, bucket_of, seed)
    writers.write({k: k for k in keys})
    outages: list[Outage] = []
    scans: list[ScanRecord] = []
    with Lookups(client, keys, seed) as lookups:
        writers.start()
        try:
            for round_no in range(rounds):
                time.sleep(0.5)  # writes under way
                pause = round_no == rounds - 1 and rounds > 1
                outages.append(_fault(cluster, client, round_no, pause, bound_s, scans))
            time.sleep(0.5)  # writes after the last fault
        finally:
            writers.stop()
    scanned = [Read(s.name, k, v) for s in scans for k, v in s.rows]
    return {"writers": writers, "outages": outages, "scans": scans, "reads": lookups.reads + scanned,
            "bucket_of": bucket_of, "bound_s": bound_s}


def _fault(cluster: DrillCluster, client: TableClient, round_no: int, pause: bool, bound_s: float,
           scans: list[ScanRecord]) -> Outage:
    """One round: the leader of bucket ``round_no % BUCKETS`` killed (or paused past the session timeout)
    while a scan of that bucket is open; it is started again (or continued) afterwards."""
    _table, leaders = cluster.admin.get_table_assignment(client.table.table_id)
    victim = str(leaders[round_no % BUCKETS].leader_id)
    buckets = frozenset(b for b, leader in leaders.items() if str(leader.leader_id) == victim)
    bucket = round_no % BUCKETS
    scanner = client.scanner(bucket, resume=True, batch_size_bytes=SCAN_BATCH_BYTES)
    t_open = time.time()
    first = scanner.poll()
    name = f"round {round_no + 1}: {'SIGSTOP' if pause else 'kill -9'} tablet {victim}"
    if pause:
        entry = next(t for t in cluster.doc["tablets"] if str(t["id"]) == victim)
        at = time.time()
        os.kill(entry["pid"], signal.SIGSTOP)
        try:
            scan_after_kill(scanner, f"{name} scan", bucket, True, t_open, first, scans)
            time.sleep(max(0.0, at + bound_s - time.time()))
        finally:
            os.kill(entry["pid"], signal.SIGCONT)
    else:
        at = cluster.kill("tablets", victim)
        scan_after_kill(scanner, f"{name} scan", bucket, True, t_open, first, scans)
        cluster.restart("tablets", victim)
    return Outage(name, at, buckets)


def _replica_logs(cluster: DrillCluster, table_id: int) -> dict[str, dict[int, list]]:
    """``tablet id -> bucket -> [LogEntry]`` read from every replica's data dir
    (``<tablet home>/data/<table id>/<bucket>/log/{base offset:020d}.log``: framed entries back to back),
    read-only while the servers run; a frame still being written at a segment's end is left out."""
    logs: dict[str, dict[int, list]] = {}
    for tablet in cluster.doc["tablets"]:
        data = Path(tablet["log"]).parent / "data" / str(table_id)
        for bucket_dir in sorted(data.iterdir()) if data.is_dir() else ():
            entries = []
            for segment in sorted((bucket_dir / "log").glob("*.log")):
                entries += _frames(segment.read_bytes())
            logs.setdefault(f"tablet {tablet['id']}", {})[int(bucket_dir.name)] = entries
    return logs


def _frames(buf: bytes) -> list:
    entries, pos = [], 0
    while pos < len(buf):
        try:
            header = read_header(buf, pos, len(buf))
        except CorruptLogError:
            break  # a torn or unwritten tail
        end = pos + header.size + header.payload_len
        if end > len(buf):
            break
        entries.append(decode_entry(buf[pos:end]))
        pos = end
    return entries


def _records(codec, entries: list) -> list[ChangeRecord]:
    """The entries' records with ``id`` as key and ``v`` as value (None where a record has no value)."""
    out = []
    for entry in entries:
        batch = decode_records(codec, entry_records(entry)).to_pylist()
        out += [ChangeRecord(r["offset"], _SHORT[r["change_type"]], r["id"], r.get("v")) for r in batch]
    return out


def _judge(report: Report, outcome: dict[str, Any], logs: dict[str, dict[int, list]], hws: dict[int, int],
           codec) -> None:
    writers: AckedWriters = outcome["writers"]
    changelogs = {name: {b: _records(codec, entries) for b, entries in buckets.items()}
                  for name, buckets in logs.items()}
    fingerprints = {name: {b: [(e.base_offset, (e.next_offset, e.timestamp_ms, e.leader_epoch, e.writer_id,
                                                  e.sequence, str(e.records.to_pydict()))) for e in entries] for b, entries in buckets.items()} for name, buckets in logs.items()}
    tables = {name: apply_changes(r for records in buckets.values() for r in records)
              for name, buckets in changelogs.items()}  # each replica's table: its changelog applied
    report.add(acknowledged_writes_in_changelog(writers.acked, changelogs))
    report.add(tables_as_acknowledged(writers.history, {"leaders' lookup": outcome["looked_up"], **tables}))
    report.add(reads_committed(outcome["reads"], next(iter(changelogs.values()), {})))
    report.add(replicas_identical(fingerprints, hws))
    check, delays = leaders_served_within(outcome["outages"], writers.successes(), outcome["bound_s"])
    report.add(check)
    report.add(scans_match(outcome["scans"], writers.history, outcome["bucket_of"]))
    report.figures.update(rounds=len(outcome["outages"]), served_again_s=delays, acknowledged_writes=len(writers.acked),
                          write_failures=dict(writers.failures), reads=len(outcome["reads"]))


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
