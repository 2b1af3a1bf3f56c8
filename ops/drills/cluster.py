"""The cluster a drill runs against: its shape, clients, ZooKeeper, remote storage, and faults it undoes.

:class:`DrillCluster` opens a local cluster directory (``kvlease cluster
start --dir D``), checks that it runs and has the shape the drill needs
(:class:`ClusterShapeError` otherwise, e.g. "needs --zk-nodes 3"), and hands
out what the drill reads through: an admin client on the coordinators, a
ZooKeeper client on the cluster's chroot (reads only), the remote storage as
the coordinators name it. Faults go through :meth:`DrillCluster.kill`;
whatever was killed and not restarted yet is restarted on :meth:`close`, so
a drill leaves the cluster in the shape it found it, also when it fails.
:func:`session_timeout_s` and :func:`failure_timeout_s` read the timeouts its
servers' config files set, which size the faults that must outlast them;
:func:`auto_partition_interval_s` the coordinators' auto-partition check interval.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.tables import Column
from kvlease.common.zk import make_client
from kvlease.client.admin import AdminClient, wait_for_active
from kvlease.ops import local_cluster
from kvlease.ops.check import Check
from kvlease.ops.local_cluster import four_letter
from kvlease.ops.wait import poll, wait_in_sync

DRILL_DB = "drill"


def zk_config(doc: dict[str, Any], root: str) -> cfg.Config:
    """A Config for a ZooKeeper client on the cluster's chroot, with the digest its processes use
    (``security.zookeeper.digest`` of a coordinator's config file, else of the environment)."""
    values = {cfg.ZK_ADDRESS.name: doc["zookeeper_connect"], cfg.ZK_ROOT.name: root}
    for coordinator in doc.get("coordinators", []):
        path = Path(coordinator["log"]).parent / "config.toml"
        digest = cfg.read_file(path).get(cfg.ZK_DIGEST.name) if path.exists() else None
        if digest:
            values[cfg.ZK_DIGEST.name] = digest
            break
    env = {cfg.ZK_DIGEST.env_var: v} if (v := os.environ.get(cfg.ZK_DIGEST.env_var)) else {}
    return cfg.Config(values, env={} if cfg.ZK_DIGEST.name in values else env)


def session_timeout_s(doc: dict[str, Any]) -> float:
    """The ZooKeeper session timeout the cluster's coordinators use (their config file, else the default)."""
    return _seconds(doc, "coordinators", cfg.ZK_SESSION_TIMEOUT)


def auto_partition_interval_s(doc: dict[str, Any]) -> float:
    """How often the cluster's active coordinator checks auto-partitioned tables (``auto-partition.check-interval``
    of a coordinator's config file, else the default), in seconds."""
    return _seconds(doc, "coordinators", cfg.AUTO_PARTITION_CHECK_INTERVAL)


def failure_timeout_s(doc: dict[str, Any]) -> float:
    """How long the cluster's tablet servers keep leading while their writes fail
    (``replica.leader.failure-timeout`` of their config file, else the default)."""
    return _seconds(doc, "tablets", cfg.REPLICA_LEADER_FAILURE_TIMEOUT)


def _seconds(doc: dict[str, Any], role: str, key: cfg.Key) -> float:
    """Duration ``key`` of the first ``role`` process's config file (the default without one), in seconds."""
    for entry in doc.get(role, []):
        path = Path(entry["log"]).parent / "config.toml"
        if path.exists():
            return cfg.Config(cfg.read_file(path), env={})[key] / 1000.0
    return cfg.Config({}, env={})[key] / 1000.0


def in_sync_since(cluster: "DrillCluster", table_id: int, since: float,
                  timeout_s: float) -> tuple[Check, dict[int, int], float | None]:
    """Wait up to ``timeout_s`` until every bucket has a live leader and every replica in its ISR
    (:func:`kvlease.ops.wait.wait_in_sync`). Returns the check, each bucket's leader then, and the seconds from
    ``since`` (wall clock) until then (None: it did not happen)."""
    state, behind, took = wait_in_sync(cluster.admin, table_id, timeout_s)
    check = Check.of(f"every replica back in the ISR within {timeout_s:g}s of the last fault", behind, len(state))
    return check, {b: a.leader_id for b, a in state.items()}, None if took is None else round(time.time() - since, 3)


class ClusterShapeError(errors.InvalidRequestError):
    """The cluster cannot run this drill (too few nodes of some kind, an S3 remote, …)."""


def require(doc: dict[str, Any], drill: str, *, zk_nodes: int = 1, coordinators: int = 1, tablets: int = 0,
            file_remote: bool = False) -> None:
    """Raise ClusterShapeError naming the ``kvlease cluster start`` option the cluster lacks."""
    have = {"zk-nodes": len(doc.get("zookeeper", [])), "coordinators": len(doc.get("coordinators", [])),
            "tablets": len(doc.get("tablets", []))}
    for option, needed in (("zk-nodes", zk_nodes), ("coordinators", coordinators), ("tablets", tablets)):
        if have[option] < needed:
            raise ClusterShapeError(f"drill {drill} needs --{option} {needed}"
                                    f"{'' if option == 'zk-nodes' else ' or more'} (the cluster has {have[option]})")
    if file_remote and not str(doc.get("remote", "")).startswith("file://"):
        raise ClusterShapeError(f"drill {drill} needs a file:// remote it can take away "
                                f"(the cluster uses {doc.get('remote')}); start it without --remote")


def not_running(doc: dict[str, Any]) -> list[str]:
    """``["coordinator 2", …]``: recorded processes that do not run."""
    return [f"{local_cluster.ROLES[role]} {entry['id']}" for role in local_cluster.ROLES for entry in doc.get(role, [])
            if not local_cluster.pid_alive(entry.get("pid"), entry.get("proc_start"))]


def require_whole(doc: dict[str, Any], directory: str) -> None:
    """InvalidRequestError naming the processes down unless every recorded process runs."""
    down = not_running(doc)
    if down:
        raise errors.InvalidRequestError(
            f"the cluster in {directory} is not running whole ({', '.join(down)} down); "
            f"a drill needs every process up (kvlease cluster stop / start --dir {directory})")


class DrillCluster:
    """A running local cluster as one drill sees it; close it (or ``with``) to undo the faults left."""

    def __init__(self, directory: str, drill: str, *, request_timeout_s: float = 5.0,
                 retry_total_s: float = 30.0) -> None:
        self.directory = str(Path(directory).resolve())
        self.drill = drill
        self.run_id = uuid.uuid4().hex[:6]
        self.doc = local_cluster.load(self.directory)
        require_whole(self.doc, self.directory)
        self.addresses = [c["address"] for c in self.doc["coordinators"]]
        self.root = self.doc.get("zk_root", local_cluster.ZK_ROOT)
        self.killed: dict[tuple[str, str], float] = {}
        logging.getLogger("kazoo").setLevel(logging.ERROR)  # connection losses are what drills cause
        self.admin = AdminClient(self.addresses, request_timeout_s=request_timeout_s, retry_total_s=retry_total_s)
        self.zk = None
        try:
            wait_for_active(self.admin, 30.0)
            self.storage = self.admin.coordinator_info().remote_storage()
            self.zk = make_client(zk_config(self.doc, self.root))
        except BaseException:
            self.close()
            raise

    # -- faults ---------------------------------------------------------------------------------

    def kill(self, role: str, node_id: str, sig: int = signal.SIGKILL) -> float:
        """Signal one process and wait until it is gone; returns the wall-clock time it was sent."""
        self.killed[(role, str(node_id))] = at = time.time()
        local_cluster.kill(self.directory, role, node_id, sig)
        return at

    def restart(self, role: str, node_id: str) -> None:
        """Start it again and wait until it serves (ops.local_cluster.restart)."""
        local_cluster.restart(self.directory, role, node_id)
        self.killed.pop((role, str(node_id)), None)
        self.doc = local_cluster.load(self.directory)

    def active_coordinator(self) -> dict[str, Any]:
        return local_cluster.active_coordinator(self.directory)

    def zk_leader(self, timeout_s: float = 30.0) -> dict[str, Any]:
        leader, found = poll(lambda: local_cluster.zk_leader(self.directory), timeout_s, interval_s=0.1)
        if not found:
            raise errors.KvLeaseError(f"the ZooKeeper ensemble of {self.directory} has no leader")
        return leader

    # -- what ZooKeeper wrote ----------------------------------------------------------------------

    def zk_data_dirs(self) -> list[Path]:
        return [Path(node["log"]).parent / "data" for node in self.doc.get("zookeeper", [])]

    def zxid(self) -> int:
        """The highest zxid a live ZooKeeper node reports now (0 if none answers)."""
        best = 0
        for node in self.doc.get("zookeeper", []):
            for line in (four_letter(int(node["address"].rsplit(":", 1)[1]), "srvr") or "").splitlines():
                if line.startswith("Zxid:"):
                    best = max(best, int(line.split(":", 1)[1].strip(), 16))
        return best

    # -- a table of its own -------------------------------------------------------------------------

    def create_table(self, buckets: int = 4, suffix: str = "", *, replication_factor: int | None = None,
                     min_insync_replicas: int | None = None) -> str:
        """``drill.<drill>_<run id>[_<suffix>]``: id BIGINT, v BIGINT, pad STRING; primary key id (replication:
        the coordinator's defaults unless given)."""
        path = f"{DRILL_DB}.{self.drill.replace('-', '_')}_{self.run_id}{f'_{suffix}' if suffix else ''}"
        self.admin.create_table(path, [Column("id", "BIGINT"), Column("v", "BIGINT"), Column("pad", "STRING")],
                                ["id"], buckets, replication_factor=replication_factor,
                                min_insync_replicas=min_insync_replicas)
        return path

    def drop_table(self, path: str) -> None:
        self.admin.drop_table(path, ignore_if_not_exists=True)

    def whole_again(self, timeout_s: float = 30.0) -> Check:
        """The cluster is back in the shape the drill found it: every process runs, a coordinator
        is active, every bucket's leader serves it (waiting up to ``timeout_s`` for that)."""
        problems: list[str] = []

        def whole() -> bool:
            nonlocal problems
            self.doc = local_cluster.load(self.directory)
            problems = [f"{what} is not running" for what in not_running(self.doc)]
            try:
                problems += [f"bucket {b} is not served" for b in local_cluster.served_buckets(self.doc)["unserved"]]
            except errors.KvLeaseError as exc:
                problems.append(f"no coordinator answers: {exc.message}")
            return not problems
        poll(whole, timeout_s, interval_s=0.2)
        return Check.of("the cluster is whole again (every process runs, every bucket served)", problems,
                        sum(len(self.doc.get(role, [])) for role in local_cluster.ROLES))

    # -- the end ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Restart what is still killed (ZooKeeper first), then close the clients."""
        try:
            for role in ("zookeeper", "coordinators", "tablets"):
                for (killed_role, node_id) in sorted(self.killed):
                    if killed_role == role:
                        self.restart(role, node_id)
        finally:
            if self.zk is not None:
                self.zk.stop()
                self.zk.close()
            self.admin.close()

    def __enter__(self) -> "DrillCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
