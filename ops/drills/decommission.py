"""Move every replica off one of three tablet servers (``AdminClient.decommission_tablet``, what ``kvlease
cluster decommission --tablet ID`` does) under writes, lookups and resuming live scans of a table with
replication factor 2, wait until no move is in progress, then stop that server.

Checks: a retried decommission (its answer lost) starts nothing new; every
move finished (``list_reassignments`` empty) within 60 s; with the server
stopped every bucket keeps 2 replicas, all in the ISR, on the other two
servers; no request failed beyond the client's retries (reads and writes
served throughout); every acknowledged write exactly once in every
replica's changelog (a moved replica's from where its rebuild starts) and
its effect in every replica's table; every value a reader saw committed;
the replicas' changelogs identical below the high watermark; scans right
and read to their end. The server is started again at the end (it holds no
replica of the table then): it is still decommissioned (it takes no new
replicas) until the drill recommissions it, leaving the cluster as it found
it. Needs --tablets 3.

The server decommissioned is the one leading the most of the table's
buckets. The load and the checks are the replica drills'
(ops/drills/replica_drill.py).
"""

from __future__ import annotations

import signal
import time
from typing import Any

from client.table import TableClient
from ops import local_cluster
from ops.drills.cluster import ClusterShapeError, DrillCluster, require
from ops.drills.decommission_checks import mark_kept, moves_finished, retry_started_nothing_new
from ops.drills.replica_drill import run_replica_drill, wait_in_sync
from ops.drills.replica_traffic import Load
from ops.drills.report import Check, Report, finish
from ops.drills.service_checks import isr_full

NAME = "decommission"
OPTIONS = ("seed",)
SERVERS = 3
REPLICATION = 2
MIN_INSYNC = 1
MOVES_BOUND_S = 60.0
STOPPED_S = 1.0  # the load runs this long with the server stopped


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=SERVERS)


def run(cluster_dir: str, seed: int = 0) -> Report:
    check_shape(local_cluster.load(cluster_dir))
    return run_replica_drill(cluster_dir, NAME, REPLICATION, MIN_INSYNC, seed, _decommission)


def _decommission(cluster: DrillCluster, client: TableClient, load: Load, report: Report) -> dict[str, Any]:
    table_id = client.table.table_id
    _table, state = cluster.admin.get_table_assignment(table_id)
    led = {int(t["id"]): 0 for t in cluster.doc["tablets"]}
    for bucket in state.values():
        led[bucket.leader_id] = led.get(bucket.leader_id, 0) + 1
    victim = max(led, key=lambda s: (led[s], -s))
    started_at = time.monotonic()
    moves = list(cluster.admin.decommission_tablet(victim))
    retried = list(cluster.admin.decommission_tablet(victim))  # as a client whose answer was lost would
    report.add(retry_started_nothing_new(moves, retried))
    in_progress = list(cluster.admin.list_reassignments())
    while in_progress and time.monotonic() - started_at < MOVES_BOUND_S:
        time.sleep(0.2)
        in_progress = list(cluster.admin.list_reassignments())
    moved_s = round(time.monotonic() - started_at, 3)
    report.add(moves_finished(moves, in_progress, moved_s))
    cluster.kill("tablets", str(victim), signal.SIGTERM)
    time.sleep(STOPPED_S)  # reads and writes go on without it
    state, _s = wait_in_sync(cluster, table_id, away=frozenset({victim}))
    check = isr_full(state, REPLICATION, away={victim})
    report.add(Check.of(f"{check.name}, none on the stopped tablet server {victim}", check.violations,
                        check.checked))
    cluster.restart("tablets", str(victim))
    marked = cluster.admin.cluster_health().decommissioned
    recommissioned = cluster.admin.recommission_tablet(victim)
    report.add(mark_kept(victim, marked, recommissioned, cluster.admin.cluster_health().decommissioned))
    return {"decommissioned": f"tablet {victim}", "leaderships_before": led[victim], "moves_started": len(moves),
            "moves_s": moved_s, "away": {victim}}


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
