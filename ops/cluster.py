"""The local-cluster launcher behind ``kvlease cluster start|stop|status``.

A local cluster lives in one directory ``D``:

```
D/cluster.json               what runs where: pids, addresses, the remote dir
D/zookeeper/...              ZooKeeper's data and logs (ops.zookeeper)
D/coordinator-{i}/config.toml, coordinator.log, pid
D/tablet-{i}/config.toml, tablet.log, pid, data/   (tablet.id = i)
D/remote/                    remote.data.dir unless --remote names another
D/certs/                     with --secure: a throwaway CA, the nodes' and the clients' certificates
D/secrets.json, D/admin.password   with --secure (0600): the cluster's secrets, the admin's password
```

With ``secure=True`` (:mod:`ops.cluster_security`) every process gets
``security.enabled``, mutual TLS (the node certificate), the cluster's own
password and ZooKeeper digest, and the super user ``admin`` in its config;
the ``admin`` user (its password in ``D/admin.password``) is created before the
processes start; cluster.json's ``security`` names the CA, the client
certificate and the admin's credentials, so clients of the directory use TLS
and authenticate as ``admin`` on their own (:func:`client_config`). Config
files are readable by their owner only (they hold those secrets).

Start order: ZooKeeper, the coordinators (until one is active), then the
tablet servers (until every one is registered with the active coordinator).
Stop order is the reverse: tablet servers, coordinators, ZooKeeper.

Every process is started detached (its own session) so it outlives the CLI;
``cluster.json`` is written as soon as processes exist, so ``stop`` can clean
up after a start that failed half-way or was interrupted. A pid counts as
running only if it is not a zombie and its start time is the one recorded at
launch (a recycled pid is never signalled).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from client.cluster_dir import security_settings
from common import config as cfg
from common.errors import KvLeaseError
from ops.tablet_health import status_fields

CLUSTER_FILE = "cluster.json"
ZK_ROOT = "/kvlease"
PROJECT_ROOT = Path(__file__).resolve().parent.parent

Progress = Callable[[str], None]


class ClusterError(KvLeaseError):
    """The local cluster cannot be started, found or stopped; the message says why."""


# -- processes ---------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks)`` from /proc, or None where there is no /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ("X", -1)
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def proc_start(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def pid_alive(pid: int | None, start: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if ``start`` is given, is the process started then."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    if state in ("Z", "X"):
        return False
    return start is None or started == start


def terminate(procs: Iterable[tuple[int, int | None]], timeout_s: float = 10.0) -> list[int]:
    """Stop each running ``(pid, start)`` (SIGTERM, SIGKILL after ``timeout_s``) and wait until gone.

    Only processes whose start time is the recorded one are signalled.
    Returns the pids that were running.
    """
    from ops.zookeeper import stop_pids

    running = [pid for pid, start in procs if pid_alive(pid, start)]
    if running:
        try:
            stop_pids(running, timeout_s)
        except KvLeaseError as exc:
            raise ClusterError(f"cannot stop processes {running}: {exc.message}") from None
    return running


def kept_ports(previous: Iterable[Mapping[str, Any]], count: int, what: str,
               warn: Progress = lambda text: None) -> list[tuple[int, int]]:
    """``(port, metrics port)`` of processes 1..``count``: the ones ``previous`` (the cluster.json entries of a
    stopped cluster) recorded for that id where they are still free, else new free ones (``warn`` says so).

    Every port is held (listening) until all are picked, so no two are the same."""
    recorded = {str(entry["id"]): entry for entry in previous}
    with ExitStack() as stack:
        def hold(port: int) -> int | None:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen()
            except OSError:
                return None
            return sock.getsockname()[1]

        picked = []
        for i in range(1, count + 1):
            pair = []
            for key in ("address", "metrics_address"):
                old = _port_of(recorded.get(str(i), {}).get(key))
                port = hold(old) if old else None
                if old and port is None:
                    port = hold(0)
                    warn(f"{what} {i}: its port {old} is taken now, so it listens on {port} instead "
                         f"({'its address changes' if key == 'address' else 'its metrics address changes'})")
                pair.append(port or hold(0))
            picked.append((pair[0], pair[1]))
        return picked


def _port_of(address: Any) -> int | None:
    try:
        return int(str(address).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held open together, so they differ)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def log_tail(path: str | os.PathLike[str], lines: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16_384))
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# -- cluster.json --------------------------------------------------------------------------


def cluster_file(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CLUSTER_FILE


def load(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The cluster.json document of ``directory``; ClusterError if there is none or it is not one."""
    path = cluster_file(directory)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {directory}: {path} not found "
                           f"(start one with: kvlease cluster start --dir {directory})") from None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from None
    problem = _shape_problem(doc)
    if problem is not None:
        raise ClusterError(f"{path} is not a kvlease cluster file: {problem}")
    return doc


