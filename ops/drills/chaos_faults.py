"""Carrying out one planned fault (:mod:`kvlease.ops.drills.chaos_plan`) on a running local cluster.

Every fault undoes itself before :func:`inject` returns: what was killed is
started again (and serves), a paused process gets SIGCONT, the remote storage
is put back, a full disk is freed, also when the fault itself fails half-way.
Whatever is still down after an error, :class:`~kvlease.ops.drills.cluster.DrillCluster`
restarts when it closes. Each kind is carried out by its entry in :data:`HANDLERS`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from kvlease.common.errors import KvLeaseError
import kvlease.ops.drills.chaos_plan as cp
from kvlease.ops import local_cluster
from kvlease.ops.drills.chaos_disks import DiskFill
from kvlease.ops.drills.cluster import DrillCluster
from kvlease.ops.drills.faults import RemoteOutage, paused
from kvlease.ops.wait import poll

LEADER_WAIT_S = 30.0  # how long a tablet pause or full disk waits for its bucket to have a live leader to strike
TOP_UP_EVERY_S = 0.2  # how often a full disk takes the room its server freed meanwhile


@dataclass(frozen=True)
class Targets:
    """What faults strike besides the cluster's processes: the remote storage (None unless ``file://``), and
    the drill's row table, whose bucket leaders a tablet pause picks from."""

    remote: RemoteOutage | None
    table_id: int


def inject(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> dict[str, Any]:
    """Wait ``fault.gap_s``, make the fault, undo it; returns what was done (``at``: wall-clock start,
    ``seconds``: until it was undone, and what its handler adds)."""
    time.sleep(fault.gap_s)
    at = time.time()
    struck = HANDLERS[fault.kind](cluster, fault, targets)
    node, more = struck if isinstance(struck, tuple) else (struck, {})
    return {"kind": fault.kind, "node": node, "at": round(at, 3), "seconds": round(time.time() - at, 3), **more}


def _zookeeper_kill(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> str:
    nodes = cluster.doc["zookeeper"]
    node = cluster.zk_leader()["id"] if fault.kind == cp.ZK_LEADER_LOSS else nodes[fault.target % len(nodes)]["id"]
    cluster.kill("zookeeper", node)
    time.sleep(fault.hold_s)
    cluster.restart("zookeeper", node)
    return f"zookeeper {node}"


def _coordinator_kill(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> str:
    node = cluster.active_coordinator()["id"]
    cluster.kill("coordinators", node)
    cluster.restart("coordinators", node)
    return f"coordinator {node}"


def _coordinator_pause(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> str:
    entry = cluster.active_coordinator()
    _pause(entry, fault.hold_s)
    return f"coordinator {entry['id']}"


def _tablet_restart(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> str:
    tablets = cluster.doc["tablets"]
    node = tablets[fault.target % len(tablets)]["id"]
    cluster.kill("tablets", node)
    cluster.restart("tablets", node)
    return f"tablet {node}"


def _remote_outage(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> str:
    if targets.remote is None:
        raise ValueError("a remote outage needs a file:// remote")
    targets.remote.begin()
    try:
        time.sleep(fault.hold_s)
    finally:
        targets.remote.end()
    return "remote storage"


def _tablet_pause(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> str:
    """SIGSTOP the server leading bucket ``fault.target`` of the row table now; SIGCONT after ``hold_s``."""
    bucket, leader = _leader_of(cluster, targets.table_id, fault.target)
    if leader is None:
        return f"none: bucket {bucket} had no live leader for {LEADER_WAIT_S:g}s"
    entry = next(t for t in local_cluster.load(cluster.directory)["tablets"] if str(t["id"]) == leader)
    _pause(entry, fault.hold_s)
    return f"tablet {leader} (leader of bucket {bucket})"


def _disk_full(cluster: DrillCluster, fault: cp.Fault, targets: Targets) -> tuple[str, dict[str, Any]]:
    """Fill the disk of the server leading bucket ``fault.target`` of the row table now (no byte left, kept so
    for ``hold_s``), then free it; adds the bucket, its leader then and when the disk was freed (another
    server if it stepped down meanwhile; None if the coordinator did not answer) and the bytes written."""
    bucket, leader = _leader_of(cluster, targets.table_id, fault.target)
    if leader is None:
        return f"none: bucket {bucket} had no live leader for {LEADER_WAIT_S:g}s", {}
    fill = DiskFill(local_cluster.tablet_disks.data_dir(cluster.directory, leader))
    fill.begin()
    try:
        deadline = time.monotonic() + fault.hold_s
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(TOP_UP_EVERY_S, left))
            fill.top_up()
        then = _leader_now(cluster, targets.table_id, bucket)
    finally:
        fill.end()
    return (f"tablet {leader} (leader of bucket {bucket})",
            {"bucket": bucket, "leader": int(leader), "leader_when_freed": then, "filled_bytes": fill.written})


def _leader_now(cluster: DrillCluster, table_id: int, bucket: int) -> int | None:
    try:
        _table, leaders = cluster.admin.get_table_assignment(table_id)
    except KvLeaseError:
        return None
    return leaders[bucket].leader_id if leaders[bucket].leader_address else None


def _leader_of(cluster: DrillCluster, table_id: int, target: int) -> tuple[int, str | None]:
    """Bucket ``target`` (modulo the table's buckets) and the id of its live leader, waiting up to
    ``LEADER_WAIT_S`` for one (the fault before may still be recovering); None if there is none."""
    chosen: list[int] = []  # the bucket, as each look found the table

    def leader() -> str | None:
        _table, leaders = cluster.admin.get_table_assignment(table_id)
        bucket = sorted(leaders)[target % len(leaders)]
        chosen.append(bucket)
        return str(leaders[bucket].leader_id) if leaders[bucket].leader_address else None
    leader_id, _led = poll(leader, LEADER_WAIT_S, interval_s=0.1)
    return chosen[-1], leader_id


def _pause(entry: dict[str, Any], hold_s: float) -> None:
    """SIGSTOP the process of ``entry`` for ``hold_s`` (a GC pause, or a partition), then SIGCONT."""
    pid = entry["pid"]
    if not local_cluster.pid_alive(pid, entry.get("proc_start")):
        return
    with paused(pid):
        time.sleep(hold_s)


#: kind -> what carries it out (and undoes it): ``(cluster, fault, targets) -> the node it struck``, or
#: ``(that, {more of what was done})``
HANDLERS: dict[str, Callable[[DrillCluster, cp.Fault, Targets], str | tuple[str, dict[str, Any]]]] = {
    cp.ZK_RESTART: _zookeeper_kill,
    cp.ZK_LEADER_LOSS: _zookeeper_kill,
    cp.COORDINATOR_KILL: _coordinator_kill,
    cp.COORDINATOR_PAUSE: _coordinator_pause,
    cp.TABLET_RESTART: _tablet_restart,
    cp.REMOTE_OUTAGE: _remote_outage,
    cp.TABLET_PAUSE: _tablet_pause,
    cp.DISK_FULL: _disk_full,
}
