"""kill -9 a tablet server during writes and open KV scans, restart it; --rounds times (default 2).

Checks: every acknowledged write is present (lookup and a full scan after
the last restart equal what the acknowledged writes say; an unacknowledged
write may or may not be there); a scan open on the killed server's bucket
gets a typed error, or with resume=True reads on after resume_key;
no scan returns wrong data (every row is one its key held while the scan was
open); writes to the server's buckets succeed again within 60 s of each kill.
Needs --tablets 1 or more.

Writers (threads, each owning its keys) upsert and delete through
:class:`~kvlease.client.table.TableClient`; the round's server is the next tablet
server in turn; four scanners (batch and stream, with and without resume)
read one of its buckets in small batches, one batch before the kill and the
rest after it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kvlease.client.table import TableClient
from kvlease.ops import local_cluster
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.checks import recovered
from kvlease.ops.drills.cluster import DrillCluster, require
from kvlease.ops.drills.row_checks import ScanRecord, rows_as_acknowledged, scans_end_cleanly, scans_match
from kvlease.ops.drills.workload import Writers, scan_after_kill

NAME = "tablet-restart"
OPTIONS = ("rounds", "seed")
KEYS = 2000
SCAN_BATCH_BYTES = 1024
RECOVERY_BOUND_S = 60.0
SCANNERS = (("batch", False, False), ("batch-resume", False, True), ("stream", True, False),
            ("stream-resume", True, True))


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=1)


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
