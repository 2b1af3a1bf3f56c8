"""kill -9 the active coordinator under lease traffic, --rounds times (default 5).

Checks: every acknowledged lease reads back as acknowledged (describe and
list on the new active coordinator, ZooKeeper + files); no file of a leased
snapshot is deleted; no write is accepted from a deposed coordinator
(ZooKeeper's transaction log); an acquire succeeds on the new active
coordinator within 30 s of each kill (the time to recover is reported).
Needs --coordinators 2 and --tablets 1 or more.

Each round: some traffic, ``kill -9`` of the active coordinator, which is
restarted at once (it joins as a standby while the other takes over), then
the wait for the first acquire the new active coordinator acknowledges, and
until every client had a call acknowledged that it sent after the kill (no
call spans two failovers). A round takes about the ZooKeeper session timeout
of the cluster (6 s): the killed coordinator's election node lives that long.
"""

from __future__ import annotations

from kvlease.ops.drills.report import Report, finish
from kvlease.ops.drills.checks import OK, recovered
from kvlease.ops.drills.cluster import DrillCluster, require
from kvlease.ops.drills.leases import LeaseDrill
from kvlease.ops import local_cluster

NAME = "coordinator-failover"
OPTIONS = ("rounds", "clients", "seed")
RECOVERY_BOUND_S = 30.0
ACKS_BEFORE_KILL = 100  # about half a second of traffic


def check_shape(doc: dict) -> None:
    require(doc, NAME, coordinators=2, tablets=1)


def run(cluster_dir: str, rounds: int = 5, clients: int = 16, seed: int = 0) -> Report:
    check_shape(local_cluster.load(cluster_dir))
    report = Report(NAME)
    with DrillCluster(cluster_dir, NAME) as cluster, LeaseDrill(cluster, clients, seed) as drill:
        drill.start()
        recovery: list[float | None] = []
        for _ in range(rounds):
            drill.before_fault(ACKS_BEFORE_KILL)
            victim = cluster.active_coordinator()
            killed_at = cluster.kill("coordinators", victim["id"])
            cluster.restart("coordinators", victim["id"])
            first = drill.clients.wait_for(
                lambda op: op.kind == "acquire" and op.outcome == OK and op.t1 > killed_at
                and op.address != victim["address"], RECOVERY_BOUND_S)
            recovery.append(None if first is None else round(first.t1 - killed_at, 3))
            drill.clients.settled(killed_at, RECOVERY_BOUND_S)  # no call spans two failovers
        drill.clients.more_acks(ACKS_BEFORE_KILL, 30)
        report.add(recovered(recovery, RECOVERY_BOUND_S, "an acquire succeeds on the new active coordinator"))
        for check in drill.checks():
            report.add(check)
        report.figures.update(rounds=rounds, clients=clients, recovery_s=recovery, **drill.figures())
        report.add(cluster.whole_again())
    return report


def main(cluster_dir: str, json_output: bool = False, **options) -> int:
    return finish(run(cluster_dir, **options), json_output)
