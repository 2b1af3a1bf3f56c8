"""The local-cluster launcher behind ``kvlease cluster start|stop|status``.

A local cluster lives in one directory ``D``:

```
D/cluster.json               what runs where: pids, addresses, the remote dir
D/zookeeper/...              ZooKeeper's data and logs (ops.local_cluster.zookeeper)
D/coordinator-{i}/config.toml, coordinator.log, pid
D/tablet-{i}/config.toml, tablet.log, pid, data/   (tablet.id = i)
D/remote/                    remote.data.dir unless --remote names another
D/certs/                     with --secure: a throwaway CA, the nodes' and the clients' certificates
D/secrets.json, D/admin.password   with --secure (0600): the cluster's secrets, the admin's password
```

With ``secure=True`` (:mod:`ops.local_cluster.security`) every process gets
``security.enabled``, mutual TLS (the node certificate), the cluster's own
password and ZooKeeper digest, and the super user ``admin`` in its config;
the ``admin`` user (its password in ``D/admin.password``) is created before the
processes start; cluster.json's ``security`` names the CA, the client
certificate and the admin's credentials, so clients of the directory use TLS
and authenticate as ``admin`` on their own (:func:`client_config`). Config
files are readable by their owner only (they hold those secrets).

Start order: ZooKeeper, the coordinators (until one is active), then the
tablet servers (until every one is registered with the active coordinator).
Stop order is the reverse: tablet servers, coordinators, ZooKeeper. :func:`running`
starts a cluster for a ``with`` block and stops it when the block is left (how
the benchmarks run theirs).

Every process is started detached (its own session) so it outlives the CLI;
``cluster.json`` is written as soon as processes exist, so ``stop`` can clean
up after a start that failed half-way or was interrupted. A pid counts as
running only if it is not a zombie and its start time is the one recorded at
launch (a recycled pid is never signalled).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from common import config as cfg
from common.errors import KvLeaseError
import ops.local_cluster.security as security
import ops.local_cluster.tablet_disks as tablet_disks
from ops.local_cluster.cluster_file import (ZK_ROOT, all_procs, client_config, cluster_file, load, running_pids,
                                            save)
from ops.local_cluster.control import served_buckets
from ops.local_cluster.processes import (ClusterError, Progress, kept_ports, log_tail, proc_start, spawn_server,
                                         terminate)
from ops.local_cluster.zookeeper import ZooKeeperCluster
from ops.wait import poll


def _write_config(path: Path, values: Mapping[str, Any]) -> None:
    """A process's config file, readable by the owner only (a secure cluster's holds its secrets)."""
    security.write_private(path, cfg.to_toml(values))


def _spawn(directory: Path, role: str, index: int, zk_connect: str, remote: str, port: int, metrics_port: int,
           overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Coordinator or tablet server (``role``) ``index``: its config file, then the detached process."""
    module = "coordinator" if role == "coordinators" else "tablet"
    home = directory / f"{module}-{index}"
    home.mkdir(parents=True, exist_ok=True)
    if role == "coordinators":
        own = {cfg.COORDINATOR_HOST.name: "127.0.0.1", cfg.COORDINATOR_PORT.name: port,
               cfg.COORDINATOR_ID.name: str(index)}
    else:
        own = {cfg.TABLET_ID.name: index, cfg.TABLET_HOST.name: "127.0.0.1", cfg.TABLET_PORT.name: port,
               cfg.TABLET_DATA_DIR.name: str(home / "data")}
    values = {**overrides, cfg.ZK_ADDRESS.name: zk_connect, cfg.ZK_ROOT.name: ZK_ROOT, **own,
              cfg.METRICS_PORT.name: metrics_port, cfg.REMOTE_DATA_DIR.name: remote}
    _write_config(home / "config.toml", values)
    proc = spawn_server(home, module, detached=True)
    return {"id": str(index), "pid": proc.pid, "proc_start": proc_start(proc.pid),
            "address": f"127.0.0.1:{port}", "metrics_address": f"127.0.0.1:{metrics_port}",
            "log": str(home / f"{module}.log"), "_popen": proc}


def _tablets_supported(count: int) -> None:
    if count > 0 and importlib.util.find_spec("tablet.__main__") is None:
        raise ClusterError(f"cannot start {count} tablet server(s): tablet servers are not available yet "
                           "(tablet/__main__.py does not exist); use --tablets 0")


def _default_remote(directory: Path) -> str:
    return (directory / "remote").as_uri()


