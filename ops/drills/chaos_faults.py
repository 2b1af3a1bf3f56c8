"""Carrying out one planned fault (:mod:`ops.drills.chaos_plan`) on a running local cluster.

Every fault undoes itself before :func:`inject` returns: what was killed is
started again (and serves), a paused process gets SIGCONT, the remote storage
is put back, also when the fault itself fails half-way. Whatever is still
down after an error, :class:`~ops.drills.cluster.DrillCluster` restarts when
it closes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from common import config as cfg
import ops.drills.chaos_plan as cp
from ops import local_cluster
from ops.drills.cluster import DrillCluster
from ops.drills.remote_outage import RemoteOutage


def session_timeout_s(doc: dict[str, Any]) -> float:
    """The ZooKeeper session timeout the cluster's coordinators use (their config file, else the default)."""
    for coordinator in doc.get("coordinators", []):
        path = Path(coordinator["log"]).parent / "config.toml"
        if path.exists():
            values = cfg.Config(cfg.read_file(path), env={})
            return values[cfg.ZK_SESSION_TIMEOUT] / 1000.0
    return cfg.Config({}, env={})[cfg.ZK_SESSION_TIMEOUT] / 1000.0


def inject(cluster: DrillCluster, fault: cp.Fault, remote: RemoteOutage | None) -> dict[str, Any]:
    """Wait ``fault.gap_s``, make the fault, undo it; returns what was done (``at``: wall-clock start)."""
    time.sleep(fault.gap_s)
    at = time.time()
    node = _do(cluster, fault, remote)
    return {"kind": fault.kind, "node": node, "at": round(at, 3), "seconds": round(time.time() - at, 3)}


def _do(cluster: DrillCluster, fault: cp.Fault, remote: RemoteOutage | None) -> str:
    if fault.kind in (cp.ZK_RESTART, cp.ZK_LEADER_LOSS):
        nodes = cluster.doc["zookeeper"]
        node = cluster.zk_leader()["id"] if fault.kind == cp.ZK_LEADER_LOSS else nodes[fault.target % len(nodes)]["id"]
        cluster.kill("zookeeper", node)
        time.sleep(fault.hold_s)
        cluster.restart("zookeeper", node)
        return f"zookeeper {node}"
    if fault.kind == cp.COORDINATOR_KILL:
        node = cluster.active_coordinator()["id"]
        cluster.kill("coordinators", node)
        cluster.restart("coordinators", node)
        return f"coordinator {node}"
    if fault.kind == cp.COORDINATOR_PAUSE:
        entry = cluster.active_coordinator()
        _pause(entry, fault.hold_s)
        return f"coordinator {entry['id']}"
    if fault.kind == cp.TABLET_RESTART:
        tablets = cluster.doc["tablets"]
        node = tablets[fault.target % len(tablets)]["id"]
        cluster.kill("tablets", node)
        cluster.restart("tablets", node)
        return f"tablet {node}"
    if fault.kind == cp.REMOTE_OUTAGE:
        if remote is None:
            raise ValueError("a remote outage needs a file:// remote")
        remote.begin()
        try:
            time.sleep(fault.hold_s)
        finally:
            remote.end()
        return "remote storage"
    raise ValueError(f"unknown fault kind {fault.kind!r}")


def _pause(entry: dict[str, Any], hold_s: float) -> None:
    """SIGSTOP the process of ``entry`` for ``hold_s`` (a GC pause, or a partition), then SIGCONT."""
    pid = entry["pid"]
    if not local_cluster.pid_alive(pid, entry.get("proc_start")):
        return
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(hold_s)
    finally:
        os.kill(pid, signal.SIGCONT)
