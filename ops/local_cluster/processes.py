"""Local server processes: one way to spawn one, to tell whether a recorded pid still runs, to stop them.

:func:`spawn_server` starts ``python -m MODULE --config HOME/config.toml`` (a
coordinator or a tablet server) logging to ``HOME/<module>.log``: detached (its
own session, it outlives the caller: ``kvlease cluster start``) or dying with
the thread that started it (tests, benchmarks). :class:`ServerProcess` is one
such process with ``kill``/``stop``/``log_tail``. :func:`terminate` and
:func:`stop_pids` stop processes started elsewhere, recorded by pid (and start
time: :func:`pid_alive` and :func:`proc_start`, which live with the client,
``client/cluster_dir.py``, since a client tells a stopped cluster by them).
:func:`free_ports`, :func:`holds_port` and :func:`log_tail` are the one copy of each.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from kvlease.client.cluster_dir import pid_alive, proc_start
from kvlease.common import config as cfg
from kvlease.common.errors import KvLeaseError
from kvlease.ops.wait import poll

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent

Progress = Callable[[str], None]


class ClusterError(KvLeaseError):
    """The local cluster cannot be started, found or stopped; the message says why."""


# -- processes ---------------------------------------------------------------------------


def terminate(procs: Iterable[tuple[int, int | None]], timeout_s: float = 10.0) -> list[int]:
    """Stop each running ``(pid, start)`` (SIGTERM, SIGKILL after ``timeout_s``) and wait until gone.

    Only processes whose start time is the recorded one are signalled.
    Returns the pids that were running.
    """
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
            return _hold(stack, port) if port else _hold_free(stack)

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
    """``count`` distinct free loopback ports (held open together, so they differ), for servers started later.

    They are picked below the kernel's ephemeral range (``ip_local_port_range``): a port from that range
    may be handed to any other socket (a client's outgoing connection, a ``bind`` to port 0) in the time
    between picking it and the server binding it, and the server would then fail to start."""
    with ExitStack() as stack:
        return [_hold_free(stack) for _ in range(count)]


def holds_port(pid: int, port: int) -> bool:
    """Whether process ``pid`` listens on TCP ``port`` itself (True where ``/proc`` cannot tell).

    A server's readiness probe on a port picked by :func:`free_ports` can be answered by another process
    that bound the port first (another cluster's server of the same kind): the probe alone would take that
    one for ours, and our own process would exit on its failed bind unnoticed."""
    sockets, read = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()  # sl local_address rem_address st ... inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                sockets.add(f"socket:[{fields[9]}]")
    if not read:
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # gone
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                return True
        except OSError:
            continue
    return False


FIXED_PORTS_LOW = 10_000  # fixed ports are picked from here up to the ephemeral range's start


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _hold(stack: ExitStack, port: int) -> int | None:
    """Listen on loopback ``port`` (0: any) until ``stack`` closes; the port, or None if it is taken."""
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError:
        return None
    return sock.getsockname()[1]


def _hold_free(stack: ExitStack) -> int:
    """A free port below the ephemeral range, held by ``stack`` (one from that range if none is found)."""
    high = _ephemeral_low()
    if high - FIXED_PORTS_LOW >= 1_000:
        for _ in range(100):
            port = _hold(stack, random.randrange(FIXED_PORTS_LOW, high))
            if port is not None:
                return port
    port = _hold(stack, 0)
    if port is None:
        raise ClusterError("no free loopback port")
    return port


def log_tail(path: str | os.PathLike[str], lines: int = 20) -> str:
    """The last ``lines`` lines of the log file ``path`` (or why there are none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max(16_384, 400 * lines)))
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: whoever started it reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_pids(pids: list[int], timeout_s: float = 10, *, match: str | None = None) -> None:
    """Stop processes started elsewhere (e.g. a detached cluster): SIGTERM, then SIGKILL.

    With ``match``, a pid whose command line does not contain it is left
    alone (a stale pid file must not kill an unrelated process that reused
    the pid). Returns once every targeted process is gone.
    """
    targets = [pid for pid in pids if pid > 0 and not _gone(pid) and (match is None or match in _cmdline(pid))]
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        poll(lambda: all(_gone(pid) for pid in targets), wait_s)
        targets = [pid for pid in targets if not _gone(pid)]
        if not targets:
            return
    raise ClusterError(f"processes {targets} survived SIGKILL", pids=targets)


# -- spawning a server -------------------------------------------------------------------------


def child_env(*, isolated: bool = False, dropped: Iterable[str] = ()) -> dict[str, str]:
    """The environment of a child Python process of this project: this one plus this project on
    ``PYTHONPATH``, minus the variables ``dropped`` (``isolated``: minus every ``KVLEASE_*`` variable but
    ``KVLEASE_TEST_SESSION``, so a test's or benchmark's own config overrides stay out)."""
    env = dict(os.environ)
    if isolated:
        env = {k: v for k, v in env.items() if not k.startswith("KVLEASE_") or k == "KVLEASE_TEST_SESSION"}
    for name in dropped:
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def server_env(config_path: Path, *, isolated: bool = False) -> dict[str, str]:
    """:func:`child_env` for a server: also without the ``KVLEASE_*`` overrides of the keys its config file sets."""
    return child_env(isolated=isolated, dropped=[cfg.KEYS[name].env_var for name in cfg.read_file(config_path)
                                                 if name in cfg.KEYS])


def spawn_server(home: Path, module: str, *, detached: bool, isolated_env: bool = False) -> subprocess.Popen:
    """``python -m kvlease.<module> --config home/config.toml`` in ``home`` (``module``: ``coordinator`` or
    ``tablet``), appending to ``home/<module>.log``.

    ``detached``: its own session, and its pid in ``home/pid`` (it outlives the caller); else it gets
    SIGKILL when the thread that started it dies (:func:`dying_with_parent`)."""
    config_path = home / "config.toml"
    cmd = [sys.executable, "-m", f"kvlease.{module}", "--config", str(config_path)]
    with open(home / f"{module}.log", "ab") as log:
        proc = subprocess.Popen(cmd if detached else dying_with_parent(cmd), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=detached, cwd=str(home),
                                env=server_env(config_path, isolated=isolated_env))
    if detached:
        (home / "pid").write_text(f"{proc.pid}\n")
    return proc


class ServerProcess:
    """One server process this process started and waits for (tests, benchmarks): ``kill -9`` or stop it."""

    def __init__(self, home: Path, module: str, values: Mapping[str, Any], *, isolated_env: bool = True) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.values = dict(values)
        self.log_path = home / f"{module}.log"
        cfg.write_file(home / "config.toml", self.values)
        self.popen = spawn_server(home, module, detached=False, isolated_env=isolated_env)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """``kill -9`` and reap (also works on a paused process)."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a coordinator closes its ZooKeeper session), ``kill -9`` after ``timeout_s``."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 150) -> str:
        return log_tail(self.log_path, lines)


def dying_with_parent(cmd: list[str]) -> list[str]:
    """``cmd`` made to get SIGKILL when the thread that starts it dies (PR_SET_PDEATHSIG).

    Done with util-linux's ``setpriv --pdeathsig`` (it execs ``cmd``, so the pid
    is the command's) rather than a ``preexec_fn``: a preexec_fn makes
    subprocess fork() and run fork handlers in the child, and in a process that
    runs gRPC those abort the child now and then (seen: a JVM dying with
    SIGABRT during start-up). Without setpriv the command runs as is and the
    atexit cleanup still stops it.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *cmd] if setpriv else list(cmd)