def start(directory: str | os.PathLike[str], *, zk_nodes: int = 1, coordinators: int = 1, tablets: int = 1,
          remote: str | None = None, ready_timeout_s: float = 60.0,
          progress: Progress = lambda text: None,
          config_overrides: Mapping[str, Any] | None = None, secure: bool = False,
          warn: Progress | None = None, tablet_disk: int | str | None = None) -> dict[str, Any]:
    """Start ZooKeeper, the coordinators and the tablet servers in ``directory``; returns the
    cluster.json document.

    Returns once a coordinator is active and serving and every tablet server
    is registered with it. ``config_overrides`` (dotted keys) go into every
    coordinator's and tablet server's config file. On any failure everything
    started here is stopped again and a ClusterError carries the log tails.
    ``secure`` generates certificates in ``directory/certs`` and turns on mutual TLS.

    A stopped cluster started again in its directory keeps its coordinators' and tablet servers' ports
    (those of cluster.json; ZooKeeper's are new, only the cluster's own processes use them); a port
    another process took meanwhile is replaced by a free one, and ``warn`` (default: ``progress``) says so.

    ``tablet_disk`` (bytes, or a size such as ``"64m"``; root only): each tablet server's data dir on a tmpfs
    of that size of its own (:mod:`ops.local_cluster.tablet_disks`), unmounted again if the start fails. A
    stopped cluster whose tablet disks are still mounted keeps them; one whose disks were unmounted cannot be
    started again.
    """
    overrides = _checked_overrides(zk_nodes, coordinators, tablets, config_overrides)
    size_bytes = None if tablet_disk is None else tablet_disks.parse_size(tablet_disk)
    if size_bytes is not None:
        if not tablets:
            raise ClusterError("--tablet-disk gives tablet servers a disk each: it needs --tablets 1 or more")
        tablet_disks.require_root()
    directory = Path(directory).resolve()
    previous = _previous(directory)
    disks = tablet_disks.kept(directory, previous, size_bytes)
    remote = remote or _default_remote(directory)
    _make_private_dirs(directory, remote)
    doc: dict[str, Any] = {"zookeeper": [], "coordinators": [], "tablets": [], "remote": remote,
                           "zk_root": ZK_ROOT, "zookeeper_connect": ""}
    if disks is not None or size_bytes is not None:
        doc[tablet_disks.KEY] = disks or {"size_bytes": size_bytes, "tablets": []}
    if secure:
        secure_overrides, doc["security"] = security.prepare(directory)
        overrides.update(secure_overrides)
    run = _Start(directory, doc, overrides, previous, ready_timeout_s, progress, warn or progress)
    try:
        run.zookeeper(zk_nodes, secure)
        run.coordinators(coordinators)
        if tablets:
            run.tablets(tablets)
        return doc
    except BaseException:
        run.undo()
        raise


