"""Restart every tablet server in turn with SIGTERM (a controlled shutdown first moves its leaderships away)
under writes, lookups and resuming live scans of a table with replication factor 3 (min.insync-replicas 2),
waiting until every ISR is full again before the next.

Checks: no request failed beyond the client's retries (writes, lookups and
scans: a rolling restart is not noticed by clients); every acknowledged
write exactly once in every replica's changelog and its effect in every
replica's table; every value a reader saw committed; the replicas'
changelogs identical below the high watermark; scans right and read to
their end; every replica back in the ISR after each restart; leaders spread
over the servers again after ``kvlease cluster rebalance`` (a rolling restart
alone leaves the last server restarted leading nothing). Needs --tablets 3.

The load and the checks are the replica drills' (ops/drills/replica_drill.py).
"""

from __future__ import annotations

import signal
import time
from typing import Any

from client.table import TableClient
from ops import local_cluster
from ops.drills.cluster import DrillCluster, require
from ops.drills.replica_drill import IN_SYNC_BOUND_S, run_replica_drill, wait_in_sync
from ops.drills.replica_traffic import Load
from ops.drills.report import Check, Report, finish
from ops.drills.service_checks import leaders_spread

NAME = "rolling-restart"
OPTIONS = ("seed",)
REPLICATION = 3
MIN_INSYNC = 2
REBALANCE_BOUND_S = 30.0


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=REPLICATION)


def run(cluster_dir: str, seed: int = 0) -> Report:
    check_shape(local_cluster.load(cluster_dir))
    return run_replica_drill(cluster_dir, NAME, REPLICATION, MIN_INSYNC, seed, _restart_each)


def _restart_each(cluster: DrillCluster, client: TableClient, load: Load, report: Report) -> dict[str, Any]:
    table_id = client.table.table_id
    servers = [int(t["id"]) for t in cluster.doc["tablets"]]
    in_sync_s: dict[str, float | None] = {}
    stop_s: dict[str, float] = {}
    for server in servers:
        time.sleep(0.3)  # the load between restarts
        started = time.monotonic()
        cluster.kill("tablets", str(server), signal.SIGTERM)
        stop_s[f"tablet {server}"] = round(time.monotonic() - started, 3)
        cluster.restart("tablets", str(server))
        _state, in_sync_s[f"tablet {server}"] = wait_in_sync(cluster, table_id)
    report.add(Check.of(f"every replica back in the ISR within {IN_SYNC_BOUND_S:g}s of each restart",
                        [f"after restarting {name}: not every replica in sync" for name, s in in_sync_s.items()
                         if s is None], len(in_sync_s)))
    outcome: dict[str, Any] = {"restarted": list(in_sync_s), "stop_s": stop_s, "in_sync_again_s": in_sync_s}
    outcome["rebalance"] = _rebalance(cluster, table_id, servers, report)
    return outcome


def _rebalance(cluster: DrillCluster, table_id: int, servers: list[int], report: Report) -> str:
    """``rebalance`` and the check that leaders are spread again."""
    started = cluster.admin.rebalance()
    deadline = time.monotonic() + REBALANCE_BOUND_S
    while True:
        done = not cluster.admin.list_reassignments()
        state, _s = wait_in_sync(cluster, table_id)
        check = leaders_spread(state, servers)
        if (done and check.ok) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    report.add(check)
    return f"{len(started)} moves or leader changes started"


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