def _shape_problem(doc: Any) -> str | None:
    """What keeps ``doc`` from being a cluster.json (None: nothing): the commands read its lists of
    processes, each with an address and a pid (null once stopped); ``coordinators`` is always there."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if "coordinators" not in doc:
        return "no 'coordinators'"
    for role in ("zookeeper", "coordinators", "tablets"):
        entries = doc.get(role, [])
        if not isinstance(entries, list):
            return f"{role!r} is not a list"
        for entry in entries:
            if not (isinstance(entry, dict) and isinstance(entry.get("address"), str)
                    and (entry.get("pid") is None or type(entry.get("pid")) is int)):
                return f"an entry of {role!r} is not an object with an address and a pid"
    return None


def save(directory: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    path = cluster_file(directory)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def bootstrap(directory: str | os.PathLike[str]) -> list[str]:
    """The coordinator addresses of the cluster in ``directory``."""
    addresses = [c["address"] for c in load(directory).get("coordinators", [])]
    if not addresses:
        raise ClusterError(f"the cluster in {directory} has no coordinators")
    return addresses


def client_config(doc: Mapping[str, Any]) -> cfg.Config:
    """The config a client of this cluster needs: its TLS settings, if it has any (the environment ignored)."""
    return cfg.Config(security_settings(doc), env={})


def _all_procs(doc: dict[str, Any], *roles: str) -> list[tuple[int, int | None]]:
    return [(p["pid"], p.get("proc_start")) for role in roles for p in doc.get(role, []) if p.get("pid")]


def running_pids(doc: dict[str, Any]) -> list[int]:
    return [pid for pid, start in _all_procs(doc, "coordinators", "tablets", "zookeeper") if pid_alive(pid, start)]


# -- start ----------------------------------------------------------------------------------


def _child_env(overridden: Iterable[cfg.Key]) -> dict[str, str]:
    """The environment minus overrides of the keys the launcher sets itself, plus this project on the path."""
    env = dict(os.environ)
    for key in overridden:
        env.pop(key.env_var, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _launch(home: Path, module: str, log_name: str) -> subprocess.Popen:
    """``python -m module --config home/config.toml``, detached, logging to ``home/log_name``."""
    config_path = home / "config.toml"
    env = _child_env(cfg.KEYS[name] for name in cfg.read_file(config_path) if name in cfg.KEYS)
    with open(home / log_name, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, "--config", str(config_path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=str(home), env=env)
    (home / "pid").write_text(f"{proc.pid}\n")
    return proc


def _write_config(path: Path, values: Mapping[str, Any]) -> None:
    """A process's config file, readable by the owner only (a secure cluster's holds its secrets)."""
    from ops.cluster_security import write_private

    write_private(path, cfg.to_toml(values))


def _spawn_coordinator(directory: Path, index: int, zk_connect: str, remote: str, port: int,
                       metrics_port: int, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    home = directory / f"coordinator-{index}"
    home.mkdir(parents=True, exist_ok=True)
    values = {
        **(overrides or {}),
        cfg.ZK_ADDRESS.name: zk_connect,
        cfg.ZK_ROOT.name: ZK_ROOT,
        cfg.COORDINATOR_HOST.name: "127.0.0.1",
        cfg.COORDINATOR_PORT.name: port,
        cfg.COORDINATOR_ID.name: str(index),
        cfg.METRICS_PORT.name: metrics_port,
        cfg.REMOTE_DATA_DIR.name: remote,
    }
    _write_config(home / "config.toml", values)
    proc = _launch(home, "coordinator", "coordinator.log")
    return {"id": str(index), "pid": proc.pid, "proc_start": proc_start(proc.pid),
            "address": f"127.0.0.1:{port}", "metrics_address": f"127.0.0.1:{metrics_port}",
            "log": str(home / "coordinator.log"), "_popen": proc}


def _spawn_tablet(directory: Path, index: int, zk_connect: str, remote: str, port: int, metrics_port: int,
                  overrides: Mapping[str, Any]) -> dict[str, Any]:
    home = directory / f"tablet-{index}"
    home.mkdir(parents=True, exist_ok=True)
    values = {
        **overrides,
        cfg.ZK_ADDRESS.name: zk_connect,
        cfg.ZK_ROOT.name: ZK_ROOT,
        cfg.TABLET_ID.name: index,
        cfg.TABLET_HOST.name: "127.0.0.1",
        cfg.TABLET_PORT.name: port,
        cfg.TABLET_DATA_DIR.name: str(home / "data"),
        cfg.METRICS_PORT.name: metrics_port,
        cfg.REMOTE_DATA_DIR.name: remote,
    }
    _write_config(home / "config.toml", values)
    proc = _launch(home, "tablet", "tablet.log")
    return {"id": str(index), "pid": proc.pid, "proc_start": proc_start(proc.pid),
            "address": f"127.0.0.1:{port}", "metrics_address": f"127.0.0.1:{metrics_port}",
            "log": str(home / "tablet.log"), "_popen": proc}


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
          warn: Progress | None = None) -> dict[str, Any]:
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
    """
    from client.admin import AdminClient, wait_for_active
    from ops.zookeeper import ZooKeeperCluster

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
    directory = Path(directory).resolve()
    if directory.exists() and not directory.is_dir():
        raise ClusterError(f"{directory} exists and is not a directory")
    previous: dict[str, Any] = {}
    if cluster_file(directory).exists():
        previous = load(directory)
        running = running_pids(previous)
        if running:
            raise ClusterError(f"a cluster is already running in {directory} (pids "
                               f"{', '.join(map(str, running))}); stop it first: kvlease cluster stop --dir {directory}")
    remote = remote or _default_remote(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Owner only: ZooKeeper's data (password hashes), the tablet servers' RocksDB and changelogs and the
        # default remote storage (every row) are files under it, which ACLs cannot guard against local users.
        directory.chmod(0o700)
        if remote.startswith("file://"):
            Path(remote[len("file://"):]).mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, no permission, ...
        raise ClusterError(f"cannot create {exc.filename or directory}: {exc.strerror or exc}") from None

    doc: dict[str, Any] = {"zookeeper": [], "coordinators": [], "tablets": [], "remote": remote,
                           "zk_root": ZK_ROOT, "zookeeper_connect": ""}
    if secure:
        from ops import cluster_security

        secure_overrides, doc["security"] = cluster_security.prepare(directory)
        overrides.update(secure_overrides)
    admin_client = functools.partial(AdminClient, config=client_config(doc))
    zk = None
    procs: list[subprocess.Popen] = []
    try:
        progress(f"starting ZooKeeper ({zk_nodes} node{'s' if zk_nodes > 1 else ''}) in {directory / 'zookeeper'}")
        try:
            zk = ZooKeeperCluster.start(directory / "zookeeper", nodes=zk_nodes, detached=True)
        except KvLeaseError:
            raise
        except Exception as exc:  # the launcher boundary: any failure of the java process
            raise ClusterError(f"ZooKeeper did not start: {exc}") from None
        doc["zookeeper_connect"] = zk.connect_string
        doc["zookeeper"] = [{"id": str(n.id), "pid": n.pid, "proc_start": proc_start(n.pid), "address": n.address,
                             "log": str(n.log_path)} for n in zk.nodes]
        save(directory, doc)
        if secure:
            progress(f"creating the super user {cluster_security.ADMIN}")
            cluster_security.create_admin(directory, zk.connect_string, ZK_ROOT, overrides)

        progress(f"starting {coordinators} coordinator{'s' if coordinators > 1 else ''}")
        ports = kept_ports(previous.get("coordinators", []), coordinators, "coordinator", warn or progress)
        for i, (port, metrics_port) in enumerate(ports):
            entry = _spawn_coordinator(directory, i + 1, zk.connect_string, remote, port, metrics_port, overrides)
            procs.append(entry.pop("_popen"))
            doc["coordinators"].append(entry)
            save(directory, doc)

        progress("waiting for an active coordinator")
        _wait_active(doc, procs, ready_timeout_s, admin_client, wait_for_active)

        if tablets:
            progress(f"starting {tablets} tablet server{'s' if tablets > 1 else ''}")
            tablet_procs = []
            ports = kept_ports(previous.get("tablets", []), tablets, "tablet server", warn or progress)
            for i, (port, metrics_port) in enumerate(ports):
                entry = _spawn_tablet(directory, i + 1, zk.connect_string, remote, port, metrics_port, overrides)
                tablet_procs.append(entry.pop("_popen"))
                procs.append(tablet_procs[-1])
                doc["tablets"].append(entry)
                save(directory, doc)
            progress("waiting for the tablet servers to register")
            _wait_tablets(doc, tablet_procs, ready_timeout_s, admin_client)
            progress("waiting until every bucket has a serving leader")
            _wait_served(doc, tablet_procs, ready_timeout_s)
        return doc
    except BaseException:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if zk is not None:
            try:
                zk.stop()
            except Exception:
                terminate(_all_procs(doc, "zookeeper"))
        raise


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
    deadline = time.monotonic() + timeout_s
    registered: set[int] = set()
    with admin_client(addresses, request_timeout_s=2.0, retry_total_s=0) as client:
        while True:
            _fail_if_tablets_exited(doc, procs)
            try:
                registered = {s.id for s in client.list_tablet_servers()}
            except KvLeaseError:
                pass
            if wanted <= registered:
                return
            if time.monotonic() >= deadline:
                missing = ", ".join(map(str, sorted(wanted - registered)))
                raise ClusterError(f"tablet server(s) {missing} did not register within {timeout_s:.0f}s\n"
                                   f"{_logs(doc, 'tablets')}")
            time.sleep(0.2)


def _wait_served(doc: dict[str, Any], procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Until the leader of every bucket of every table answers for it (a restarted cluster's
    tablet servers register well before they have recovered their buckets)."""
    deadline = time.monotonic() + timeout_s
    unserved: list[str] = ["(no answer from a coordinator)"]
    while True:
        _fail_if_tablets_exited(doc, procs)
        try:
            unserved = served_buckets(doc)["unserved"]
        except KvLeaseError as exc:
            unserved = [exc.message]
        if not unserved:
            return
        if time.monotonic() >= deadline:
            shown = "; ".join(unserved[:5]) + (f"; and {len(unserved) - 5} more" if len(unserved) > 5 else "")
            raise ClusterError(f"not every bucket had a serving leader within {timeout_s:.0f}s: {shown}\n"
                               f"{_logs(doc, 'tablets')}")
        time.sleep(0.2)


def _logs(doc: dict[str, Any], role: str = "coordinators") -> str:
    what = "coordinator" if role == "coordinators" else "tablet server"
    return "\n".join(f"--- {what} {c['id']} ({c['log']}) ---\n{log_tail(c['log'])}" for c in doc[role])


# -- stop and status ---------------------------------------------------------------------------


def stop(directory: str | os.PathLike[str], timeout_s: float = 10.0) -> dict[str, Any]:
    """Stop the tablet servers, then the coordinators, then ZooKeeper; fine if already stopped.

    Returns ``{"stopped": [pids that were running], "pids": [every recorded pid]}``.
    """
    doc = load(directory)
    stopped = terminate(_all_procs(doc, "tablets"), timeout_s)
    stopped += terminate(_all_procs(doc, "coordinators"), timeout_s)
    stopped += terminate(_all_procs(doc, "zookeeper"), timeout_s)
    return {"stopped": stopped, "pids": [pid for pid, _ in _all_procs(doc, "coordinators", "tablets", "zookeeper")]}


def status(directory: str | os.PathLike[str], request_timeout_s: float = 2.0) -> dict[str, Any]:
    """Every recorded process, whether it runs, what each coordinator says about itself, and
    how many buckets each tablet server leads (asked of the active coordinator, wherever it
    is in the list) and serves (its health, asked of it: :func:`ops.tablet_health.status_fields`).
    A question that failed is reported under ``error``, never taken as "no"."""
    from client.admin import AdminClient

    doc = load(directory)
    result: dict[str, Any] = {"zookeeper": [], "coordinators": [], "tablets": []}
    for node in doc.get("zookeeper", []):
        result["zookeeper"].append({"id": node["id"], "pid": node["pid"], "address": node["address"],
                                    "alive": pid_alive(node["pid"], node.get("proc_start"))})
    addresses = [c["address"] for c in doc.get("coordinators", [])] or ["127.0.0.1:0"]
    with AdminClient(addresses, client_config(doc), request_timeout_s=request_timeout_s, retry_total_s=0) as client:
        for c in doc.get("coordinators", []):
            alive = pid_alive(c["pid"], c.get("proc_start"))
            entry = {"id": c["id"], "pid": c["pid"], "address": c["address"], "active": False, "epoch": None,
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
                    servers = {str(s.id): s for s in client.list_tablet_servers()}
            except KvLeaseError as exc:
                tablets_error = f"coordinator {active['id']} ({active['address']}): {exc.message}"
    for t, alive in zip(doc.get("tablets", []), tablets_alive):
        entry = {"id": t["id"], "pid": t["pid"], "address": t["address"], "alive": alive, "log": t.get("log")}
        if servers is None:
            entry.update(buckets=None, registered=None, error=tablets_error)
        else:
            server = servers.get(str(t["id"]))
            entry.update(buckets=server.buckets if server else 0, registered=server is not None)
        entry.update(status_fields(t.get("metrics_address"), alive, request_timeout_s))
        result["tablets"].append(entry)
    return result


# -- one process at a time (drills, the demo) ---------------------------------------------------------

ROLES = {"zookeeper": "ZooKeeper node", "coordinators": "coordinator", "tablets": "tablet server"}


def member(doc: Mapping[str, Any], role: str, node_id: str | int) -> dict[str, Any]:
    """The cluster.json entry of ``role`` (``zookeeper``, ``coordinators``, ``tablets``) ``node_id``."""
    if role not in ROLES:
        raise ClusterError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
    for entry in doc.get(role, []):
        if str(entry["id"]) == str(node_id):
            return entry
    raise ClusterError(f"the cluster has no {ROLES[role]} {node_id}")


def kill(directory: str | os.PathLike[str], role: str, node_id: str | int, sig: int = signal.SIGKILL,
         timeout_s: float = 10.0) -> int | None:
    """Send ``sig`` (default: ``kill -9``) to one process and wait until it is gone.

    Returns its pid, or None if it was not running.
    """
    entry = member(load(directory), role, node_id)
    pid, started = entry.get("pid"), entry.get("proc_start")
    if not pid_alive(pid, started):
        return None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return pid
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid, started):
        if time.monotonic() > deadline:
            raise ClusterError(f"{ROLES[role]} {node_id} (pid {pid}) still runs {timeout_s:g}s after signal {sig}")
        time.sleep(0.01)
    return pid


def restart(directory: str | os.PathLike[str], role: str, node_id: str | int,
            ready_timeout_s: float = 60.0, graceful: bool = False) -> dict[str, Any]:
    """Start one process again with its own config, port and data (killed first if it runs:
    ``kill -9``, or with ``graceful`` SIGTERM and SIGKILL only if it is not gone in 10 s).

    Returns once it serves: a ZooKeeper node answers (an ensemble node needs
    a quorum), a coordinator answers CoordinatorInfo, a tablet server is
    registered and every bucket it leads answers. Updates cluster.json.
    """
    from ops.zookeeper import is_serving, node_command

    directory = Path(directory).resolve()
    if graceful:
        running = member(load(directory), role, node_id)
        terminate([(running["pid"], running.get("proc_start"))] if running.get("pid") else [])
    else:
        kill(directory, role, node_id)
    doc = load(directory)
    entry = member(doc, role, node_id)
    if role == "zookeeper":
        node_dir = Path(entry["log"]).parent
        cmd = node_command(str(node_dir / "zoo.cfg"), int(entry["id"]), ensemble=len(doc["zookeeper"]) > 1)
        with open(entry["log"], "ab") as log:
            proc = subprocess.Popen(cmd, cwd=str(node_dir), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
    else:
        module, log_name = ("coordinator", "coordinator.log") if role == "coordinators" else ("tablet", "tablet.log")
        proc = _launch(directory / f"{module}-{entry['id']}", module, log_name)
    entry.update(pid=proc.pid, proc_start=proc_start(proc.pid))
    save(directory, doc)

    port = int(entry["address"].rsplit(":", 1)[1])
    what = f"{ROLES[role]} {node_id}"
    deadline = time.monotonic() + ready_timeout_s
    while True:
        if proc.poll() is not None:
            raise ClusterError(f"{what} exited with code {proc.returncode} after a restart\n"
                               f"--- {entry['log']} ---\n{log_tail(entry['log'])}")
        if role == "zookeeper":
            ready = is_serving(port)
        elif role == "coordinators":
            ready = _answers(doc, entry["address"])
        else:
            ready = _tablet_serving(doc, str(entry["id"]))
        if ready:
            return entry
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} did not serve within {ready_timeout_s:g}s of a restart\n"
                               f"--- {entry['log']} ---\n{log_tail(entry['log'])}")
        time.sleep(0.1)


def _answers(doc: Mapping[str, Any], address: str) -> bool:
    from client.admin import AdminClient

    with AdminClient([address], client_config(doc), request_timeout_s=1.0, retry_total_s=0) as client:
        try:
            client.coordinator_info(address)
            return True
        except KvLeaseError:
            return False


def _tablet_serving(doc: Mapping[str, Any], tablet_id: str) -> bool:
    try:
        served = served_buckets(doc)
    except KvLeaseError:
        return False
    return served.get("registered", set()) >= {tablet_id} and not served["unserved"]


def active_coordinator(directory: str | os.PathLike[str], timeout_s: float = 30.0) -> dict[str, Any]:
    """The cluster.json entry of the active coordinator, waiting up to ``timeout_s`` for one."""
    from client.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    while True:
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
        if time.monotonic() > deadline:
            raise ClusterError(f"no coordinator of the cluster in {directory} became active within {timeout_s:g}s")
        time.sleep(0.1)


def zk_leader(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ZooKeeper node that says it leads the ensemble (None for a standalone node or no leader)."""
    from ops.zookeeper import server_mode

    for node in load(directory).get("zookeeper", []):
        if server_mode(int(node["address"].rsplit(":", 1)[1])) == "leader":
            return node
    return None


def served_buckets(doc: Mapping[str, Any], request_timeout_s: float = 2.0) -> dict[str, Any]:
    """``{"registered": {tablet ids}, "buckets": n, "unserved": ["db.t/3: why", …]}``.

    A bucket is served when the tablet server its leader is answers for it
    (ListOffsets); that is what "ready" means. Raises a KvLeaseError when no
    coordinator answers.
    """
    from client.admin import AdminClient
    from client.table import TableClient

    addresses = [c["address"] for c in doc["coordinators"]]
    with AdminClient(addresses, client_config(doc), request_timeout_s=request_timeout_s,
                     retry_total_s=request_timeout_s) as admin:
        registered = {str(s.id) for s in admin.list_tablet_servers()}
        unserved, count = [], 0
        for table in admin.list_tables():
            count += table.buckets
            with TableClient(admin, table.table_id, retry_total_s=0, request_timeout_s=request_timeout_s) as client:
                for bucket in range(table.buckets):
                    try:
                        client.list_offsets([bucket])
                    except KvLeaseError as exc:
                        unserved.append(f"{table.path}/{bucket}: {exc.message}")
    return {"registered": registered, "buckets": count, "unserved": unserved}
