"""kill -9 a tablet server during writes and open KV scans, restart it; --rounds times (default 2).

Checks: every acknowledged write is present (lookup and a full scan after
the last restart equal what the acknowledged writes say; an unacknowledged
write may or may not be there); a scan open on the killed server's bucket
gets a typed error, or with resume=True reads on after resume_key;
no scan returns wrong data (every row is one its key held while the scan was
open); writes to the server's buckets succeed again within 60 s of each kill.
Needs --tablets 1 or more.

Writers (threads, each owning its keys) upsert and delete through
:class:`~client.table.TableClient`; the round's server is the next tablet
server in turn; four scanners (batch and stream, with and without resume)
read one of its buckets in small batches, one batch before the kill and the
rest after it.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

from client.table import TableClient
from ops import local_cluster
from ops.drills.report import Report, finish
from ops.drills.checks import recovered
from ops.drills.cluster import DrillCluster, require
from ops.drills.leases import error_name
from ops.drills.row_checks import ScanRecord, WriteOp, rows_as_acknowledged, scans_end_cleanly, scans_match

NAME = "tablet-restart"
OPTIONS = ("rounds", "seed")
KEYS = 2000
WRITERS = 4
KEYS_PER_CALL = 16
THINK_S = 0.02
PAD = "p" * 600  # rows of ~650 bytes: a bucket is bigger than a gRPC stream's flow-control window
SCAN_BATCH_BYTES = 1024
RECOVERY_BOUND_S = 60.0
SCANNERS = (("batch", False, False), ("batch-resume", False, True), ("stream", True, False),
            ("stream-resume", True, True))


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=1)


class Writers:
    """Threads upserting and deleting their own keys; every write recorded per key."""

    think_s = THINK_S  # a writer's mean pause between calls

    def __init__(self, client: TableClient, bucket_of: dict[int, int], seed: int) -> None:
        self.client = client
        self.bucket_of = bucket_of
        self.history: dict[int, list[WriteOp]] = {key: [] for key in bucket_of}
        self.calls: list[tuple[float, float, frozenset[int], bool]] = []  # t0, t1, buckets, acknowledged
        self.failures: Counter = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i, random.Random(seed * 100 + i)),
                                          name=f"drill-writer-{i}", daemon=True) for i in range(WRITERS)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)

    def write(self, values: dict[int, int | None]) -> None:
        """One upsert call (or delete call when every value is None) and its record."""
        deletes = all(v is None for v in values.values())
        buckets = frozenset(self.bucket_of[k] for k in values)
        t0 = time.time()
        written: set[int] = set()
        try:
            if deletes:
                self.client.delete(list(values))
            else:
                self.client.upsert([{"id": k, "v": v, "pad": PAD} for k, v in values.items()])
            written = set(buckets)
        except Exception as exc:  # recorded: the checkers judge what may have happened
            written = set(getattr(exc, "details", {}).get("written", {}) or {})
            with self._lock:
                self.failures[error_name(exc)] += 1
        t1 = time.time()
        with self._lock:
            self.calls.append((t0, t1, buckets, written == set(buckets)))
        for key, value in values.items():
            self.history[key].append(WriteOp(key, value, t0, t1, self.bucket_of[key] in written))

    def _run(self, index: int, rng: random.Random) -> None:
        mine = [k for k in self.history if k % WRITERS == index]
        sequence = 0
        while not self._stop.wait(rng.uniform(0, 2 * self.think_s)):
            keys = rng.sample(mine, KEYS_PER_CALL)
            if rng.random() < 0.2:
                self.write({k: None for k in keys})
            else:
                sequence += 1
                self.write({k: (index + 1) * 10_000_000 + sequence for k in keys})

    def recovery_after(self, killed_at: float, buckets: set[int], timeout_s: float) -> float | None:
        """Seconds from the kill to the first acknowledged write to ``buckets`` sent after it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                done = [t1 for t0, t1, b, ok in self.calls if ok and t0 > killed_at and b & buckets]
            if done:
                return round(min(done) - killed_at, 3)
            time.sleep(0.05)
        return None


