"""ZooKeeper client factory (a started KazooClient on the configured chroot), node codec and multi-op items."""

from __future__ import annotations

import json
import select
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.retry import KazooRetry

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common import zkacl
from kvlease.common.redaction import protect


@dataclass(frozen=True)
class ZkOp:
    """One operation of a multi-op: ``kind`` is create, set or delete."""

    kind: str
    path: str
    data: bytes = b""


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler with a cheaper ``select``: one ``poll(2)`` call per wait.

    kazoo's connection thread waits in ``handler.select`` before every request
    it sends and every response it reads (4 waits per request); the stock
    handler builds and closes an epoll selector each time (5 system calls and
    a dozen Python objects). That was a fifth of a standby coordinator's CPU
    while it mirrors leases. ``poll`` has no descriptor limit either (the
    reason kazoo left ``select.select``). Same contract: lists of the ready
    objects as passed in; TypeError for a closed socket, ValueError for a
    descriptor that is not open or a negative timeout.
    """

    def select(self, rlist, wlist, xlist, timeout=None):
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be non-negative")
        rfds, wfds = [_fd(obj) for obj in rlist], [_fd(obj) for obj in wlist]
        poller = select.poll()
        for fd in set(rfds) | set(wfds):
            poller.register(fd, (select.POLLIN if fd in rfds else 0) | (select.POLLOUT if fd in wfds else 0))
        ready = dict(poller.poll(None if timeout is None else timeout * 1000))
        if any(events & select.POLLNVAL for events in ready.values()):
            raise ValueError("Invalid event mask or fd")
        trouble = select.POLLERR | select.POLLHUP  # reported as readable/writable: the read or write fails
        return ([obj for obj, fd in zip(rlist, rfds) if ready.get(fd, 0) & (select.POLLIN | trouble)],
                [obj for obj, fd in zip(wlist, wfds) if ready.get(fd, 0) & (select.POLLOUT | trouble)], [])


def _fd(obj) -> int:
    fd = obj if isinstance(obj, int) else obj.fileno()
    if fd < 0:
        raise TypeError(f"Invalid file descriptor: {fd}")
    return fd


def connect_string(config: cfg.Config) -> str:
    root = config[cfg.ZK_ROOT].rstrip("/")
    address = config[cfg.ZK_ADDRESS]
    return address + root if root and "/" not in address else address


def make_client(config: cfg.Config, *, start: bool = True, timeout_s: float = 15.0) -> KazooClient:
    """A KazooClient on ``zookeeper.address`` + ``zookeeper.path.root``.

    The chroot node is created if missing (through a short-lived client on the
    bare address), so callers can use absolute paths like ``/tables``.

    With ``security.zookeeper.digest`` set the client authenticates as that
    digest identity and every node it creates (the chroot too) carries the
    digest-only ACL of :mod:`kvlease.common.zkacl`. A started client has checked that
    it may change the tree (securing a tree made before the digest was set);
    raises ConfigError naming the key if ZooKeeper refuses it.
    """
    address = config[cfg.ZK_ADDRESS]
    root = config[cfg.ZK_ROOT].rstrip("/")
    session_s = config[cfg.ZK_SESSION_TIMEOUT] / 1000.0
    retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0, ignore_expire=False)
    auth, acl = zkacl.auth_data(config), zkacl.node_acl(config)
    protect(config.secrets())  # kazoo's lowest log level shows the auth packet
    chrooted = bool(root) and "/" not in address
    if start and chrooted:
        bootstrap = KazooClient(hosts=address, timeout=session_s, auth_data=auth, handler=PollHandler())
        _start(bootstrap, address, timeout_s)
        try:
            zkacl.ensure_chroot(bootstrap, root, acl)
        finally:
            bootstrap.stop()
            bootstrap.close()
    client = KazooClient(hosts=connect_string(config), timeout=session_s, connection_retry=retry,
                         auth_data=auth, default_acl=acl, handler=PollHandler())
    if start:
        _start(client, address, timeout_s)
        try:
            zkacl.check_access(client, config, root if chrooted else "/" + address.split("/", 1)[1] if "/" in address
                               else "")
        except BaseException:
            client.stop()
            client.close()
            raise
    return client


def _start(client: KazooClient, address: str, timeout_s: float) -> None:
    """``client.start``; no session within ``timeout_s`` is a NetworkError naming the address (kazoo has
    stopped and closed the client by then)."""
    try:
        client.start(timeout=timeout_s)
    except KazooTimeoutError:
        raise errors.NetworkError(f"cannot reach ZooKeeper at {address} (config key {cfg.ZK_ADDRESS.name!r}) "
                                  f"within {timeout_s:g} s") from None


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def loads(data: bytes) -> Any:
    return json.loads(data.decode()) if data else None
