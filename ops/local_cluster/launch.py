"""The local-cluster launcher behind ``kvlease cluster start|stop|status``.

A local cluster lives in one directory ``D``:

```
D/cluster.json               what runs where: pids, addresses, the remote dir, --set settings (written once
                             a start serves)
D/cluster.starting.json      while a start runs: what it launched so far (ops.local_cluster.cluster_file)
D/cluster.json.lock          the lock every change of cluster.json holds
D/zookeeper/...              ZooKeeper's data and logs (ops.local_cluster.zookeeper)
D/coordinator-{i}/config.toml, coordinator.log, pid
D/tablet-{i}/config.toml, tablet.log, pid, data/   (tablet.id = i)
D/remote/                    remote.data.dir unless --remote names another
D/certs/                     with --secure: a throwaway CA, the nodes' and the clients' certificates
D/secrets.json, D/admin.password   with --secure (0600): the cluster's secrets, the admin's password
```

With ``secure=True`` (:mod:`kvlease.ops.local_cluster.security`) every process gets
``security.enabled``, mutual TLS (the node certificate), the cluster's own
password and ZooKeeper digest, and the super user ``admin`` in its config;
the ``admin`` user (its password in ``D/admin.password``) is created before the
processes start; cluster.json's ``security`` names the CA, the client
certificate and the admin's credentials, so clients of the directory use TLS
and authenticate as ``admin`` on their own (:func:`client_config`). Config
files are readable by their owner only (they hold those secrets).

Start order: ZooKeeper, the coordinators (until one is active), then the
tablet servers (until every one is registered with the active coordinator and
every bucket is served: :mod:`kvlease.ops.local_cluster.start_waits`). A stopped
cluster starts again in the shape its cluster.json records
(:mod:`kvlease.ops.local_cluster.shape`).
Stop order is the reverse: tablet servers, coordinators, ZooKeeper. :func:`running`
starts a cluster for a ``with`` block and stops it when the block is left (how
the benchmarks run theirs).

Every process is started detached (its own session) so it outlives the CLI;
the start's record (``cluster.starting.json``) is written as soon as processes
exist, so ``stop`` can clean up after a start that was killed half-way, and
``cluster.json`` only once the cluster serves: a start that fails stops what it
started and leaves ``cluster.json`` as it was (the next start keeps its ports
and shape). A pid counts as
running only if it is not a zombie and its start time is the one recorded at
launch (a recycled pid is never signalled).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator, Mapping

from kvlease.common import config as cfg
from kvlease.common.errors import KvLeaseError
import kvlease.ops.local_cluster.security as security
import kvlease.ops.local_cluster.settings as settings
import kvlease.ops.local_cluster.tablet_disks as tablet_disks
from kvlease.ops.local_cluster.cluster_file import (ZK_ROOT, abandon_start, begin_start, client_config,
                                                    cluster_file, finish_start, load, load_starting, record_start,
                                                    recorded_procs, running_pids, starting_file)
from kvlease.ops.local_cluster.processes import (ClusterError, Progress, free_ports, kept_ports, proc_start,
                                                spawn_server, terminate)
from kvlease.ops.local_cluster.shape import Shape, resolve as resolve_shape
from kvlease.ops.local_cluster.start_waits import wait_active, wait_served, wait_tablets
from kvlease.ops.local_cluster.zookeeper import ZooKeeperCluster, ZooKeeperError


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
    log = home / f"{module}.log"
    log_from = log.stat().st_size if log.exists() else 0  # what this process writes comes after
    proc = spawn_server(home, module, detached=True)
    return {"id": str(index), "pid": proc.pid, "proc_start": proc_start(proc.pid),
            "address": f"127.0.0.1:{port}", "metrics_address": f"127.0.0.1:{metrics_port}",
            "log": str(log), "_popen": proc, "_log_from": log_from}


#: Times one process is started again on new ports after losing the race for its port.
PORT_RETRIES = 3
_ROLE_NAMES = {"coordinators": "coordinator", "tablets": "tablet server"}


def _lost_its_port(log: Path, start: int, address: str) -> bool:
    """The part of ``log`` written since ``start`` (its size when the process was launched) says the process
    could not listen on ``address`` (common/tls.py ``add_port``'s message)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(start)
            written = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return False
    return f"cannot listen on {address} " in written


def _tablets_supported(count: int) -> None:
    if count > 0 and importlib.util.find_spec("kvlease.tablet.__main__") is None:
        raise ClusterError(f"cannot start {count} tablet server(s): tablet servers are not available yet "
                           "(tablet/__main__.py does not exist); use --tablets 0")


def _default_remote(directory: Path) -> str:
    return (directory / "remote").as_uri()


def start(directory: str | os.PathLike[str], *, zk_nodes: int | None = None, coordinators: int | None = None,
          tablets: int | None = None, remote: str | None = None, ready_timeout_s: float = 60.0,
          progress: Progress = lambda text: None,
          config_overrides: Mapping[str, Any] | None = None, secure: bool | None = None,
          warn: Progress | None = None, tablet_disk: int | str | None = None) -> dict[str, Any]:
    """Start ZooKeeper, the coordinators and the tablet servers in ``directory``; returns the
    cluster.json document.

    Returns once a coordinator is active and serving, every tablet server is registered with it and every
    bucket is served, but those that wait on an operator (their data was lost: ``warn`` names each). The shape
    (``zk_nodes``, ``coordinators``, ``tablets``, ``remote``, ``secure``) left out (None) is a stopped cluster's
    own, as its cluster.json records it (a new directory: 1, 1, 1, ``directory/remote``, no security); given, it
    must be that one, or ClusterError names what differs before anything starts (:mod:`.shape`).
    ``config_overrides`` (dotted keys, checked: :mod:`kvlease.ops.local_cluster.settings`) go into every
    coordinator's and tablet server's config file, with those a stopped cluster's cluster.json records (a key
    given replaces its recorded value), and are recorded for later starts (``settings``). On any
    failure everything started here is stopped again, cluster.json is left as it was, and a ClusterError
    names the process that failed and its log file. ``secure`` generates certificates in ``directory/certs``
    and turns on mutual TLS.

    A stopped cluster started again in its directory keeps its coordinators' and tablet servers' ports
    (those of cluster.json; ZooKeeper's are new, only the cluster's own processes use them); a port
    another process took meanwhile is replaced by a free one, and ``warn`` (default: ``progress``) says so;
    so is the port of a server that exits because another process bound it as the server started.

    ``tablet_disk`` (bytes, or a size such as ``"64m"``; root only): each tablet server's data dir on a tmpfs
    of that size of its own (:mod:`kvlease.ops.local_cluster.tablet_disks`), unmounted again if the start fails. A
    stopped cluster whose tablet disks are still mounted keeps them; one whose disks were unmounted cannot be
    started again.
    """
    directory = Path(directory).resolve()
    previous = _previous(directory)
    shape = resolve_shape(directory, previous, _default_remote(directory), zk_nodes=zk_nodes,
                          coordinators=coordinators, tablets=tablets, remote=remote, secure=secure)
    overrides = _checked_overrides(shape, settings.merged(previous, config_overrides))
    size_bytes = None if tablet_disk is None else tablet_disks.parse_size(tablet_disk)
    if size_bytes is not None:
        if not shape.tablets:
            raise ClusterError("--tablet-disk gives tablet servers a disk each: it needs --tablets 1 or more")
        tablet_disks.require_root()
    disks = tablet_disks.kept(directory, previous, size_bytes)
    _make_private_dirs(directory, shape.remote)
    if disks is None and size_bytes is not None:
        disks = {"size_bytes": size_bytes, "tablets": []}
    doc = _new_doc(directory, shape, disks, overrides)
    begin_start(directory, doc)
    run = _Start(directory, doc, overrides, previous, ready_timeout_s, progress, warn or progress)
    try:
        run.zookeeper(shape.zk_nodes, shape.secure)
        run.coordinators(shape.coordinators)
        if shape.tablets:
            run.tablets(shape.tablets)
        finish_start(directory, doc)
        return doc
    except BaseException:
        try:
            run.undo()
        finally:
            abandon_start(directory)
        raise


def _new_doc(directory: Path, shape: Shape, disks: dict[str, Any] | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The cluster.json document a start fills in (``disks``: its tablet disks, if any; ``settings``: the
    ``overrides`` given, before security's); with security on, the certificates and secrets made first and
    their keys added to ``overrides``."""
    doc: dict[str, Any] = {"zookeeper": [], "coordinators": [], "tablets": [], "remote": shape.remote,
                           "zk_root": ZK_ROOT, "zookeeper_connect": "", settings.KEY: dict(overrides)}
    if disks is not None:
        doc[tablet_disks.KEY] = disks
    if shape.secure:
        secure_overrides, doc["security"] = security.prepare(directory)
        overrides.update(secure_overrides)
    return doc


def _checked_overrides(shape: Shape, config_overrides: Mapping[str, Any]) -> dict[str, Any]:
    if shape.zk_nodes not in (1, 3):
        raise ClusterError(f"--zk-nodes must be 1 or 3, got {shape.zk_nodes}")
    if shape.coordinators < 1:
        raise ClusterError(f"a cluster needs at least one coordinator, got {shape.coordinators}")
    if shape.tablets < 0:
        raise ClusterError(f"--tablets must be 0 or more, got {shape.tablets}")
    _tablets_supported(shape.tablets)
    return dict(config_overrides)


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
    """One ``start``: its steps in order, each recording what it started in the start's record
    (``cluster.starting.json``: :func:`~kvlease.ops.local_cluster.cluster_file.record_start`); :meth:`undo`."""

    def __init__(self, directory: Path, doc: dict[str, Any], overrides: dict[str, Any], previous: dict[str, Any],
                 ready_timeout_s: float, progress: Progress, warn: Progress) -> None:
        from kvlease.client.admin import AdminClient

        self.directory, self.doc, self.overrides, self.previous = directory, doc, overrides, previous
        self.timeout_s, self.progress, self.warn = ready_timeout_s, progress, warn
        self.admin_client = functools.partial(AdminClient, config=client_config(doc))
        self.zk: ZooKeeperCluster | None = None
        self.procs: list[subprocess.Popen] = []
        self.mounted: list[Path] = []  # the tablet disks this start mounted
        self.log_starts: dict[tuple[str, int], int] = {}  # (role, index) -> its log's size at its launch
        self.relaunches: dict[tuple[str, int], int] = {}
        self.examined: set[int] = set()  # pids of exited processes whose log was read (once is enough)

    def zookeeper(self, nodes: int, secure: bool) -> None:
        self.progress(f"starting ZooKeeper ({nodes} node{'s' if nodes > 1 else ''}) in {self.directory / 'zookeeper'}")
        try:
            self.zk = ZooKeeperCluster.start(self.directory / "zookeeper", nodes=nodes, detached=True)
        except ZooKeeperError as exc:  # its reason and log file, not the log's last lines
            log = f"; its log: {exc.details['log_path']}" if exc.details.get("log_path") else ""
            raise ClusterError(f"ZooKeeper did not start: {exc.details.get('reason', exc.message)}{log}") from None
        except KvLeaseError:
            raise
        except Exception as exc:  # the launcher boundary: any failure of the java process
            raise ClusterError(f"ZooKeeper did not start: {exc}") from None
        self.doc["zookeeper_connect"] = self.zk.connect_string
        self.doc["zookeeper"] = [{"id": str(n.id), "pid": n.pid, "proc_start": proc_start(n.pid),
                                  "address": n.address, "log": str(n.log_path)} for n in self.zk.nodes]
        record_start(self.directory, self.doc)
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
            self.doc[role].append({})
            started.append(self._launch(role, i, port, metrics_port))
        return started

    def _launch(self, role: str, i: int, port: int, metrics_port: int) -> subprocess.Popen:
        """Start process ``i`` of ``role`` on ``port``, recorded as ``doc[role][i]`` (and in the start's record)."""
        entry = _spawn(self.directory, role, i + 1, self.zk.connect_string, self.doc["remote"], port,
                       metrics_port, self.overrides)
        self.log_starts[(role, i)] = entry.pop("_log_from")
        proc = entry.pop("_popen")
        self.procs.append(proc)
        self.doc[role][i] = entry
        record_start(self.directory, self.doc)
        return proc

    def relaunch_port_losers(self, role: str, procs: list[subprocess.Popen]) -> None:
        """Start again, on new ports, each process of ``procs`` that exited because another process took its
        port between the start picking it and the process binding it (its log says it cannot listen there):
        the race ZooKeeper's start also retries. At most :data:`PORT_RETRIES` times each."""
        for i, proc in enumerate(procs):
            if proc.poll() is None or proc.pid in self.examined or self.relaunches.get((role, i), 0) >= PORT_RETRIES:
                continue
            self.examined.add(proc.pid)
            entry = self.doc[role][i]
            if not _lost_its_port(Path(entry["log"]), self.log_starts[(role, i)], entry["address"]):
                continue
            self.relaunches[(role, i)] = self.relaunches.get((role, i), 0) + 1
            port, metrics_port = free_ports(2)
            self.warn(f"{_ROLE_NAMES[role]} {i + 1}: its port {entry['address'].rsplit(':', 1)[1]} was taken as it "
                      f"started, so it starts again on {port} (its address changes)")
            procs[i] = self._launch(role, i, port, metrics_port)

    def _tablet_disk(self, tablet_id: str) -> None:
        """Mount tablet server ``tablet_id``'s small disk (recorded first, so a ``stop`` after an interrupted
        start unmounts it), unless it is still mounted from before."""
        disks = self.doc[tablet_disks.KEY]
        path = tablet_disks.data_dir(self.directory, tablet_id)
        if tablet_id not in disks["tablets"]:
            disks["tablets"].append(tablet_id)
            record_start(self.directory, self.doc)
        if not os.path.ismount(path):
            self.progress(f"mounting a {tablet_disks.show_size(disks['size_bytes'])} tmpfs on {path}")
            tablet_disks.mount(path, disks["size_bytes"])
            self.mounted.append(path)

    def coordinators(self, count: int) -> None:
        from kvlease.client.admin import wait_for_active

        procs = self._spawn("coordinators", count, "coordinator")
        self.progress("waiting for an active coordinator")
        wait_active(self.doc, procs, self.timeout_s, self.admin_client, wait_for_active,
                    functools.partial(self.relaunch_port_losers, "coordinators"))

    def tablets(self, count: int) -> None:
        procs = self._spawn("tablets", count, "tablet server")
        self.progress("waiting for the tablet servers to register")
        wait_tablets(self.doc, procs, self.timeout_s, self.admin_client,
                     functools.partial(self.relaunch_port_losers, "tablets"))
        self.progress("waiting until every bucket has a serving leader")
        wait_served(self.doc, procs, self.timeout_s, self.warn)

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
                    terminate(recorded_procs(self.doc, "zookeeper"))
        finally:
            for path in self.mounted:
                problem = tablet_disks.unmount(path)
                if problem:
                    self.warn(problem)


def stop(directory: str | os.PathLike[str], timeout_s: float = 10.0) -> dict[str, Any]:
    """Stop the tablet servers, then the coordinators, then ZooKeeper; fine if already stopped. The tablet
    servers' small disks (``--tablet-disk``) are unmounted whatever happens (their rows go with them). The
    processes of a start killed half-way (its record, ``cluster.starting.json``) are stopped too, and the
    record goes.

    Returns ``{"stopped": [pids that were running], "pids": [every recorded pid]}``.
    """
    starting = load_starting(directory)
    docs = [load(directory)] if cluster_file(directory).exists() or starting is None else []
    docs += [starting] if starting is not None else []
    try:
        stopped = [pid for role in ("tablets", "coordinators", "zookeeper")
                   for pid in terminate([p for doc in docs for p in recorded_procs(doc, role)], timeout_s)]
    finally:
        problems = [problem for doc in docs for problem in tablet_disks.unmount_all(directory, doc)]
    if starting is not None and not running_pids(starting):
        starting_file(directory).unlink(missing_ok=True)
    if problems:
        raise ClusterError("; ".join(problems))
    return {"stopped": stopped,
            "pids": [pid for doc in docs for pid, _ in recorded_procs(doc, "coordinators", "tablets", "zookeeper")]}


@contextlib.contextmanager
def running(directory: str | os.PathLike[str], **options: Any) -> Iterator[dict[str, Any]]:
    """A cluster started in ``directory`` (``options`` as for :func:`start`) for the ``with`` block, its
    cluster.json document as the target; stopped when the block is left, also on an error or Ctrl-C. A
    ClusterError while stopping (no cluster.json: the start failed, and wrote none) is not raised."""
    try:
        yield start(directory, **options)
    finally:
        try:
            stop(directory)
        except ClusterError:
            pass