def _checked_overrides(zk_nodes: int, coordinators: int, tablets: int,
                       config_overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    if zk_nodes not in (1, 3):
        raise ClusterError(f"--zk-nodes must be 1 or 3, got {zk_nodes}")
    if coordinators < 1:
        raise ClusterError(f"a cluster needs at least one coordinator, got {coordinators}")
    if tablets < 0:
        raise ClusterError(f"--tablets must be 0 or more, got {tablets}")
    _tablets_supported(tablets)
    overrides = dict(config_overrides or {})
    unknown = sorted(set(overrides) - set(cfg.KEYS))
    if unknown:
        raise ClusterError(f"unknown config key(s): {', '.join(unknown)}")
    return overrides


def _previous(directory: Path) -> dict[str, Any]:
    """The cluster.json of a stopped cluster in ``directory`` (empty if none); ClusterError if it runs."""
    if directory.exists() and not directory.is_dir():
        raise ClusterError(f"{directory} exists and is not a directory")
    if not cluster_file(directory).exists():
        return {}
    previous = load(directory)
    running = running_pids(previous)
    if running:
        raise ClusterError(f"a cluster is already running in {directory} (pids "
                           f"{', '.join(map(str, running))}); stop it first: kvlease cluster stop --dir {directory}")
    return previous


def _make_private_dirs(directory: Path, remote: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Owner only: ZooKeeper's data (password hashes), the tablet servers' RocksDB and changelogs and the
        # default remote storage (every row) are files under it, which ACLs cannot guard against local users.
        directory.chmod(0o700)
        if remote.startswith("file://"):
            Path(remote[len("file://"):]).mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, no permission, ...
        raise ClusterError(f"cannot create {exc.filename or directory}: {exc.strerror or exc}") from None


class _Start:
    """One ``start``: its steps in order, each recording what it started in cluster.json; :meth:`undo`."""

    def __init__(self, directory: Path, doc: dict[str, Any], overrides: dict[str, Any], previous: dict[str, Any],
                 ready_timeout_s: float, progress: Progress, warn: Progress) -> None:
        from client.admin import AdminClient

        self.directory, self.doc, self.overrides, self.previous = directory, doc, overrides, previous
        self.timeout_s, self.progress, self.warn = ready_timeout_s, progress, warn
        self.admin_client = functools.partial(AdminClient, config=client_config(doc))
        self.zk: ZooKeeperCluster | None = None
        self.procs: list[subprocess.Popen] = []
        self.mounted: list[Path] = []  # the tablet disks this start mounted

    def zookeeper(self, nodes: int, secure: bool) -> None:
        self.progress(f"starting ZooKeeper ({nodes} node{'s' if nodes > 1 else ''}) in {self.directory / 'zookeeper'}")
        try:
            self.zk = ZooKeeperCluster.start(self.directory / "zookeeper", nodes=nodes, detached=True)
        except KvLeaseError:
            raise
        except Exception as exc:  # the launcher boundary: any failure of the java process
            raise ClusterError(f"ZooKeeper did not start: {exc}") from None
        self.doc["zookeeper_connect"] = self.zk.connect_string
        self.doc["zookeeper"] = [{"id": str(n.id), "pid": n.pid, "proc_start": proc_start(n.pid),
                                  "address": n.address, "log": str(n.log_path)} for n in self.zk.nodes]
        save(self.directory, self.doc)
        if secure:
            self.progress(f"creating the super user {security.ADMIN}")
            security.create_admin(self.directory, self.zk.connect_string, ZK_ROOT, self.overrides)

    def _spawn(self, role: str, count: int, what: str) -> list[subprocess.Popen]:
        self.progress(f"starting {count} {what}{'s' if count > 1 else ''}")
        started = []
        ports = kept_ports(self.previous.get(role, []), count, what, self.warn)
        for i, (port, metrics_port) in enumerate(ports):
            if role == "tablets" and tablet_disks.KEY in self.doc:
                self._tablet_disk(str(i + 1))
            entry = _spawn(self.directory, role, i + 1, self.zk.connect_string, self.doc["remote"], port,
                           metrics_port, self.overrides)
            started.append(entry.pop("_popen"))
            self.procs.append(started[-1])
            self.doc[role].append(entry)
            save(self.directory, self.doc)
        return started

    def _tablet_disk(self, tablet_id: str) -> None:
        """Mount tablet server ``tablet_id``'s small disk (recorded first, so a ``stop`` after an interrupted
        start unmounts it), unless it is still mounted from before."""
        disks = self.doc[tablet_disks.KEY]
        path = tablet_disks.data_dir(self.directory, tablet_id)
        if tablet_id not in disks["tablets"]:
            disks["tablets"].append(tablet_id)
            save(self.directory, self.doc)
        if not os.path.ismount(path):
            self.progress(f"mounting a {tablet_disks.show_size(disks['size_bytes'])} tmpfs on {path}")
            tablet_disks.mount(path, disks["size_bytes"])
            self.mounted.append(path)

    def coordinators(self, count: int) -> None:
        from client.admin import wait_for_active

        procs = self._spawn("coordinators", count, "coordinator")
        self.progress("waiting for an active coordinator")
        _wait_active(self.doc, procs, self.timeout_s, self.admin_client, wait_for_active)

    def tablets(self, count: int) -> None:
        procs = self._spawn("tablets", count, "tablet server")
        self.progress("waiting for the tablet servers to register")
        _wait_tablets(self.doc, procs, self.timeout_s, self.admin_client)
        self.progress("waiting until every bucket has a serving leader")
        _wait_served(self.doc, procs, self.timeout_s)

    def undo(self) -> None:
        """Kill what this start started (ZooKeeper last) and unmount the tablet disks it mounted, whatever
        happens (disks kept from before stay mounted: their rows are there, ``cluster stop`` unmounts them)."""
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            if self.zk is not None:
                try:
                    self.zk.stop()
                except Exception:
                    terminate(all_procs(self.doc, "zookeeper"))
        finally:
            for path in self.mounted:
                problem = tablet_disks.unmount(path)
                if problem:
                    self.warn(problem)


def _wait_active(doc: dict[str, Any], procs: list[subprocess.Popen], timeout_s: float, admin_client,
                 wait_for_active) -> None:
    addresses = [c["address"] for c in doc["coordinators"]]
    deadline = time.monotonic() + timeout_s
    with admin_client(addresses, request_timeout_s=1.0, retry_total_s=0) as client:
        while True:
            if all(proc.poll() is not None for proc in procs):
                codes = ", ".join(str(proc.returncode) for proc in procs)
                raise ClusterError(f"every coordinator exited (exit codes {codes})\n{_logs(doc)}")
            try:
                wait_for_active(client, min(1.0, max(0.1, deadline - time.monotonic())))
                return
            except KvLeaseError:
                if time.monotonic() >= deadline:
                    raise ClusterError(f"no coordinator became active within {timeout_s:.0f}s\n{_logs(doc)}") from None


def _fail_if_tablets_exited(doc: dict[str, Any], procs: list[subprocess.Popen]) -> None:
    dead = [(t, proc.returncode) for t, proc in zip(doc["tablets"], procs) if proc.poll() is not None]
    if dead:
        which = ", ".join(f"{t['id']} (exit code {code})" for t, code in dead)
        raise ClusterError(f"tablet server(s) {which} exited\n{_logs(doc, 'tablets')}")


def _wait_tablets(doc: dict[str, Any], procs: list[subprocess.Popen], timeout_s: float, admin_client) -> None:
    """Until every tablet server of ``doc`` is registered (ListTabletServers of the active coordinator)."""
    wanted = {int(t["id"]) for t in doc["tablets"]}
    addresses = [c["address"] for c in doc["coordinators"]]
    registered: set[int] = set()
    with admin_client(addresses, request_timeout_s=2.0, retry_total_s=0) as client:
        def all_registered() -> bool:
            nonlocal registered
            _fail_if_tablets_exited(doc, procs)
            try:
                registered = {s.id for s in client.list_tablet_servers()}
            except KvLeaseError:
                pass
            return wanted <= registered
        if not poll(all_registered, timeout_s, interval_s=0.2)[1]:
            missing = ", ".join(map(str, sorted(wanted - registered)))
            raise ClusterError(f"tablet server(s) {missing} did not register within {timeout_s:.0f}s\n"
                               f"{_logs(doc, 'tablets')}")


def _wait_served(doc: dict[str, Any], procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Until the leader of every bucket of every table answers for it (a restarted cluster's
    tablet servers register well before they have recovered their buckets)."""
    unserved: list[str] = ["(no answer from a coordinator)"]

    def all_served() -> bool:
        nonlocal unserved
        _fail_if_tablets_exited(doc, procs)
        try:
            unserved = served_buckets(doc)["unserved"]
        except KvLeaseError as exc:
            unserved = [exc.message]
        return not unserved
    if not poll(all_served, timeout_s, interval_s=0.2)[1]:
        shown = "; ".join(unserved[:5]) + (f"; and {len(unserved) - 5} more" if len(unserved) > 5 else "")
        raise ClusterError(f"not every bucket had a serving leader within {timeout_s:.0f}s: {shown}\n"
                           f"{_logs(doc, 'tablets')}")


def _logs(doc: dict[str, Any], role: str = "coordinators") -> str:
    what = "coordinator" if role == "coordinators" else "tablet server"
    return "\n".join(f"--- {what} {c['id']} ({c['log']}) ---\n{log_tail(c['log'])}" for c in doc[role])


def stop(directory: str | os.PathLike[str], timeout_s: float = 10.0) -> dict[str, Any]:
    """Stop the tablet servers, then the coordinators, then ZooKeeper; fine if already stopped. The tablet
    servers' small disks (``--tablet-disk``) are unmounted whatever happens (their rows go with them).

    Returns ``{"stopped": [pids that were running], "pids": [every recorded pid]}``.
    """
    doc = load(directory)
    try:
        stopped = terminate(all_procs(doc, "tablets"), timeout_s)
        stopped += terminate(all_procs(doc, "coordinators"), timeout_s)
        stopped += terminate(all_procs(doc, "zookeeper"), timeout_s)
    finally:
        problems = tablet_disks.unmount_all(directory, doc)
    if problems:
        raise ClusterError("; ".join(problems))
    return {"stopped": stopped, "pids": [pid for pid, _ in all_procs(doc, "coordinators", "tablets", "zookeeper")]}


@contextlib.contextmanager
def running(directory: str | os.PathLike[str], **options: Any) -> Iterator[dict[str, Any]]:
    """A cluster started in ``directory`` (``options`` as for :func:`start`) for the ``with`` block, its
    cluster.json document as the target; stopped when the block is left, also on an error or Ctrl-C. A
    ClusterError while stopping (no cluster.json: the start failed before writing it) is not raised."""
    try:
        yield start(directory, **options)
    finally:
        try:
            stop(directory)
        except ClusterError:
            pass
