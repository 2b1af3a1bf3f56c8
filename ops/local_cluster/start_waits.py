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
            if len(exited_for_good(procs, relaunch)) == len(procs):
                codes = ", ".join(str(proc.returncode) for proc in procs)
                raise ClusterError(f"every coordinator exited (exit codes {codes}); {log_files(doc, 'coordinators')}")
            addresses = tuple(c["address"] for c in doc["coordinators"])
            if addresses not in clients:  # the first poll, or a coordinator started again on another port
                clients[addresses] = stack.enter_context(admin_client(list(addresses), request_timeout_s=1.0,
                                                                      retry_total_s=0))
            client = clients[addresses]
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


def exited_for_good(procs: list[subprocess.Popen], relaunch: Relaunch) -> list[int]:
    """The indices of ``procs`` that exited and were not started again. ``relaunch`` runs after they were seen
    exited, so it examines each of them: one that lost the race for its port is started again (replaced in
    ``procs``) and never taken for dead, however shortly before this look it exited."""
    seen = {i: proc for i, proc in enumerate(procs) if proc.poll() is not None}
    if seen:
        relaunch(procs)
    return [i for i, proc in seen.items() if procs[i] is proc]


def _own_ports(entries: list[dict[str, Any]], procs: list[subprocess.Popen], relaunch: Relaunch) -> bool:
    """Whether each process of ``procs`` listens on its entry's port itself, or exited for another reason than
    losing it (:func:`exited_for_good`). One started again lost its port, and another server may have answered
    for it: False."""
    before = list(procs)
    dead = set(exited_for_good(procs, relaunch))
    if any(now is not then for now, then in zip(procs, before)):
        return False
    return all(i in dead or holds_port(proc.pid, int(entries[i]["address"].rsplit(":", 1)[1]))
               for i, proc in enumerate(procs))


def fail_if_tablets_exited(doc: Mapping[str, Any], procs: list[subprocess.Popen],
                           relaunch: Relaunch = lambda procs: None) -> None:
    """ClusterError naming the tablet servers that exited, but those that lost their port (started again by
    ``relaunch``: :func:`exited_for_good`)."""
    dead = [(doc["tablets"][i], procs[i].returncode) for i in exited_for_good(procs, relaunch)]
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
            fail_if_tablets_exited(doc, procs, relaunch)  # and those that lost their port are started again
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
