"""The frames of a tablet server's lookup port (docs/architecture.md, "The lookup port").

A frame is a header (:data:`HEADER`: the body's length, big-endian uint32, and one byte of kind) and the body.

- A connection starts with the client's :data:`HELLO`: ``kvlease-lookup/1 `` and the gRPC address the client
  knows the server by (its registration's ``host:port``). The server answers one :data:`ANSWER` of one status
  byte: :data:`OK`, or :data:`WRONG_SERVER` (it is another server: a port taken by another process since it was
  advertised) or :data:`BUSY` (it serves as many connections as it may), and then closes the connection.
- Then :data:`LOOKUP` frames, a serialized ``LookupRequest`` each, one at a time: each is answered by one
  :data:`ANSWER`, a serialized ``LookupResponse`` (errors inside it, as over gRPC).

Anything else (another kind, a longer body than :data:`MAX_BODY`, a HELLO longer than :data:`MAX_HELLO`) ends the
connection: :class:`FrameError`.
"""

from __future__ import annotations

import socket
import struct

from kvlease.common.limits import MAX_MESSAGE_BYTES

HEADER = struct.Struct(">IB")
HELLO, LOOKUP, ANSWER = 0, 1, 2
OK, WRONG_SERVER, BUSY = 0, 1, 2
VERSION = b"kvlease-lookup/1 "
#: The longest body either side takes: gRPC's message limit (a lookup of many keys, or its answer).
MAX_BODY = MAX_MESSAGE_BYTES
#: The longest HELLO body a server reads (a version and an address).
MAX_HELLO = 1024
#: The most bytes one ``recv`` takes.
CHUNK = 1 << 20


class FrameError(ConnectionError):
    """The peer sent something this protocol does not have: the connection ends."""


def frame(kind: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), kind) + body


def hello(address: str) -> bytes:
    return frame(HELLO, VERSION + address.encode())


class FrameReader:
    """Reads frames from ``sock`` (blocking, under its timeout). A read that times out keeps what arrived and
    continues where it stopped when :meth:`read` is called again. A body's memory grows with the bytes that
    arrived (at most :data:`CHUNK` more), never with what a header claims."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._header = bytearray()
        self._body: bytearray | None = None
        self._length = 0
        self._kind = -1

    def read(self, max_body: int = MAX_BODY) -> tuple[int, bytes]:
        """The next frame's ``(kind, body)``. ``TimeoutError`` (``socket.timeout``) with the frame unfinished,
        :class:`FrameError` for a body over ``max_body`` bytes, ``ConnectionError`` if the peer closed."""
        if self._body is None:
            self._fill(self._header, HEADER.size)
            self._length, self._kind = HEADER.unpack(self._header)
            if self._length > max_body:
                raise FrameError(f"a frame of {self._length} bytes (at most {max_body})")
            self._header, self._body = bytearray(), bytearray()
        self._fill(self._body, self._length)
        body, self._body = bytes(self._body), None
        return self._kind, body

    def _fill(self, buffer: bytearray, size: int) -> None:
        while len(buffer) < size:
            data = self.sock.recv(min(size - len(buffer), CHUNK))
            if not data:
                raise ConnectionError("the peer closed the connection")
            buffer += data
