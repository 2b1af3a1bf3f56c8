"""Move every replica off one of three tablet servers (``AdminClient.decommission_tablet``, what ``kvlease
cluster decommission --tablet ID`` does) under writes, lookups and resuming live scans of a table with
replication factor 2, and a one-replica table's buckets with it, wait until no move is in progress, then
stop that server.

Checks: a retried decommission (its answer lost) starts nothing new; every
move finished (``list_reassignments`` empty) within 60 s; with the server
stopped every bucket keeps 2 replicas, all in the ISR, on the other two
servers; no request failed beyond the client's retries (reads and writes
served throughout); every acknowledged write exactly once in every
replica's changelog (a moved replica's from where its rebuild starts: the
snapshot taken before the load, leased until the drill ends) and
its effect in every replica's table; every value a reader saw committed;
the replicas' changelogs identical below the high watermark; scans right
and read to their end. The one-replica table (3 buckets, rows written before
the decommission; one of its buckets is first moved to the server if none is
there): with the server stopped each bucket has one replica, elsewhere, and
every row reads back as written and takes writes. The server is started again
at the end (it holds no replica of either table then): it is still
decommissioned (it takes no new replicas) until the drill recommissions it,
leaving the cluster as it found it. Needs --tablets 3.

The server decommissioned is the one leading the most of the table's
buckets. The load and the checks are the replica drills'
(ops/drills/replica_drill.py).
"""

from __future__ import annotations

import signal
import time
from typing import Any

from kvlease.client.table import TableClient
from kvlease.common.tables import Column
from kvlease.ops import local_cluster
from kvlease.ops.drills.cluster import ClusterShapeError, DrillCluster, require
from kvlease.ops.drills.decommission_checks import (mark_kept, moves_finished, one_replica_moved,
                                                    retry_started_nothing_new)
from kvlease.ops.drills.replica_drill import run_replica_drill, wait_in_sync
from kvlease.ops.drills.replica_traffic import Load
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.service_checks import isr_full
from kvlease.ops.wait import poll

NAME = "decommission"
OPTIONS = ("seed",)
SERVERS = 3
REPLICATION = 2
MIN_INSYNC = 1
MOVES_BOUND_S = 60.0
STOPPED_S = 1.0  # the load runs this long with the server stopped
ONE_REPLICA_BUCKETS = 3
ONE_REPLICA_ROWS = 30


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=SERVERS)


def run(cluster_dir: str, seed: int = 0) -> Report:
    check_shape(local_cluster.load(cluster_dir))
    # snapshot_first: a moved replica is rebuilt from the oldest kept snapshot, which the drill then leases, so
    # that retention cannot delete what the judge reads the moved replica's rows from (ops/drills/replica_drill.py)
    return run_replica_drill(cluster_dir, NAME, REPLICATION, MIN_INSYNC, seed, _decommission, snapshot_first=True)


def _decommission(cluster: DrillCluster, client: TableClient, load: Load, report: Report) -> dict[str, Any]:
    table_id = client.table.table_id
    _table, state = cluster.admin.get_table_assignment(table_id)
    led = {int(t["id"]): 0 for t in cluster.doc["tablets"]}
    for bucket in state.values():
        led[bucket.leader_id] = led.get(bucket.leader_id, 0) + 1
    victim = max(led, key=lambda s: (led[s], -s))
    one_path = f"{client.table.path}_rf1"
    try:
        return _with_one_replica_table(cluster, table_id, victim, led[victim], one_path, report)
    finally:
        cluster.drop_table(one_path)


def _with_one_replica_table(cluster: DrillCluster, table_id: int, victim: int, leaderships: int, one_path: str,
                            report: Report) -> dict[str, Any]:
    one_held = _one_replica_table(cluster, one_path, victim)
    started_at = time.monotonic()
    moves = list(cluster.admin.decommission_tablet(victim))
    retried = list(cluster.admin.decommission_tablet(victim))  # as a client whose answer was lost would
    report.add(retry_started_nothing_new(moves, retried))
    poll(lambda: not cluster.admin.list_reassignments(), MOVES_BOUND_S - (time.monotonic() - started_at),
         interval_s=0.2)
    moved_s = round(time.monotonic() - started_at, 3)
    in_progress = list(cluster.admin.list_reassignments())
    report.add(moves_finished(moves, in_progress, moved_s))
    cluster.kill("tablets", str(victim), signal.SIGTERM)
    time.sleep(STOPPED_S)  # reads and writes go on without it
    state, _s = wait_in_sync(cluster, table_id, away=frozenset({victim}))
    check = isr_full(state, REPLICATION, away={victim})
    report.add(Check.of(f"{check.name}, none on the stopped tablet server {victim}", check.violations,
                        check.checked))
    report.add(_one_replica_check(cluster, one_path, victim, one_held))
    cluster.restart("tablets", str(victim))
    marked = cluster.admin.cluster_health().decommissioned
    recommissioned = cluster.admin.recommission_tablet(victim)
    report.add(mark_kept(victim, marked, recommissioned, cluster.admin.cluster_health().decommissioned))
    return {"decommissioned": f"tablet {victim}", "leaderships_before": leaderships, "moves_started": len(moves),
            "moves_s": moved_s, "one_replica_buckets_moved": len(one_held), "away": {victim}}


def _one_replica_table(cluster: DrillCluster, path: str, victim: int) -> list[int]:
    """Create the one-replica table and write its rows; the buckets of it on ``victim`` (one is moved there
    first if none is)."""
    columns = [Column("id", "BIGINT"), Column("v", "BIGINT"), Column("pad", "STRING")]
    table = cluster.admin.create_table(path, columns, ["id"], ONE_REPLICA_BUCKETS, replication_factor=1)
    with TableClient(cluster.admin, path, request_timeout_s=5.0) as client:
        client.upsert([{"id": i, "v": i, "pad": "one"} for i in range(ONE_REPLICA_ROWS)])
    held = [b for b, a in cluster.admin.get_table_assignment(table.table_id)[1].items() if victim in a.replicas]
    if held:
        return sorted(held)
    cluster.admin.reassign_bucket(path, 0, [victim])
    poll(lambda: not cluster.admin.list_reassignments(), MOVES_BOUND_S, interval_s=0.2)
    return [0]


def _one_replica_check(cluster: DrillCluster, path: str, victim: int, held: list[int]) -> Check:
    """With ``victim`` stopped: the one-replica table's buckets and rows (read, then written once more)."""
    rows = {i: i for i in range(ONE_REPLICA_ROWS)}
    with TableClient(cluster.admin, path, request_timeout_s=5.0) as client:
        _table, state = cluster.admin.get_table_assignment(client.table.table_id)
        found = {i: None if r is None else r["v"] for i, r in zip(rows, client.lookup([{"id": i} for i in rows]))}
        client.upsert([{"id": i, "v": i, "pad": "after"} for i in range(ONE_REPLICA_ROWS, ONE_REPLICA_ROWS + 10)])
        more = range(ONE_REPLICA_ROWS, ONE_REPLICA_ROWS + 10)
        found.update((i, None if r is None else r["v"]) for i, r in zip(more, client.lookup([{"id": i} for i in more])))
        rows.update((i, i) for i in more)
    return one_replica_moved(state, victim, held, rows, found)


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
