"""kill -9 the ZooKeeper leader under lease traffic, --rounds times (default 3); restart it each time;
then once more with the traffic paused, move every lease, and kill -9 the active coordinator.

Checks: every acknowledged lease reads back as acknowledged (describe and
list on the active coordinator, ZooKeeper + files), also the lease changes
acknowledged after the last reconnection, read back from the coordinator that
took over then (a standby whose ZooKeeper watches went with the connection
must still hand over the exact leases); no file of a leased snapshot is
deleted; no write is accepted from a deposed coordinator (ZooKeeper's
transaction log); an acquire sent after each kill succeeds within 30 s (the
time to recover is reported). Needs --zk-nodes 3, --coordinators 2 and
--tablets 1 or more.

When the leader dies, the followers drop every client connection while they
elect a new leader, so every process of the cluster (the standby coordinator
too) reconnects; an active coordinator whose write was cut off steps down.
The last fault is made with the traffic paused, so the active coordinator
rides it out and the standby stays the standby: then every lease still held
is moved to the newest snapshots of its buckets with a 3 h deadline and
renewed, the active coordinator is killed (restarted at once, as a standby),
and once the standby serves, every bucket gets new snapshots on it (which
subsumes every snapshot no lease it knows holds) before the leases are read
back.
"""

from __future__ import annotations

import time

from kvlease.client.admin import wait_for_active
from kvlease.common import errors
from kvlease.ops import local_cluster
from kvlease.ops.check import Check
from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.checks import OK, recovered
from kvlease.ops.drills.cluster import DrillCluster, require
from kvlease.ops.drills.leases import LeaseDrill
from kvlease.ops.wait import poll

NAME = "zk-leader-loss"
OPTIONS = ("rounds", "clients", "seed")
RECOVERY_BOUND_S = 30.0
ACKS_BEFORE_KILL = 200
MOVED_DURATION_MS = 3 * 3_600_000
SNAPSHOTS_AFTER_FAILOVER = 3  # per bucket: more than kv.snapshot.num-retained (2), so old ones are subsumed


def check_shape(doc: dict) -> None:
    require(doc, NAME, zk_nodes=3, coordinators=2, tablets=1)


def run(cluster_dir: str, rounds: int = 3, clients: int = 16, seed: int = 0) -> Report:
    check_shape(local_cluster.load(cluster_dir))
    report = Report(NAME)
    with DrillCluster(cluster_dir, NAME) as cluster, LeaseDrill(cluster, clients, seed) as drill:
        drill.start()
        recovery: list[float | None] = []
        killed_nodes = []
        for _ in range(rounds):
            drill.before_fault(ACKS_BEFORE_KILL)
            leader = cluster.zk_leader()
            killed_at = cluster.kill("zookeeper", leader["id"])
            killed_nodes.append(leader["id"])
            first = drill.clients.wait_for(lambda op: op.kind == "acquire" and op.outcome == OK
                                           and op.t0 > killed_at, RECOVERY_BOUND_S)
            recovery.append(None if first is None else round(first.t1 - killed_at, 3))
            cluster.restart("zookeeper", leader["id"])
            drill.clients.settled(killed_at, RECOVERY_BOUND_S)
        report.add(recovered(recovery, RECOVERY_BOUND_S, "an acquire sent after the kill succeeds"))
        drill.before_fault(ACKS_BEFORE_KILL)
        figures = _quiet_fault_then_failover(cluster, drill, report)
        killed_nodes.append(figures.pop("killed_zookeeper_node"))
        for check in drill.checks():
            report.add(check)
        report.figures.update(rounds=rounds, clients=clients, killed_zookeeper_nodes=killed_nodes,
                              recovery_s=recovery, **figures, **drill.figures())
        report.add(cluster.whole_again())
    return report


def _quiet_fault_then_failover(cluster: DrillCluster, drill: LeaseDrill, report: Report) -> dict:
    """The issue's sequence: the ZooKeeper leader lost while nothing is written, every lease moved on the
    reconnected cluster, then the active coordinator killed and the standby's leases read back."""
    drill.clients.stop()  # for good: from here on no random call overwrites what the standby is handed
    drill.snapshotter.pause()
    active = cluster.active_coordinator()
    leader = cluster.zk_leader()
    cluster.kill("zookeeper", leader["id"])
    cluster.restart("zookeeper", leader["id"])
    wait_for_active(cluster.admin, RECOVERY_BOUND_S)
    moved = drill.clients.move_all(MOVED_DURATION_MS)
    report.add(Check.of("every lease held after the reconnection was moved to the newest snapshots and renewed",
                        [] if moved else ["no lease was held to move"], moved))
    drill.snapshotter.resume()
    victim = cluster.active_coordinator()
    killed_at = cluster.kill("coordinators", victim["id"])
    cluster.restart("coordinators", victim["id"])
    failover_s = _took_over(cluster, victim["address"], killed_at)
    report.add(recovered([failover_s], RECOVERY_BOUND_S, "the standby takes over and serves"))
    buckets = len(drill.snapshotter.choices()) or 1
    drill.snapshotter.wait_new(SNAPSHOTS_AFTER_FAILOVER * buckets, RECOVERY_BOUND_S)
    return {"killed_zookeeper_node": leader["id"], "leases_moved": moved, "killed_coordinator": victim["id"],
            "active_rode_out_the_quiet_fault": victim["id"] == active["id"], "coordinator_failover_s": failover_s}


def _took_over(cluster: DrillCluster, victim: str, killed_at: float) -> float | None:
    """Seconds from the kill until a coordinator other than ``victim`` serves as the active one."""
    deadline = time.monotonic() + RECOVERY_BOUND_S

    def another_active() -> bool:
        return wait_for_active(cluster.admin, max(0.1, deadline - time.monotonic())).address != victim
    try:
        took = poll(another_active, RECOVERY_BOUND_S, interval_s=0.1)[1]
    except errors.KvLeaseError:  # no coordinator became active
        return None
    return round(time.time() - killed_at, 3) if took else None


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
