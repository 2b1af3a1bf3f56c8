"""kill -9 the ZooKeeper leader under lease traffic, --rounds times (default 3); restart it each time.

Checks: every acknowledged lease reads back as acknowledged (describe and
list on the active coordinator, ZooKeeper + files); no file of a leased
snapshot is deleted; no write is accepted from a deposed coordinator
(ZooKeeper's transaction log); an acquire sent after each kill succeeds
within 30 s (the time to recover is reported). Needs --zk-nodes 3 and
--tablets 1 or more.
"""

from __future__ import annotations

from ops import cluster as local_cluster
from ops.drill import Report, finish
from ops.drill_checks import OK, recovered
from ops.drill_cluster import DrillCluster, require
from ops.drill_leases import LeaseDrill

NAME = "zk-leader-loss"
OPTIONS = ("rounds", "clients", "seed")
RECOVERY_BOUND_S = 30.0
ACKS_BEFORE_KILL = 200


def check_shape(doc: dict) -> None:
    require(doc, NAME, zk_nodes=3, tablets=1)


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
        drill.clients.more_acks(ACKS_BEFORE_KILL, 30)
        report.add(recovered(recovery, RECOVERY_BOUND_S, "an acquire sent after the kill succeeds"))
        for check in drill.checks():
            report.add(check)
        report.figures.update(rounds=rounds, clients=clients, killed_zookeeper_nodes=killed_nodes,
                              recovery_s=recovery, **drill.figures())
        report.add(cluster.whole_again())
    return report


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
