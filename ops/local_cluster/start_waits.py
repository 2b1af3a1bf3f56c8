"""What a ``cluster start`` waits for, in order: an active coordinator, every tablet server registered, every
bucket served (or waiting on an operator: :mod:`kvlease.ops.local_cluster.serving`).

Each wait gives up as soon as the processes it waits on all exited, or once its
timeout passes, with a ClusterError of one line naming what failed and the log
file of each process concerned (:func:`log_files`), never the logs themselves.
"""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any, Callable, Mapping

from kvlease.common.errors import KvLeaseError
from kvlease.ops.local_cluster.processes import ClusterError, Progress, holds_port
from kvlease.ops.local_cluster.serving import all_served, cluster_admin, serving_now
from kvlease.ops.wait import poll

#: Starts again, in place, the processes of a list that lost the race for their port.
Relaunch = Callable[[list[subprocess.Popen]], None]
_WHAT = {"coordinators": "coordinator", "tablets": "tablet server", "zookeeper": "ZooKeeper node"}


def log_files(doc: Mapping[str, Any], role: str) -> str:
    """``logs: coordinator 1 D/coordinator-1/coordinator.log, coordinator 2 …`` of every ``role`` process of
    ``doc``."""
    return "logs: " + ", ".join(f"{_WHAT[role]} {entry['id']} {entry['log']}" for entry in doc.get(role, []))


def wait_active(doc: dict[str, Any], procs: list[subprocess.Popen], timeout_s: float, admin_client,
                wait_for_active: Callable, relaunch: Relaunch = lambda procs: None) -> None:
    """Until a coordinator of ``doc`` is active (``procs``: theirs; ``relaunch(procs)`` first starts again those
    that lost the race for their port, replacing them in ``procs`` and ``doc``)."""
    clients: dict[tuple[str, ...], Any] = {}
    with contextlib.ExitStack() as stack:
        def active() -> bool:
            relaunch(procs)
            addresses = tuple(c["address"] for c in doc["coordinators"])
            if addresses not in clients:  # the first poll, or a coordinator started again on another port
                clients[addresses] = stack.enter_context(admin_client(list(addresses), request_timeout_s=1.0,
                                                                      retry_total_s=0))
            client = clients[addresses]
            if all(proc.poll() is not None for proc in procs):
                codes = ", ".join(str(proc.returncode) for proc in procs)
                raise ClusterError(f"every coordinator exited (exit codes {codes}); {log_files(doc, 'coordinators')}")
            try:
                wait_for_active(client, 1.0)
            except KvLeaseError:
                return False
            # an answer counts once each coordinator holds its own port: one that lost it to another server
            # (which may have answered for it) exits and is relaunched
            return _own_ports(doc["coordinators"], procs, relaunch)

        if not poll(active, timeout_s, interval_s=0.0)[1]:
            raise ClusterError(f"no coordinator became active within {timeout_s:.0f}s; "
                               f"{log_files(doc, 'coordinators')}")


def _own_ports(entries: list[dict[str, Any]], procs: list[subprocess.Popen], relaunch: Relaunch) -> bool:
    """Whether each process of ``procs`` listens on its entry's port itself, or exited for another reason than
    losing it (its exit code tells). One seen exited is offered to ``relaunch`` first, after it was seen: one
    that lost its port (and exited while another server answered for it) is started again, so False."""
    for i, proc in enumerate(list(procs)):
        if proc.poll() is None:
            if not holds_port(proc.pid, int(entries[i]["address"].rsplit(":", 1)[1])):
                return False
        else:
            relaunch(procs)
            if procs[i] is not proc:
                return False
    return True


def fail_if_tablets_exited(doc: Mapping[str, Any], procs: list[subprocess.Popen],
                           relaunch: Relaunch = lambda procs: None) -> None:
    """ClusterError naming the tablet servers that exited, but those that lost their port: ``relaunch`` runs
    after they were seen exited, so it examines each of them (one exiting just before is not taken for dead)."""
    exited = [proc for proc in procs if proc.poll() is not None]
    if not exited:
        return
    relaunch(procs)
    dead = [(t, proc.returncode) for t, proc in zip(doc["tablets"], procs) if any(proc is e for e in exited)]
    if dead:
        which = ", ".join(f"{t['id']} (exit code {code}, log {t['log']})" for t, code in dead)
        raise ClusterError(f"tablet server(s) {which} exited")


def wait_tablets(doc: dict[str, Any], procs: list[subprocess.Popen], timeout_s: float, admin_client,
                 relaunch: Relaunch = lambda procs: None) -> None:
    """Until every tablet server of ``doc`` is registered (ListTabletServers of the active coordinator);
    ``relaunch(procs)`` first starts again those that lost the race for their port."""
    wanted = {int(t["id"]) for t in doc["tablets"]}
    addresses = [c["address"] for c in doc["coordinators"]]
    registered: set[int] = set()
    with admin_client(addresses, request_timeout_s=2.0, retry_total_s=0) as client:
        def all_registered() -> bool:
            relaunch(procs)
            fail_if_tablets_exited(doc, procs, relaunch)
            try:
                ids = {s.id for s in client.list_tablet_servers()}
            except KvLeaseError:
                return False
            registered.clear()
            registered.update(ids)
            return wanted <= registered

        if not poll(all_registered, timeout_s, interval_s=0.2)[1]:
            missing = ", ".join(map(str, sorted(wanted - registered)))
            raise ClusterError(f"tablet server(s) {missing} did not register within {timeout_s:.0f}s; "
                               f"{log_files(doc, 'tablets')}")


def wait_served(doc: dict[str, Any], procs: list[subprocess.Popen], timeout_s: float, warn: Progress) -> None:
    """Until the leader of every bucket of every table answers for it (a restarted cluster's tablet servers
    register well before they have recovered their buckets), but the buckets that wait on an operator or on
    a server that is down: ``warn`` names each of those."""
    seen: dict[str, Any] = {"unserved": ["(no answer from a coordinator)"], "waiting": []}

    with cluster_admin(doc) as admin:
        def served() -> bool:
            fail_if_tablets_exited(doc, procs)
            seen.update(serving_now(doc, admin))
            return all_served(seen)

        reached = poll(served, timeout_s, interval_s=0.2)[1]
    if not reached:
        unserved = seen["unserved"]
        shown = "; ".join(unserved[:5]) + (f"; and {len(unserved) - 5} more" if len(unserved) > 5 else "")
        raise ClusterError(f"not every bucket had a serving leader within {timeout_s:.0f}s: {shown}; "
                           f"{log_files(doc, 'tablets')}")
    for bucket in seen["waiting"]:
        warn(waiting_line(bucket))


def waiting_line(bucket: Mapping[str, Any]) -> str:
    """``waiting: db.t bucket 0 — its last in-sync replica, tablet 2, is down`` (a ``waiting`` entry of
    :func:`kvlease.ops.local_cluster.serving.served_buckets`)."""
    partition = f" partition {bucket['partition']}" if bucket.get("partition") else ""
    return f"waiting: {bucket['table']}{partition} bucket {bucket['bucket']} — {bucket['why']}"