def scan_after_kill(scanner, name: str, bucket: int, resume: bool, t_open: float, first, out: list) -> None:
    """Read the scanner to its end (or error) and record it; ``first`` is the batch read before the kill."""
    rows = [(r["id"], r["v"]) for r in first.to_pylist()] if first is not None else []
    error = ""
    complete = first is None
    try:
        while not complete and (batch := scanner.poll()) is not None:
            rows += [(r["id"], r["v"]) for r in batch.to_pylist()]
        complete = True
    except Exception as exc:  # recorded and judged by scans_end_cleanly
        error = error_name(exc)
    finally:
        scanner.close()
    out.append(ScanRecord(name, bucket, t_open, time.time(), rows, complete, resume, scanner.resumed, error,
                          interrupted=bool(error) or scanner.resumed > 0))


def run(cluster_dir: str, rounds: int = 2, seed: int = 0) -> Report:
    doc = local_cluster.load(cluster_dir)
    check_shape(doc)
    report = Report(NAME)
    with DrillCluster(cluster_dir, NAME) as cluster:
        table = cluster.create_table()
        try:
            with TableClient(cluster.admin, table, retry_total_s=45.0, request_timeout_s=5.0) as client:
                report.checks, report.figures = _drill(cluster, client, rounds, seed)
            report.add(cluster.whole_again())
        finally:
            cluster.drop_table(table)
    return report


def _drill(cluster: DrillCluster, client: TableClient, rounds: int, seed: int) -> tuple[list, dict[str, Any]]:
    keys = list(range(KEYS))
    bucket_of = {k: b for b, _rows, idx in client.split(client.key_batch(keys)) for k in (keys[i] for i in idx)}
    writers = Writers(client, bucket_of, seed)
    writers.write({k: k for k in keys})
    tablets = [t["id"] for t in cluster.doc["tablets"]]
    scans: list[ScanRecord] = []
    recovery: list[float | None] = []
    writers.start()
    try:
        for round_no in range(rounds):
            time.sleep(0.5)  # writes under way
            victim = tablets[round_no % len(tablets)]
            _table, leaders = cluster.admin.get_table_assignment(client.table.table_id)
            buckets = {b for b, leader in leaders.items() if str(leader.leader_id) == str(victim)}
            scanned = min(buckets) if buckets else 0
            opened = []
            for name, streaming, resume in SCANNERS:
                scanner = client.scanner(scanned, streaming=streaming, resume=resume,
                                         batch_size_bytes=SCAN_BATCH_BYTES)
                t_open = time.time()
                opened.append((scanner, f"round {round_no + 1} {name} scan", scanned, resume, t_open,
                               scanner.poll()))
            killed_at = cluster.kill("tablets", victim)
            readers = [threading.Thread(target=scan_after_kill, args=(*args, scans), daemon=True) for args in opened]
            for reader in readers:
                reader.start()
            cluster.restart("tablets", victim)
            recovery.append(writers.recovery_after(killed_at, buckets, RECOVERY_BOUND_S) if buckets else 0.0)
            for reader in readers:
                reader.join(timeout=90)
        time.sleep(0.5)  # writes after the last restart
    finally:
        writers.stop()
    looked_up = dict(zip(keys, (None if row is None else row["v"] for row in client.lookup(keys))))
    scanned_rows = {row["id"]: row["v"] for row in client.scan().rows}
    checks = [recovered(recovery, RECOVERY_BOUND_S, "writes to the restarted server's buckets succeed"),
              rows_as_acknowledged(writers.history, {"lookup": looked_up, "scan": scanned_rows}),
              scans_match(scans, writers.history, bucket_of),
              scans_end_cleanly(scans)]
    writes = [w for ws in writers.history.values() for w in ws]
    figures = {"rounds": rounds, "recovery_s": recovery, "write_calls": len(writers.calls),
               "writes": len(writes), "unacknowledged_writes": sum(not w.acked for w in writes),
               "write_failures": dict(writers.failures),
               "scans": {s.name: ("complete" if s.complete else s.error)
                         + (f", resumed {s.resumed}x" if s.resumed else "") + f", {len(s.rows)} rows"
                         for s in scans},
               "scans_interrupted": sum(s.interrupted for s in scans)}
    return checks, figures


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
