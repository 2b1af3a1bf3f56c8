"""A tablet server's lookup port: ``Lookup`` calls over plain TCP beside gRPC (docs/architecture.md, "The lookup
port").

A Python gRPC round trip costs about 0.3 ms on loopback here, a plain TCP one 0.02 ms: most of a single-key
lookup's time. So a tablet server also answers ``Lookup`` on a port of its own (``tablet.lookup.port``; off
with security on: that port has neither TLS nor users), in frames of :mod:`kvlease.common.lookup_frames`. Each
request is answered by the gRPC service's own ``Lookup`` (:func:`lookup_answers`): the same checks, the same
rows, the same errors in the answer, the same leader lease. A gRPC ``Lookup`` answer names the port
(``LookupResponse.lookup_port``), which is how clients learn it.

One thread per connection, at most ``max_connections`` (a connection beyond them is answered BUSY and closed:
its client asks over gRPC). :class:`LookupPortCollector` exports what it serves to Prometheus.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

from google.protobuf.message import DecodeError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvlease.common import errors
from kvlease.common.wire import error_pb
from kvlease.common.lookup_frames import (ANSWER, BUSY, HELLO, LOOKUP, MAX_HELLO, OK, VERSION, WRONG_SERVER,
                                          FrameError, FrameReader, frame)
from kvlease.common.proto import tablet_pb2 as pb

log = logging.getLogger(__name__)


def lookup_answers(lookup: Callable[[pb.LookupRequest, object], pb.LookupResponse]) -> Callable[[bytes], bytes]:
    """The answer to a LOOKUP frame's body: ``lookup`` (the gRPC service's ``Lookup``) of the request it holds,
    serialized; a body that is no LookupRequest is answered INVALID_REQUEST."""
    def answer(body: bytes) -> bytes:
        try:
            request = pb.LookupRequest.FromString(body)
        except DecodeError:
            bad = errors.InvalidRequestError("the lookup port's LOOKUP frame holds no LookupRequest")
            return pb.LookupResponse(error=error_pb(bad)).SerializeToString()
        return lookup(request, None).SerializeToString()
    return answer


class LookupPort:
    """The listener and its connections' threads; :meth:`start`, then :attr:`port`; :meth:`stop` ends them all."""

    def __init__(self, address: str, answer: Callable[[bytes], bytes], host: str, port: int,
                 max_connections: int) -> None:
        self.address = address  # the gRPC address this server is registered by: what a client's HELLO names
        self.answer = answer
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._stopping = False
        self.answered = 0  # LOOKUP frames answered

    def start(self) -> "LookupPort":
        listener = socket.create_server((self.host, self.port), backlog=128)
        self._listener, self.port = listener, listener.getsockname()[1]
        with self._lock:
            self._spawn(self._accept, "lookup-port")
        return self

    def stop(self) -> None:
        """Close the listener and every connection (a lookup being answered ends with it), then join."""
        with self._lock:
            self._stopping = True
            connections, threads = list(self._connections), list(self._threads)
        for sock in ([self._listener] if self._listener is not None else []) + connections:
            _shut(sock)
        for thread in threads:
            thread.join(timeout=10)

    def counts(self) -> tuple[int, int]:
        """``(connections open, lookups answered)``."""
        with self._lock:
            return len(self._connections), self.answered

    def _spawn(self, target: Callable, name: str, *args) -> None:
        """Start a thread running ``target(*args)``, one :meth:`stop` joins (hold the lock: a stop that comes
        after sees it started)."""
        thread = threading.Thread(target=self._run, args=(target, *args), name=name, daemon=True)
        self._threads.add(thread)
        thread.start()

    def _run(self, target: Callable, *args) -> None:
        try:
            target(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _accept(self) -> None:
        while True:
            try:
                sock, _peer = self._listener.accept()
            except OSError:  # closed: the server stops
                return
            with self._lock:
                if self._stopping:
                    sock.close()
                    return
                busy = len(self._connections) >= self.max_connections
                self._connections.add(sock)
                self._spawn(self._serve, "lookup-connection", sock, busy)

    def _serve(self, sock: socket.socket, busy: bool) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = FrameReader(sock)
            kind, body = reader.read(MAX_HELLO)
            if kind != HELLO or not body.startswith(VERSION):
                return
            status = BUSY if busy else OK if body[len(VERSION):] == self.address.encode() else WRONG_SERVER
            sock.sendall(frame(ANSWER, bytes([status])))
            while status == OK:
                kind, body = reader.read()
                if kind != LOOKUP:
                    return
                answer = frame(ANSWER, self.answer(body))
                with self._lock:  # counted before it leaves: once a client has its answer, the count has it
                    self.answered += 1
                sock.sendall(answer)
        except (OSError, FrameError):  # the client went, or spoke another protocol: its connection ends
            pass
        except Exception:  # a bug: this connection ends, the server serves on
            log.exception("lookup port: a connection failed")
        finally:
            with self._lock:
                self._connections.discard(sock)
            sock.close()


class LookupPortCollector:
    """``kvlease_tablet_lookup_port_connections`` (open now) and ``kvlease_tablet_lookup_port_answers_total``
    of a server's lookup port (both 0 while it has none); register it with a CollectorRegistry."""

    def __init__(self, port: Callable[[], LookupPort | None]) -> None:
        self.port = port

    def describe(self):  # registering must not call collect()
        return []

    def collect(self):
        port = self.port()
        connections, answered = port.counts() if port is not None else (0, 0)
        yield GaugeMetricFamily("kvlease_tablet_lookup_port_connections",
                                "connections open to the tablet server's lookup port", value=connections)
        yield CounterMetricFamily("kvlease_tablet_lookup_port_answers", "lookups answered on the lookup port",
                                  value=answered)


def _shut(sock: socket.socket) -> None:
    """Wake a thread blocked in ``accept``/``recv`` on ``sock`` and close it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
