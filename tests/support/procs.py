"""Coordinator processes for tests: ``python -m kvlease.coordinator --config FILE`` on loopback.

:class:`CoordinatorProcs` starts coordinators from one flat config (each gets
its own directory with ``config.toml`` and ``coordinator.log``, and a free
port), and kills (``kill -9``), pauses (``SIGSTOP``) and resumes them. Every
process dies with the thread that started it (``PR_SET_PDEATHSIG``), and
:meth:`CoordinatorProcs.close` kills and reaps whatever is left.

The ``coordinator_procs`` fixture (import it into a test module) closes the
set at teardown whatever happened, and prints every coordinator's log tail
when the test failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pytest

from kvlease.common import config as cfg
from kvlease.common import errors, zkpaths
from kvlease.client.admin import AdminClient, CoordinatorInfo
from kvlease.common.model import Lease, TableBucket
from kvlease.leases.store import LeaseStore
from kvlease.ops.local_cluster import ServerProcess, free_ports
from kvlease.ops.wait import wait_until

def _all_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in the stopped state (``T`` in ``/proc/PID/task/TID/stat``)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = [Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0] for tid in tasks]
    except (OSError, IndexError):
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


class CoordinatorProc(ServerProcess):
    """One coordinator process (:class:`kvlease.ops.local_cluster.ServerProcess`), which a test can also pause."""

    def __init__(self, name: str, home: Path, values: Mapping[str, Any]) -> None:
        super().__init__(home, "coordinator", values)
        self.name = name
        self.address = f"127.0.0.1:{values[cfg.COORDINATOR_PORT.name]}"

    def pause(self) -> None:
        """SIGSTOP, and wait until every thread of the process is stopped: ``kill`` returns once the signal is
        queued, and a request a test sends right after could be handled by a thread not yet stopped (a zombie
        write that was no zombie's)."""
        os.kill(self.pid, signal.SIGSTOP)
        wait_until(lambda: _all_stopped(self.pid), 10, f"{self.name} (pid {self.pid}) stopped", interval_s=0.005)

    def resume(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __repr__(self) -> str:
        return f"CoordinatorProc({self.name}, {self.address}, pid={self.pid})"


class CoordinatorProcs:
    """Coordinator processes sharing one config; a context manager that kills them all on exit."""

    def __init__(self, base_dir: str | os.PathLike[str], values: Mapping[str, Any]) -> None:
        self.base_dir = Path(base_dir)
        self.values = dict(values)
        self.procs: list[CoordinatorProc] = []
        self._clients: list[AdminClient] = []

    @classmethod
    def from_config(cls, base_dir: str | os.PathLike[str], config: cfg.Config,
                    overrides: Mapping[str, Any] | None = None) -> "CoordinatorProcs":
        """From a parsed Config (e.g. the ``zk_config`` fixture) plus overrides."""
        values = {name: _render(value) for name, value in config.as_dict().items()}
        values.update(overrides or {})
        return cls(base_dir, values)

    # -- lifecycle ---------------------------------------------------------------------

    def spawn(self, count: int = 1, **overrides: Any) -> list[CoordinatorProc]:
        """Start ``count`` coordinators (``overrides`` are dotted keys passed as a dict's items)."""
        started = []
        for port in free_ports(count):
            name = f"coordinator-{len(self.procs) + 1}"
            values = {**self.values, **overrides, cfg.COORDINATOR_PORT.name: port,
                      cfg.COORDINATOR_HOST.name: "127.0.0.1", cfg.COORDINATOR_ID.name: name}
            proc = CoordinatorProc(name, self.base_dir / name, values)
            self.procs.append(proc)
            started.append(proc)
        return started

    def close(self) -> None:
        """Kill and reap every coordinator; close the clients handed out. Idempotent."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        for proc in self.procs:
            try:
                proc.kill()
            except Exception:  # reaping must not stop the others from being killed
                pass

    def __enter__(self) -> "CoordinatorProcs":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- asking them ----------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return [p.address for p in self.procs]

    def client(self, addresses: list[str] | None = None, **kwargs: Any) -> AdminClient:
        """An AdminClient on ``addresses`` (default: every coordinator); closed by :meth:`close`."""
        client = AdminClient(addresses or self.addresses, **kwargs)
        self._clients.append(client)
        return client

    def info(self, proc: CoordinatorProc, timeout_s: float = 1.0) -> CoordinatorInfo | None:
        """What ``proc`` says about itself, or None if it does not answer."""
        with AdminClient([proc.address], request_timeout_s=timeout_s, retry_total_s=0) as client:
            try:
                return client.coordinator_info(proc.address)
            except errors.KvLeaseError:
                return None

    def wait_active(self, timeout_s: float = 30.0, *, among: list[CoordinatorProc] | None = None,
                    min_epoch: int = 0) -> tuple[CoordinatorProc, CoordinatorInfo]:
        """The first coordinator (of ``among``) that says it is active with an epoch >= ``min_epoch``."""
        candidates = among or self.procs

        def active() -> tuple[CoordinatorProc, CoordinatorInfo] | None:
            for proc in candidates:
                info = self.info(proc) if proc.alive() else None
                if info is not None and info.active and info.epoch >= min_epoch:
                    return proc, info
            assert any(p.alive() for p in candidates), f"every coordinator of {candidates} exited"
            return None
        return wait_until(active, timeout_s, f"a coordinator of {candidates} active (epoch >= {min_epoch})")

    def logs(self, lines: int = 150) -> str:
        return "\n".join(f"==> {p.name} {p.address} pid {p.pid} "
                         f"({'running' if p.alive() else f'exited {p.popen.returncode}'}) {p.log_path} <==\n"
                         f"{p.log_tail(lines)}" for p in self.procs)


#: What a deposed coordinator may still change in ZooKeeper: the election recipe's
#: nodes and the active pointer (its own ephemeral node, removed when it steps down).
UNFENCED = (zkpaths.ELECTION, zkpaths.ACTIVE)


def zk_tree(zk, root: str = "/") -> dict[str, tuple[bytes, int]]:
    """Every node under ``root`` (but the unfenced ones) -> (data, mzxid). Read a level at a time, each
    level's requests sent together (one round trip per level, not two per node)."""
    tree: dict[str, tuple[bytes, int]] = {}
    level = [root]
    while level:
        asked = [(path, zk.get_async(path), zk.get_children_async(path)) for path in level
                 if not any(path == p or path.startswith(p + "/") for p in UNFENCED)]
        level = []
        for path, got, children in asked:
            data, stat = got.get()
            tree[path] = (data, stat.mzxid)
            level.extend(f"{path.rstrip('/')}/{child}" for child in children.get())
    return tree


def persisted_leases(zk, storage) -> dict[str, Lease]:
    """Every lease as ZooKeeper + its metadata files say (what a new coordinator would load)."""
    store = LeaseStore(storage)
    try:
        return {lease.lease_id: lease for lease in store.load_all(zk)}
    finally:
        store.close()


def lease_view(lease: Lease) -> tuple[int, dict[TableBucket, int]]:
    return lease.expiration_time, dict(lease.buckets)


def assert_served_as_persisted(served: list[Lease], zk, storage) -> None:
    """The leases a coordinator serves are exactly those in ZooKeeper + their files.

    Also the deadline of a lease that got the failover grace: the grace is
    written back before the new active coordinator serves.
    """
    persisted = persisted_leases(zk, storage)
    by_id = {lease.lease_id: lease for lease in served}
    assert set(by_id) == set(persisted), "served and persisted lease ids differ"
    for lease_id, lease in by_id.items():
        stored = persisted[lease_id]
        assert dict(lease.buckets) == dict(stored.buckets), f"lease {lease_id}: buckets differ"
        assert lease.expiration_time == stored.expiration_time, f"lease {lease_id}: deadline differs"
        assert lease.owner == stored.owner, f"lease {lease_id}: owner differs"


def _render(value: Any) -> Any:
    """A parsed config value back into something :func:`kvlease.common.config.to_toml` writes and Config reads."""
    return value if isinstance(value, (bool, int, str)) else str(value)


@pytest.fixture
def coordinator_procs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., CoordinatorProcs]]:
    """``coordinator_procs(config, overrides=None) -> CoordinatorProcs``; all killed at teardown.

    When the test failed, every coordinator's log tail is printed.
    """
    made: list[CoordinatorProcs] = []
    failed_before = request.session.testsfailed

    def make(config: cfg.Config, overrides: Mapping[str, Any] | None = None) -> CoordinatorProcs:
        procs = CoordinatorProcs.from_config(tmp_path / f"coordinators-{len(made) + 1}", config, overrides)
        made.append(procs)
        return procs

    try:
        yield make
    finally:
        for procs in made:
            procs.close()
        if request.session.testsfailed > failed_before:
            text = "\n".join(procs.logs() for procs in made)
            capman = request.config.pluginmanager.getplugin("capturemanager")
            if capman is not None:
                with capman.global_and_fixture_disabled():
                    print(f"\n---- coordinator logs of {request.node.nodeid} ----\n{text}", file=sys.stderr)
            else:
                print(text, file=sys.stderr)


def kill_after_reading(proc: subprocess.Popen, seconds: float) -> list[bytes]:
    """Read ``proc``'s stdout lines for ``seconds``, SIGKILL it, and return every complete line
    (those still in the pipe too). A line cut by the kill has no newline: it was never acknowledged."""
    deadline = time.monotonic() + seconds
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line.endswith(b"\n"), f"writer died: {proc.stderr.read().decode()}"
        lines.append(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    lines += proc.stdout.read().splitlines(keepends=True)  # acks still in the pipe
    return [line for line in lines if line.endswith(b"\n")]
