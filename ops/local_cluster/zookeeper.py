"""Run real Apache ZooKeeper servers (the Debian ``zookeeper`` jars) on loopback.

One node runs ``ZooKeeperServerMain`` (serving clients through Netty: see
``_STANDALONE_FLAGS``); three (or any N > 1) run ``QuorumPeerMain`` with
``myid`` files and ``server.N`` lines. Each node lives
in ``{base_dir}/zk-{id}/`` (``zoo.cfg``, ``data/``, ``zookeeper.log``) on free
loopback ports.

Two lifetimes:

- attached (``detached=False``, tests): every JVM gets ``PR_SET_PDEATHSIG``
  so it dies with the process that started it, even after ``kill -9``, and an
  ``atexit`` hook stops what is left. The death signal follows the *thread*
  that started the JVM: start clusters from a thread that outlives them
  (pytest's main thread does).
- detached (``kvlease cluster start``): the JVMs get their own session and
  outlive the launcher; another process stops them with :func:`kvlease.ops.local_cluster.processes.stop_pids`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from typing import Iterable

from kvlease.common.errors import KvLeaseError
from kvlease.ops.local_cluster.processes import dying_with_parent, free_ports, holds_port, log_tail
from kvlease.ops.wait import poll

JAR_DIR = os.environ.get("KVLEASE_ZK_JAR_DIR", "/usr/share/java")
DEFAULT_JAVA_HOME = "/usr/lib/jvm/java-17-openjdk-amd64"
STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
MAIN_CLASSES = (STANDALONE_MAIN, QUORUM_MAIN)

# zookeeper.jar's manifest Class-Path names most of its dependencies; these are
# the ones it leaves out (netty pieces the quorum code loads, a slf4j binding).
_JARS = (
    "zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar",
    "netty-buffer.jar", "netty-codec.jar", "netty-common.jar", "netty-handler.jar",
    "netty-resolver.jar", "netty-transport.jar", "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar", "metrics-core.jar", "snappy-java.jar",
    "commons-cli.jar", "commons-io.jar",
)

_JVM_FLAGS = (
    "-Xmx256m", "-Xms32m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",  # no /tmp/hsperfdata_* files left behind by kill -9
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
)

#: A standalone node serves clients through Netty. With ZooKeeper 3.8.0's default (NIO), a client that
#: connects in the instant between the node opening its port and loading its data is neither answered
#: nor disconnected (closing it fails on the data not loaded yet): kazoo then waits its whole session
#: timeout, and the session expires, whenever a client reconnects to a node that is starting again.
#: Netty closes such a connection and the client retries at once. A quorum peer has its data loaded
#: before it serves a client, and starts faster with NIO.
_STANDALONE_FLAGS = ("-Dzookeeper.serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",)

_BIND_FAILED = "Address already in use"


class ZooKeeperError(KvLeaseError):
    """A ZooKeeper node could not be started; the message carries its log tail, ``details["reason"]`` the
    one line without it and ``details["log_path"]`` its log file."""


class _PortTaken(ZooKeeperError):
    """A node lost the race for one of its ports; start() retries on new ports."""


@dataclass
class ZooKeeperNode:
    id: int
    client_port: int
    address: str  # "127.0.0.1:PORT"
    pid: int
    data_dir: str
    log_path: str


def java_binary() -> str:
    """``$JAVA_HOME/bin/java``, else the Debian Java 17, else ``java`` on PATH."""
    for home in (os.environ.get("JAVA_HOME"), DEFAULT_JAVA_HOME):
        if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
            return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if not found:
        raise ZooKeeperError("no java found: set JAVA_HOME or run ops/install_system_deps.sh")
    return found


def classpath() -> str:
    if not os.path.isfile(os.path.join(JAR_DIR, "zookeeper.jar")):
        raise ZooKeeperError(f"{JAR_DIR}/zookeeper.jar not found: run ops/install_system_deps.sh "
                             "(installs the Debian `zookeeper` package)")
    return ":".join(os.path.join(JAR_DIR, jar) for jar in _JARS if os.path.isfile(os.path.join(JAR_DIR, jar)))


def four_letter(port: int, command: str = "srvr", timeout_s: float = 1.0) -> str | None:
    """The answer of a four-letter-word command, or None if the node does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(command.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


def is_serving(port: int) -> bool:
    """Whether the node on ``port`` serves requests (standalone, leader or follower)."""
    answer = four_letter(port)
    return answer is not None and "Mode: " in answer


def node_command(cfg_path: str, node_id: int, *, ensemble: bool) -> list[str]:
    """The java command line of ZooKeeper node ``node_id`` with the config file ``cfg_path``."""
    main, flags = (QUORUM_MAIN, ()) if ensemble else (STANDALONE_MAIN, _STANDALONE_FLAGS)
    return [java_binary(), *_JVM_FLAGS, *flags, f"-Dkvlease.zk.node={node_id}", "-cp", classpath(), main, cfg_path]


def server_mode(port: int) -> str | None:
    """``leader``, ``follower`` or ``standalone`` as the node on ``port`` reports it; None if it does not answer."""
    text = four_letter(port, "srvr")
    for line in (text or "").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


class ZooKeeperCluster:
    """A running standalone server or ensemble; ``with`` stops it on exit."""

    def __init__(self, base_dir: str, count: int, detached: bool) -> None:
        self.base_dir = os.path.abspath(base_dir)
        self.detached = detached
        self.ready_timeout_s = 30.0
        self._procs: list[subprocess.Popen | None] = [None] * count
        self._log_starts = [0] * count  # where each node's current run begins in its log
        self._lock = threading.Lock()
        ports = free_ports(3 * count)
        self._quorum_ports = [(ports[3 * i + 1], ports[3 * i + 2]) for i in range(count)]
        self.nodes: list[ZooKeeperNode] = []
        for i in range(count):
            node_dir = os.path.join(self.base_dir, f"zk-{i + 1}")
            self.nodes.append(ZooKeeperNode(
                id=i + 1, client_port=ports[3 * i], address=f"127.0.0.1:{ports[3 * i]}", pid=0,
                data_dir=os.path.join(node_dir, "data"), log_path=os.path.join(node_dir, "zookeeper.log")))
        self.connect_string = ",".join(node.address for node in self.nodes)

    # --- lifecycle -------------------------------------------------------------

    @classmethod
    def start(cls, base_dir: str, nodes: int = 1, *, detached: bool = False,
              ready_timeout_s: float = 30.0) -> "ZooKeeperCluster":
        """Start ``nodes`` servers and wait until every one serves requests.

        Raises ZooKeeperError (with the log tail) on failure; then no process
        of this cluster is left running.
        """
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        for attempt in range(3):
            cluster = cls(base_dir, nodes, detached)
            cluster.ready_timeout_s = ready_timeout_s
            try:
                for index in range(nodes):
                    cluster._launch(index)
                cluster._wait_serving(range(nodes), ready_timeout_s)
                return cluster
            except _PortTaken:
                cluster.stop()
                if attempt == 2:
                    raise
            except BaseException:
                cluster.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGKILL every node and reap it. Idempotent."""
        with self._lock:
            for index in range(len(self.nodes)):
                self._kill_locked(index)
        _LIVE.discard(self)

    def kill(self, index: int) -> None:
        """``kill -9`` node ``index`` (0-based) and reap it; its data stays."""
        with self._lock:
            self._kill_locked(index)

    def restart(self, index: int, *, wait: bool = True, ready_timeout_s: float | None = None) -> None:
        """Start node ``index`` again on the same ports and data (killing it first if alive).

        With ``wait`` it returns once the node serves, which for an ensemble
        needs a quorum of live nodes.
        """
        self.kill(index)
        self._launch(index)
        if wait:
            self._wait_serving([index], self.ready_timeout_s if ready_timeout_s is None else ready_timeout_s)

    def alive(self, index: int) -> bool:
        proc = self._procs[index]
        return proc is not None and proc.poll() is None

    def serving(self, index: int) -> bool:
        return self.alive(index) and is_serving(self.nodes[index].client_port)

    def log_tail(self, lines: int = 200) -> str:
        """The last ``lines`` lines of every node's log, each under a header."""
        return "\n".join(f"==> zookeeper node {node.id} ({node.log_path}) <==\n{log_tail(node.log_path, lines)}"
                         for node in self.nodes)

    def __enter__(self) -> "ZooKeeperCluster":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperCluster({self.connect_string!r}, pids={[n.pid for n in self.nodes]})"

    # --- internals ---------------------------------------------------------------

    def _write_config(self, index: int) -> str:
        node = self.nodes[index]
        node_dir = os.path.dirname(node.log_path)
        os.makedirs(node.data_dir, exist_ok=True)
        lines = [
            "tickTime=500", "initLimit=20", "syncLimit=10",
            f"dataDir={node.data_dir}",
            f"clientPort={node.client_port}", "clientPortAddress=127.0.0.1",
            "admin.enableServer=false", "4lw.commands.whitelist=srvr,ruok",  # health only, not dump/cons/wchc
            "minSessionTimeout=1000", "maxSessionTimeout=60000",
            "maxClientCnxns=0", "preAllocSize=4096",
        ]
        if len(self.nodes) > 1:
            lines.append("reconfigEnabled=false")
            for other, (peer, election) in zip(self.nodes, self._quorum_ports):
                lines.append(f"server.{other.id}=127.0.0.1:{peer}:{election}")
            with open(os.path.join(node.data_dir, "myid"), "w") as fh:
                fh.write(f"{node.id}\n")
        path = os.path.join(node_dir, "zoo.cfg")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        return path

    def _launch(self, index: int) -> None:
        node = self.nodes[index]
        cfg_path = self._write_config(index)
        cmd = node_command(cfg_path, node.id, ensemble=len(self.nodes) > 1)
        with open(node.log_path, "ab") as log:
            self._log_starts[index] = log.tell()
            log.write(f"--- kvlease: starting node {node.id}: {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd if self.detached else dying_with_parent(cmd), cwd=os.path.dirname(node.log_path),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                start_new_session=self.detached)
        with self._lock:
            self._procs[index] = proc
            node.pid = proc.pid
        if not self.detached:
            _LIVE.add(self)

    def _wait_serving(self, indexes: Iterable[int], timeout_s: float) -> None:
        waiting = list(indexes)

        def all_serving() -> bool:
            for index in list(waiting):
                proc = self._procs[index]
                if proc is None or proc.poll() is not None:
                    self._fail(index, "exited during startup"
                               + (f" with code {proc.returncode}" if proc is not None else ""))
                port = self.nodes[index].client_port
                if is_serving(port) and holds_port(proc.pid, port):  # ours: not a node that took the port first
                    waiting.remove(index)
            return not waiting
        if not poll(all_serving, timeout_s, interval_s=0.1)[1]:
            self._fail(waiting[0], f"did not serve requests within {timeout_s:g}s")

    def _fail(self, index: int, what: str) -> None:
        node = self.nodes[index]
        tail = log_tail(node.log_path, 60)
        try:
            with open(node.log_path, "rb") as fh:
                fh.seek(self._log_starts[index])
                this_run = fh.read().decode(errors="replace")
        except OSError:
            this_run = ""
        error = _PortTaken if _BIND_FAILED in this_run else ZooKeeperError
        reason = f"zookeeper node {node.id} ({node.address}) {what}"
        raise error(f"{reason}; last log lines of {node.log_path}:\n{tail}", node=node.id, log_path=node.log_path,
                    reason=reason)

    def _kill_locked(self, index: int) -> None:
        proc = self._procs[index]
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # unkillable (D state): nothing more we can do
            pass
        self._procs[index] = None


_LIVE: set[ZooKeeperCluster] = set()


@atexit.register
def _stop_attached_clusters() -> None:
    for cluster in list(_LIVE):
        if not cluster.detached:
            cluster.stop()


