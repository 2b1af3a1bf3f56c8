"""A running local cluster, one question or one process at a time: its status, kill or restart one
process (drills, the demo), the active coordinator, the ZooKeeper leader (which buckets are served:
:mod:`kvlease.ops.local_cluster.serving`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Mapping

from kvlease.common.errors import KvLeaseError
from kvlease.ops.local_cluster.cluster_file import client_config, load, updating
from kvlease.ops.local_cluster.processes import ClusterError, pid_alive, proc_start, spawn_server, terminate
from kvlease.ops.local_cluster.serving import all_served, cluster_admin, serving_now
from kvlease.ops.local_cluster.tablet_disks import usage as disk_usage
from kvlease.ops.local_cluster.tablet_health import status_fields
from kvlease.ops.local_cluster.zookeeper import is_serving, node_command, server_mode
from kvlease.ops.wait import poll


def status(directory: str | os.PathLike[str], request_timeout_s: float = 2.0) -> dict[str, Any]:
    """Every recorded process (its ``id`` an int, as the cluster's APIs tell tablet ids), whether it runs, what each coordinator says about itself, how many buckets each
    tablet server leads, how many replicas it holds and whether it is ``decommissioned``, the offline and
    under-replicated buckets (``offline`` / ``under_replicated``: asked of the active coordinator, wherever it is
    in the list) and what each serves (its health, asked of it: :func:`kvlease.ops.local_cluster.tablet_health.status_fields`);
    a tablet server on a small disk of its own (``--tablet-disk``) its size and free bytes (``disk_bytes``,
    ``disk_free_bytes``: None once unmounted); the ``settings`` every server was started with (``cluster start
    --set``). A question that failed is reported under ``error``, never taken as "no"."""
    from kvlease.client.admin import AdminClient

    doc = load(directory)
    result: dict[str, Any] = {"zookeeper": [], "coordinators": [], "tablets": [],
                              "settings": dict(doc.get("settings") or {})}
    for node in doc.get("zookeeper", []):
        result["zookeeper"].append({"id": int(node["id"]), "pid": node["pid"], "address": node["address"],
                                    "alive": pid_alive(node["pid"], node.get("proc_start"))})
    addresses = [c["address"] for c in doc.get("coordinators", [])] or ["127.0.0.1:0"]
    with AdminClient(addresses, client_config(doc), request_timeout_s=request_timeout_s, retry_total_s=0) as client:
        for c in doc.get("coordinators", []):
            alive = pid_alive(c["pid"], c.get("proc_start"))
            entry = {"id": int(c["id"]), "pid": c["pid"], "address": c["address"], "active": False, "epoch": None,
                     "alive": alive, "log": c.get("log")}
            if alive:
                try:
                    info = client.coordinator_info(c["address"])
                    entry.update(active=info.active, epoch=info.epoch)
                except KvLeaseError as exc:
                    entry["error"] = exc.message
            result["coordinators"].append(entry)
    servers: dict[str, Any] | None = None
    tablets_error = None
    tablets_alive = [pid_alive(t["pid"], t.get("proc_start")) for t in doc.get("tablets", [])]
    if doc.get("tablets"):
        active = next((c for c in result["coordinators"] if c["active"]), None)
        if active is None:
            if any(c["alive"] for c in result["coordinators"]) or any(tablets_alive):
                tablets_error = "no active coordinator to ask which tablet servers are registered"
            # else a stopped cluster: nothing to ask, and nothing failed
        else:
            try:
                with AdminClient([active["address"]], client_config(doc), request_timeout_s=request_timeout_s,
                                 retry_total_s=0) as client:
                    servers = _health(client, result)
            except KvLeaseError as exc:
                tablets_error = f"coordinator {active['id']} ({active['address']}): {exc.message}"
    for t, alive in zip(doc.get("tablets", []), tablets_alive):
        entry = {"id": int(t["id"]), "pid": t["pid"], "address": t["address"], "alive": alive, "log": t.get("log")}
        if servers is None:
            entry.update(buckets=None, registered=None, error=tablets_error)
        else:
            server = servers.get(str(t["id"]))
            entry.update(buckets=server.buckets if server else 0, replicas=server.replicas if server else 0,
                         registered=server is not None,
                         decommissioned=str(t["id"]) in map(str, result.get("decommissioned", ())))
        entry.update(status_fields(t.get("metrics_address"), alive, request_timeout_s))
        entry.update(disk_usage(directory, doc, t["id"]) or {})
        result["tablets"].append(entry)
    return result


def _health(client, result: dict[str, Any]) -> dict[str, Any]:
    """The registered tablet servers (id as a string -> TabletServerInfo); the offline, under-replicated and
    decommissioned ones (every id, also those not in the cluster file) and the moves in progress into ``result``."""
    health = client.cluster_health()
    result["decommissioned"] = list(health.decommissioned)
    for key, buckets in (("offline", health.offline), ("under_replicated", health.under_replicated)):
        result[key] = [{"table": b.table, "table_id": b.table_id, "bucket": b.bucket,
                        **({} if b.partition_id is None else {"partition": b.partition,
                                                               "partition_id": b.partition_id}),
                        **({"offline_reason": b.offline_reason} if b.offline_reason else {})} for b in buckets]
        result[f"{key}_count"] = len(buckets)
    result.update(_reassignments(client))
    return {str(s.id): s for s in health.servers}


def _reassignments(client) -> dict[str, Any]:
    """``{"reassignments": [moves in progress]}`` (issue 31: the buckets being moved, what each waits for), or
    nothing if the coordinator cannot tell (e.g. one without the call)."""
    try:
        return {"reassignments": client.list_reassignments()}
    except KvLeaseError:
        return {}


ROLES = {"zookeeper": "ZooKeeper node", "coordinators": "coordinator", "tablets": "tablet server"}


def member(doc: Mapping[str, Any], role: str, node_id: str | int) -> dict[str, Any]:
    """The cluster.json entry of ``role`` (``zookeeper``, ``coordinators``, ``tablets``) ``node_id``."""
    if role not in ROLES:
        raise ClusterError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
    for entry in doc.get(role, []):
        if str(entry["id"]) == str(node_id):
            return entry
    raise ClusterError(f"the cluster has no {ROLES[role]} {node_id}")


#: How long a process may take to go after ``kill -9``, and after a signal it handles (SIGTERM: a tablet
#: server first hands its leaderships over, for up to ``tablet.controlled-shutdown.timeout``, 30 s by
#: default, then closes its buckets; on a loaded machine that took longer than 10 s).
KILLED_WITHIN_S = 10.0
STOPPED_WITHIN_S = 60.0


def kill(directory: str | os.PathLike[str], role: str, node_id: str | int, sig: int = signal.SIGKILL,
         timeout_s: float | None = None) -> int | None:
    """Send ``sig`` (default: ``kill -9``) to one process and wait until it is gone: at most ``timeout_s``,
    by default :data:`KILLED_WITHIN_S` after ``kill -9`` and :data:`STOPPED_WITHIN_S` after any other signal.

    Returns its pid, or None if it was not running.
    """
    if timeout_s is None:
        timeout_s = KILLED_WITHIN_S if sig == signal.SIGKILL else STOPPED_WITHIN_S
    entry = member(load(directory), role, node_id)
    pid, started = entry.get("pid"), entry.get("proc_start")
    if not pid_alive(pid, started):
        return None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return pid
    if not poll(lambda: not pid_alive(pid, started), timeout_s, interval_s=0.01)[1]:
        raise ClusterError(f"{ROLES[role]} {node_id} (pid {pid}) still runs {timeout_s:g}s after signal {sig}")
    return pid


def restart(directory: str | os.PathLike[str], role: str, node_id: str | int,
            ready_timeout_s: float = 60.0, graceful: bool = False) -> dict[str, Any]:
    """Start one process again with its own config, port and data (killed first if it runs:
    ``kill -9``, or with ``graceful`` SIGTERM and SIGKILL only if it is not gone in 10 s).

    Returns once it serves: a ZooKeeper node answers (an ensemble node needs
    a quorum), a coordinator answers CoordinatorInfo, a tablet server is
    registered and every bucket answers, but those that wait on an operator or
    on another server that is down (:func:`kvlease.ops.local_cluster.serving.waits_for`).
    Records its new pid in cluster.json (under the directory's lock: restarts
    at once each keep the others' pids). Returns its cluster.json entry, a
    tablet server's with ``waiting``: the buckets it did not wait for, each
    ``{"table", "bucket", "why"}``. ClusterError naming its log file if it
    exits or does not serve within ``ready_timeout_s``.
    """
    directory = Path(directory).resolve()
    if graceful:
        running = member(load(directory), role, node_id)
        terminate([(running["pid"], running.get("proc_start"))] if running.get("pid") else [])
    else:
        kill(directory, role, node_id)
    with updating(directory) as doc:
        entry = member(doc, role, node_id)
        proc = _spawn_again(directory, doc, role, entry)
        entry.update(pid=proc.pid, proc_start=proc_start(proc.pid))
    waiting = _wait_serving(doc, role, entry, proc, ready_timeout_s)
    return {**entry, "waiting": waiting} if role == "tablets" else dict(entry)


def _spawn_again(directory: Path, doc: Mapping[str, Any], role: str, entry: Mapping[str, Any]) -> subprocess.Popen:
    if role == "zookeeper":
        node_dir = Path(entry["log"]).parent
        cmd = node_command(str(node_dir / "zoo.cfg"), int(entry["id"]), ensemble=len(doc["zookeeper"]) > 1)
        with open(entry["log"], "ab") as log:
            return subprocess.Popen(cmd, cwd=str(node_dir), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
    module = "coordinator" if role == "coordinators" else "tablet"
    return spawn_server(directory / f"{module}-{entry['id']}", module, detached=True)


def _wait_serving(doc: Mapping[str, Any], role: str, entry: Mapping[str, Any], proc: subprocess.Popen,
                  timeout_s: float) -> list[dict[str, Any]]:
    """Until the restarted process ``proc`` serves (see :func:`restart`); a tablet server's waiting buckets."""
    what = f"{ROLES[role]} {entry['id']}"
    port = int(entry["address"].rsplit(":", 1)[1])
    seen: dict[str, Any] = {"unserved": [], "waiting": []}

    def serves(admin) -> bool:
        if proc.poll() is not None:
            raise ClusterError(f"{what} exited with code {proc.returncode} after a restart; its log: {entry['log']}")
        if role == "zookeeper":
            return is_serving(port)
        if role == "coordinators":
            return _answers(doc, entry["address"])
        seen.update(serving_now(doc, admin))
        return int(entry["id"]) in seen["registered"] and all_served(seen)

    with contextlib.ExitStack() as stack:  # a tablet server's polls ask through one client
        admin = stack.enter_context(cluster_admin(doc)) if role == "tablets" else None
        reached = poll(lambda: serves(admin), timeout_s, interval_s=0.1)[1]
    if not reached:
        unserved = "; ".join(seen["unserved"][:5])
        raise ClusterError(f"{what} did not serve within {timeout_s:g}s of a restart"
                           + (f" (not served: {unserved})" if unserved else "") + f"; its log: {entry['log']}")
    return seen["waiting"]


def _answers(doc: Mapping[str, Any], address: str) -> bool:
    from kvlease.client.admin import AdminClient

    with AdminClient([address], client_config(doc), request_timeout_s=1.0, retry_total_s=0) as client:
        try:
            client.coordinator_info(address)
            return True
        except KvLeaseError:
            return False


def active_coordinator(directory: str | os.PathLike[str], timeout_s: float = 30.0) -> dict[str, Any]:
    """The cluster.json entry of the active coordinator, waiting up to ``timeout_s`` for one."""
    from kvlease.client.admin import AdminClient

    def active() -> dict[str, Any] | None:
        doc = load(directory)
        for entry in doc.get("coordinators", []):
            if not pid_alive(entry["pid"], entry.get("proc_start")):
                continue
            with AdminClient([entry["address"]], client_config(doc), request_timeout_s=1.0, retry_total_s=0) as client:
                try:
                    if client.coordinator_info(entry["address"]).active:
                        return entry
                except KvLeaseError:
                    pass
        return None
    entry, found = poll(active, timeout_s, interval_s=0.1)
    if not found:
        raise ClusterError(f"no coordinator of the cluster in {directory} became active within {timeout_s:g}s")
    return entry


def zk_leader(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ZooKeeper node that says it leads the ensemble (None for a standalone node or no leader)."""
    for node in load(directory).get("zookeeper", []):
        if server_mode(int(node["address"].rsplit(":", 1)[1])) == "leader":
            return node
    return None
