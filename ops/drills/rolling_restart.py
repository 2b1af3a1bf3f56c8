"""Restart every tablet server in turn with SIGTERM (a controlled shutdown first moves its leaderships away)
under writes, lookups and resuming live scans of a table with replication factor 3 (min.insync-replicas 2),
waiting until every ISR is full again before the next.

Checks: no request failed beyond the client's retries (writes, lookups and
scans: a rolling restart is not noticed by clients); every acknowledged
write exactly once in every replica's changelog and its effect in every
replica's table; every value a reader saw committed; the replicas'
changelogs identical below the high watermark; scans right and read to
their end; every replica back in the ISR after each restart; every bucket
led by its preferred replica (its first) again and leaders spread over the
servers. A controlled shutdown moves a server's leaderships away, so after
the last restart that server leads nothing until the preferred-leader
election: the drill first waits for the automatic one
(``auto.leader-rebalance.enabled``: once a restarted replica is back in the
ISR), then runs ``kvlease cluster rebalance --leaders`` (which also spreads
preferred leaders left skewed, e.g. by a cluster's earlier failovers before
placement counted preferred leaders) and checks. Needs --tablets 3.

The load and the checks are the replica drills' (ops/drills/replica_drill.py).
"""

from __future__ import annotations

import signal
import time
from typing import Any

from kvlease.client.table import TableClient
from kvlease.ops import local_cluster
from kvlease.ops.drills.cluster import DrillCluster, require
from kvlease.ops.drills.replica_drill import IN_SYNC_BOUND_S, run_replica_drill, wait_in_sync
from kvlease.ops.drills.replica_traffic import Load
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.service_checks import led_by_preferred, leaders_spread

NAME = "rolling-restart"
OPTIONS = ("seed",)
REPLICATION = 3
MIN_INSYNC = 2
REBALANCE_BOUND_S = 30.0
#: how long the drill waits for the automatic preferred-leader election before its own rebalance
AUTOMATIC_BOUND_S = 10.0


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


def _rebalance(cluster: DrillCluster, table_id: int, servers: list[int], report: Report) -> dict[str, Any]:
    """Wait for the automatic preferred-leader election, then ``rebalance --leaders`` and the checks that every
    bucket is led by its preferred replica and leaders are spread again."""
    automatic_s = _wait_led_by_preferred(cluster, table_id, AUTOMATIC_BOUND_S)
    started = cluster.admin.rebalance(leaders_only=True)
    _wait_led_by_preferred(cluster, table_id, REBALANCE_BOUND_S)
    state, _s = wait_in_sync(cluster, table_id)
    report.add(led_by_preferred(state))
    report.add(leaders_spread(state, servers))
    return {"automatic_election_s": automatic_s, "rebalance_leader_changes": len(started)}


def _wait_led_by_preferred(cluster: DrillCluster, table_id: int, bound_s: float) -> float | None:
    """Seconds until every bucket of the table is led by its preferred replica (None: not within ``bound_s``)."""
    start = time.monotonic()
    while True:
        state, _s = wait_in_sync(cluster, table_id)
        if led_by_preferred(state).ok:
            return round(time.monotonic() - start, 3)
        if time.monotonic() - start > bound_s:
            return None
        time.sleep(0.2)


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
