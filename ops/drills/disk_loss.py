"""A tablet server loses its disk, twice, under writes, lookups and resuming live scans of a table with
replication factor 3 (min.insync-replicas 2): first a follower (SIGTERM, its data of the table deleted,
started again), then a leader (kill -9, its buckets fail over, its data deleted, started again); each
rebuilds its replicas and rejoins the ISR.

Checks: every wiped replica back in the ISR within 30 s of its restart (the
seconds reported); every wiped replica holds the committed rows (its table,
the snapshot it was rebuilt from if any plus its changelog, equal to the
table of the replica that kept its data); no request failed beyond the
client's retries; every acknowledged write exactly once in every replica's
changelog (from where a rebuilt one starts) and its effect in every
replica's table; every value a reader saw committed; the replicas'
changelogs identical below the high watermark; scans right and read to
their end. Needs --tablets 3.

Only the drill table's data dir of the server is deleted (``<tablet
home>/data/<table id>``): other tables on the cluster keep their data. A
snapshot of every bucket is taken before the load, so a rebuild may start
from it; the oldest kept snapshot of every bucket is leased until the drill
ends (a rebuild starts from it and the judge reads the rebuilt rows from it:
retention must not delete it meanwhile). The load and the checks are the replica drills'
(ops/drills/replica_drill.py).
"""

from __future__ import annotations

import logging
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from kvlease.client.table import TableClient
from kvlease.ops import local_cluster
from kvlease.ops.drills.cluster import DrillCluster, require
from kvlease.ops.drills.disk_loss_checks import rebuilt_tables_equal, rejoined_within
from kvlease.ops.drills.replica_drill import IN_SYNC_BOUND_S, run_replica_drill, wait_in_sync
from kvlease.ops.drills.replica_traffic import Load
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.wait import poll

log = logging.getLogger(__name__)
NAME = "disk-loss"
OPTIONS = ("seed",)
REPLICATION = 3
MIN_INSYNC = 2
FAILOVER_BOUND_S = 30.0


def check_shape(doc: dict) -> None:
    require(doc, NAME, tablets=REPLICATION)


def run(cluster_dir: str, seed: int = 0) -> Report:
    check_shape(local_cluster.load(cluster_dir))
    return run_replica_drill(cluster_dir, NAME, REPLICATION, MIN_INSYNC, seed, _lose_disks, snapshot_first=True)


def _lose_disks(cluster: DrillCluster, client: TableClient, load: Load, report: Report) -> dict[str, Any]:
    table_id = client.table.table_id
    _table, state = cluster.admin.get_table_assignment(table_id)
    led = {int(t["id"]): 0 for t in cluster.doc["tablets"]}
    for bucket in state.values():
        led[bucket.leader_id] = led.get(bucket.leader_id, 0) + 1
    follower = min(led, key=lambda s: (led[s], -s))  # leads the fewest buckets (none if one leads none)
    rejoins = [(f"tablet {follower} (a follower)", _wipe(cluster, table_id, follower, signal.SIGTERM))]
    time.sleep(0.3)  # the load between the two losses
    _table, state = cluster.admin.get_table_assignment(table_id)
    leader = state[min(state)].leader_id  # bucket 0's leader
    failover_s = _wipe_leader(cluster, table_id, leader, rejoins)
    report.add(Check.of(f"the killed leader's buckets fail over within {FAILOVER_BOUND_S:g}s",
                        [] if failover_s is not None else [f"tablet {leader}'s buckets got no other live leader"], 1))
    report.add(rejoined_within(rejoins, IN_SYNC_BOUND_S))
    wiped = {f"tablet {follower}", f"tablet {leader}"}

    def judge(tables: dict[str, dict[int, int]]) -> list[Check]:
        kept = sorted(name for name in tables if name not in wiped)
        if not kept:
            return [Check.of("every wiped replica holds the committed rows", ["no replica kept its data"])]
        return [rebuilt_tables_equal({n: tables.get(n) for n in sorted(wiped)}, kept[0], tables[kept[0]])]

    return {"wiped": [name for name, _s in rejoins], "rejoin_s": {name: s for name, s in rejoins},
            "failover_s": failover_s, "judge": judge}


def _wipe(cluster: DrillCluster, table_id: int, server: int, sig: int) -> float | None:
    """Stop ``server`` with ``sig``, delete its data of the table, start it; seconds until every ISR is full."""
    cluster.kill("tablets", str(server), sig)
    _delete_table_data(cluster, table_id, server)
    return _restart_and_wait(cluster, table_id, server)


def _wipe_leader(cluster: DrillCluster, table_id: int, server: int, rejoins: list) -> float | None:
    """kill -9 the leader ``server``, wait until its buckets have other live leaders, then wipe and restart it;
    the seconds the failover took (None: it did not happen)."""
    killed_at = time.monotonic()
    cluster.kill("tablets", str(server))

    def failed_over() -> bool:
        _table, state = cluster.admin.get_table_assignment(table_id)
        return all(b.leader_id != server and b.leader_address for b in state.values())
    moved = poll(failed_over, FAILOVER_BOUND_S - (time.monotonic() - killed_at), interval_s=0.1)[1]
    failover_s = round(time.monotonic() - killed_at, 3) if moved else None
    _delete_table_data(cluster, table_id, server)
    rejoins.append((f"tablet {server} (a leader)", _restart_and_wait(cluster, table_id, server)))
    return failover_s


def _delete_table_data(cluster: DrillCluster, table_id: int, server: int) -> None:
    """Delete the server's data of the table. A server with none on disk (it never opened a replica of it, e.g.
    one started again just before) has lost nothing more: the drill goes on, and logs that it found none."""
    entry = local_cluster.member(cluster.doc, "tablets", server)
    data = Path(entry["log"]).parent / "data" / str(table_id)
    if data.is_dir():
        shutil.rmtree(data)
    else:
        log.warning("tablet %s has no data of table %s to delete (%s)", server, table_id, data)


def _restart_and_wait(cluster: DrillCluster, table_id: int, server: int) -> float | None:
    started = time.monotonic()
    cluster.restart("tablets", str(server))
    _state, took = wait_in_sync(cluster, table_id)
    return None if took is None else round(time.monotonic() - started, 3)


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
