"""The frames of a tablet server's lookup port (docs/architecture.md, "The lookup port").

A frame is a header (:data:`HEADER`: the body's length, big-endian uint32, and one byte of kind) and the body.

- A connection starts with the client's :data:`HELLO`: ``kvlease-lookup/1 `` and the gRPC address the client
  knows the server by (its registration's ``host:port``). The server answers one :data:`ANSWER` of one status
  byte: :data:`OK`, or :data:`WRONG_SERVER` (it is another server: a port taken by another process since it was
  advertised) or :data:`BUSY` (it serves as many connections as it may), and then closes the connection.
- Then :data:`LOOKUP` frames, a serialized ``LookupRequest`` each, one at a time: each is answered by one
  :data:`ANSWER`, a serialized ``LookupResponse`` (errors inside it, as over gRPC).

Anything else (another kind, a longer body than :data:`MAX_BODY`) ends the connection: :class:`FrameError`.
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


class FrameError(ConnectionError):
    """The peer sent something this protocol does not have: the connection ends."""


def frame(kind: int, body: bytes) -> bytes:
    return HEADER.pack(len(body), kind) + body


def hello(address: str) -> bytes:
    return frame(HELLO, VERSION + address.encode())


class FrameReader:
    """Reads frames from ``sock`` (blocking, under its timeout). A read that times out keeps what arrived and
    continues where it stopped when :meth:`read` is called again."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._header = bytearray(HEADER.size)
        self._got = 0
        self._body: bytearray | None = None
        self._kind = -1

    def read(self) -> tuple[int, bytes]:
        """The next frame's ``(kind, body)``. ``TimeoutError`` (``socket.timeout``) with the frame unfinished,
        :class:`FrameError` for a body too long, ``ConnectionError`` if the peer closed."""
        if self._body is None:
            self._fill(self._header)
            length, self._kind = HEADER.unpack(self._header)
            if length > MAX_BODY:
                raise FrameError(f"a frame of {length} bytes (at most {MAX_BODY})")
            self._body, self._got = bytearray(length), 0
        self._fill(self._body)
        body, self._body, self._got = bytes(self._body), None, 0
        return self._kind, body

    def _fill(self, buffer: bytearray) -> None:
        view = memoryview(buffer)
        while self._got < len(buffer):
            n = self.sock.recv_into(view[self._got:])
            if n == 0:
                raise ConnectionError("the peer closed the connection")
            self._got += n
