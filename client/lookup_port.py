"""Lookups over a tablet server's lookup port (docs/architecture.md, "The lookup port"; the server side is
``tablet/lookup_port.py``, the frames :mod:`kvlease.common.lookup_frames`).

A client without TLS and users (:class:`~kvlease.client.transport.Channels` makes a :class:`LookupPorts` only
then) learns a server's lookup port from its gRPC ``Lookup`` answers (``LookupResponse.lookup_port``) and from
then on sends that server's ``Lookup`` calls there: the same request, the same answer message, about 0.3 ms
less per call. Whatever goes wrong with the port, the call goes over gRPC as before:

- no port learnt yet, or the connection or its HELLO failed (refused, closed, BUSY, WRONG_SERVER), or an
  answer broke off or was no ``LookupResponse``: :meth:`LookupPorts.call` forgets the port and returns None,
  and the caller asks over gRPC (whose answer names the port again, if any);
- a connection or HELLO not answered within :data:`CONNECT_S` (a port a firewall drops, a paused server): the
  same, and the port named again is not tried for :data:`QUIET_S`;
- an answer that does not come is waited for as a gRPC call is (``client/leader_watch.py``): given up with
  NotLeaderError once the coordinator names another leader, a NetworkError once the call's timeout passed;
  both are retried by the caller's policy, like their gRPC twins.

A lookup is a read: sending it again after a lost answer asks the same question.

A connection is used by one call at a time, and only by the process that made it: a forked child (a Spark
Python worker) that inherited the pool starts it afresh (:meth:`LookupPorts._this_process`), so no two
processes ever read answers from one socket (one could take the other's answer: another key's row).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

from google.protobuf.message import DecodeError

from kvlease.client.leader_watch import CHECK_S, gone
from kvlease.common import errors
from kvlease.common.lookup_frames import ANSWER, LOOKUP, OK, FrameError, FrameReader, frame, hello
from kvlease.common.proto import tablet_pb2 as pb

#: The longest a new connection and its HELLO may take before the call goes over gRPC instead.
CONNECT_S = 1.0
#: How long a port whose connection timed out is not tried again.
QUIET_S = 30.0
#: Idle connections kept per server (more, while as many threads look up at once, are closed after use).
MAX_IDLE = 32


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader(sock)


class LookupPorts:
    """``address -> lookup port`` as the servers named them, and idle connections to those ports."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._ports: dict[str, int] = {}
        self._idle: dict[str, list[_Connection]] = {}
        self._quiet_until: dict[str, float] = {}  # address -> monotonic time its port may be tried again
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # the process whose connections the pool holds

    def port(self, address: str) -> int | None:
        return self._ports.get(address)

    def learn(self, address: str, port: int) -> None:
        """A gRPC answer of the server at ``address`` named ``port`` (0: none)."""
        if self._ports.get(address, 0) == port or (port > 0 and time.monotonic() < self._quiet_until.get(address, 0)):
            return
        with self._lock:
            if self._closed:
                return
            if port > 0:
                self._ports[address] = port
            else:
                self._ports.pop(address, None)
            stale = self._idle.pop(address, [])
        _close(stale)

    def call(self, address: str, request: pb.LookupRequest, timeout_s: float, moved: Callable[[], bool],
             where: Callable[[], str]) -> pb.LookupResponse | None:
        """``request``'s answer from the lookup port of ``address``, or None: ask over gRPC (the module
        docstring). ``moved()``: the coordinator names another leader; ``where()``: the server, for an error."""
        port = self._ports.get(address)
        if port is None:
            return None
        self._this_process()
        deadline = time.monotonic() + timeout_s
        connection = self._take(address)
        connecting = connection is None
        try:
            if connecting:
                connection = _connect(address, port, min(timeout_s, CONNECT_S))
            connection.sock.sendall(frame(LOOKUP, request.SerializeToString()))
            response = pb.LookupResponse.FromString(_answer(connection, address, deadline, timeout_s, moved, where))
        except (errors.NotLeaderError, errors.NetworkError):
            connection.sock.close()
            raise
        except (OSError, FrameError, DecodeError) as exc:  # the port failed: gRPC answers (and names it again)
            if connection is not None:
                connection.sock.close()
            self._forget(address, port, QUIET_S if connecting and isinstance(exc, TimeoutError) else 0.0)
            return None
        self._give(address, connection)
        return response

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = [c for conns in self._idle.values() for c in conns], {}
        _close(idle)

    def _forget(self, address: str, port: int, quiet_s: float) -> None:
        with self._lock:
            if quiet_s:
                self._quiet_until[address] = time.monotonic() + quiet_s
            if self._ports.get(address) != port:
                return
            del self._ports[address]
            stale = self._idle.pop(address, [])
        _close(stale)

    def _this_process(self) -> None:
        """In a forked child, the pool starts afresh: the idle connections are its parent's (the child closes
        its copies; the parent's stay open), and so may be the lock (held at the fork by another thread)."""
        if self._pid == os.getpid():
            return
        inherited = [c for conns in self._idle.values() for c in conns]
        self._lock, self._idle, self._pid = threading.Lock(), {}, os.getpid()
        _close(inherited)

    def _take(self, address: str) -> _Connection | None:
        with self._lock:
            idle = self._idle.get(address)
            return idle.pop() if idle else None

    def _give(self, address: str, connection: _Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < self.max_idle:
                idle.append(connection)
                return
        connection.sock.close()


def _connect(address: str, port: int, timeout_s: float) -> _Connection:
    """A connection to ``port`` on the host of ``address`` that said OK to its HELLO; ConnectionError if it
    said otherwise."""
    host = address.rpartition(":")[0].strip("[]")
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(hello(address))
        connection = _Connection(sock)
        kind, body = connection.reader.read()
        if kind != ANSWER or body != bytes([OK]):
            raise ConnectionError(f"the lookup port of {address} answered its HELLO with {body!r}")
    except BaseException:
        sock.close()
        raise
    return connection


def _answer(connection: _Connection, address: str, deadline: float, timeout_s: float, moved: Callable[[], bool],
            where: Callable[[], str]) -> bytes:
    """The answer frame's body, waited for as ``client/leader_watch.py`` waits for a gRPC answer."""
    first = True
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise errors.NetworkError(f"Lookup to tablet server {address} timed out after {timeout_s:g}s",
                                      address=address)
        if not first and moved():
            raise gone(where(), timeout_s - left)
        first = False
        connection.sock.settimeout(min(CHECK_S, left))
        try:
            kind, body = connection.reader.read()
        except TimeoutError:  # not yet: the frame read so far is kept
            continue
        if kind != ANSWER:
            raise FrameError(f"a frame of kind {kind} where an answer was due")
        return body


def _close(connections: list[_Connection]) -> None:
    for connection in connections:
        connection.sock.close()
