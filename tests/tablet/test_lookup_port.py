"""The lookup port's listener (tablet/lookup_port.py) over real sockets on loopback: the HELLO that names the
server, the frames it answers, the connections it refuses or ends, and a stop that leaves no thread or port.
The answers come from a function of the frame's body (the listener's own contract); the cluster tests
(tests/client/test_lookup_port_cluster.py) answer with the real service."""

from __future__ import annotations

import socket
import threading

import pytest

from kvlease.common import errors
from kvlease.common.lookup_frames import (ANSWER, BUSY, HEADER, HELLO, LOOKUP, OK, VERSION, WRONG_SERVER, FrameReader,
                                          frame, hello)
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.wire import error_from_pb
from kvlease.ops.wait import wait_until
from kvlease.tablet.lookup_port import LookupPort, LookupPortCollector, lookup_answers

pytestmark = pytest.mark.unit

ADDRESS = "127.0.0.1:9124"


@pytest.fixture
def port():
    listener = LookupPort(ADDRESS, lambda body: b"answer to " + body, "127.0.0.1", 0, max_connections=2).start()
    try:
        yield listener
    finally:
        listener.stop()


def connect(listener: LookupPort, address: str = ADDRESS) -> tuple[socket.socket, FrameReader, bytes]:
    """A connection that sent its HELLO naming ``address``, and the status the server answered."""
    sock = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
    sock.sendall(hello(address))
    reader = FrameReader(sock)
    kind, body = reader.read()
    assert kind == ANSWER
    return sock, reader, body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_hello_naming_the_server_is_ok_and_each_lookup_frame_is_answered_in_turn(port):
    sock, reader, status = connect(port)
    with sock:
        assert status == bytes([OK])
        for body in (b"first", b"", b"x" * 100_000):
            sock.sendall(frame(LOOKUP, body))
            assert reader.read() == (ANSWER, b"answer to " + body)


def test_a_hello_naming_another_server_is_told_so_and_closed(port):
    sock, _reader, status = connect(port, "127.0.0.1:9999")
    with sock:
        assert status == bytes([WRONG_SERVER])
        assert closed_by_server(sock)


@pytest.mark.parametrize("opening", [frame(LOOKUP, b"no hello first"), frame(HELLO, b"kvlease-lookup/9 " +
                                                                              ADDRESS.encode()),
                                     HEADER.pack(1 << 31, HELLO), HEADER.pack(100 << 20, HELLO) + b"x" * 1000,
                                     b"GET / HTTP/1.1\r\n\r\n"],
                         ids=["lookup-first", "other-version", "over-max-body", "hello-over-1kb", "http"])
def test_a_connection_not_opened_by_this_protocols_hello_is_closed_unanswered(port, opening):
    with socket.create_connection(("127.0.0.1", port.port), timeout=10) as sock:
        sock.sendall(opening)
        assert closed_by_server(sock)


def test_a_frame_other_than_lookup_after_the_hello_ends_the_connection(port):
    sock, _reader, status = connect(port)
    with sock:
        assert status == bytes([OK])
        sock.sendall(frame(HELLO, VERSION + ADDRESS.encode()))
        assert closed_by_server(sock)


def test_connections_beyond_the_maximum_are_told_busy_and_one_more_is_served_once_another_ended(port):
    first, _r1, s1 = connect(port)
    second, _r2, s2 = connect(port)
    third, _r3, s3 = connect(port)
    assert (s1, s2, s3) == (bytes([OK]), bytes([OK]), bytes([BUSY]))
    assert closed_by_server(third)
    first.close()
    third.close()

    def served() -> bool:  # once the server saw the first close (its thread ended, the count dropped)
        sock, _reader, status = connect(port)
        sock.close()
        return status == bytes([OK])
    wait_until(served, 30, "a connection served once another ended")
    second.close()


def test_the_collector_counts_open_connections_and_answers(port):
    def metrics(listener) -> dict:
        return {f.name: f.samples[0].value for f in LookupPortCollector(lambda: listener).collect()}
    assert metrics(None) == {"kvlease_tablet_lookup_port_connections": 0, "kvlease_tablet_lookup_port_answers": 0}
    sock, reader, _status = connect(port)
    with sock:
        for _ in range(3):
            sock.sendall(frame(LOOKUP, b"x"))
            reader.read()
        assert metrics(port) == {"kvlease_tablet_lookup_port_connections": 1, "kvlease_tablet_lookup_port_answers": 3}


def test_stop_ends_every_connection_and_thread_and_frees_the_port():
    listener = LookupPort(ADDRESS, lambda body: body, "127.0.0.1", 0, max_connections=8).start()
    sock, _reader, status = connect(listener)
    assert status == bytes([OK])
    listener.stop()
    assert closed_by_server(sock)
    sock.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("lookup-")]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", listener.port), timeout=10).close()


def test_a_lookup_frame_that_holds_no_request_is_answered_invalid_request():
    asked = []
    answer = lookup_answers(lambda request, _context: asked.append(request) or pb.LookupResponse(schema_id=7))
    assert pb.LookupResponse.FromString(answer(pb.LookupRequest(table_id=3).SerializeToString())).schema_id == 7
    assert asked[0].table_id == 3
    bad = pb.LookupResponse.FromString(answer(b"\xff\xff\xff"))
    assert isinstance(error_from_pb(bad.error), errors.InvalidRequestError)
    assert len(asked) == 1
