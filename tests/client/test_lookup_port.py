"""A client's lookup ports (client/lookup_port.py) against servers that misbehave in one way each, on real
sockets: an answer that does not come (given up as a gRPC call is), comes in pieces, or breaks off; a HELLO
left unanswered; connections reused. Each such server is a few lines of its own here; the real server is
tests/tablet/test_lookup_port.py's and tests/client/test_lookup_port_cluster.py's."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from kvlease.client import lookup_port
from kvlease.client.lookup_port import LookupPorts
from kvlease.common import errors
from kvlease.common.lookup_frames import ANSWER, HELLO, LOOKUP, OK, FrameReader, frame
from kvlease.common.proto import tablet_pb2 as pb

pytestmark = pytest.mark.unit

ADDRESS = "127.0.0.1:9124"
REQUEST = pb.LookupRequest(table_id=5, bucket=0, key_data=b"k", key_offsets=b"\0\0\0\0\1\0\0\0")
RESPONSE = pb.LookupResponse(values=b"v", value_offsets=b"\0\0\0\0\1\0\0\0", found_mask=b"\1", schema_id=3)


class FakePort:
    """A listener whose every connection runs ``behave(sock, reader)`` in a thread; closed on exit."""

    def __init__(self, behave) -> None:
        self.behave = behave
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            self.socks.append(sock)
            thread = threading.Thread(target=self._run, args=(sock,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _run(self, sock: socket.socket) -> None:
        try:
            self.behave(sock, FrameReader(sock))
        except OSError:
            pass

    def __enter__(self) -> "FakePort":
        return self

    def __exit__(self, *exc) -> None:
        for sock in [self.listener, *self.socks]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self.threads:
            thread.join(timeout=10)


def hold(sock: socket.socket) -> None:
    """Read and drop whatever comes until the connection closes (the client's close or the test's exit)."""
    while sock.recv(1 << 16):
        pass


def greeted(sock: socket.socket, reader: FrameReader) -> None:
    """Read the HELLO and answer OK."""
    assert reader.read()[0] == HELLO
    sock.sendall(frame(ANSWER, bytes([OK])))


def answering(sock, reader) -> None:
    greeted(sock, reader)
    while True:
        kind, _body = reader.read()
        assert kind == LOOKUP
        sock.sendall(frame(ANSWER, RESPONSE.SerializeToString()))


def silent_after_hello(sock, reader) -> None:
    greeted(sock, reader)
    reader.read()
    hold(sock)


@pytest.fixture
def ports():
    made = LookupPorts()
    yield made
    made.close()


def call(ports: LookupPorts, timeout_s: float = 10.0, moved=lambda: False):
    return ports.call(ADDRESS, REQUEST, timeout_s, moved, lambda: "the leader")


def test_answers_come_over_one_reused_connection(ports):
    with FakePort(answering) as port:
        ports.learn(ADDRESS, port.port)
        assert [call(ports) for _ in range(5)] == [RESPONSE] * 5
        assert port.accepted == 1


def test_a_forked_child_never_uses_a_connection_its_parent_made(ports, monkeypatch):
    with FakePort(answering) as port:
        ports.learn(ADDRESS, port.port)
        assert call(ports) == RESPONSE
        parent = lookup_port.os.getpid()
        monkeypatch.setattr(lookup_port.os, "getpid", lambda: parent + 1)  # as in a child after fork()
        assert call(ports) == RESPONSE
        assert port.accepted == 2  # its own connection, not the inherited one
        assert call(ports) == RESPONSE
        assert port.accepted == 2  # which it then reuses


def test_an_answer_not_given_is_given_up_once_another_leader_is_named_and_the_port_is_kept(ports):
    with FakePort(silent_after_hello) as port:
        ports.learn(ADDRESS, port.port)
        started = time.monotonic()
        with pytest.raises(errors.NotLeaderError, match="the leader did not answer within"):
            call(ports, timeout_s=30.0, moved=lambda: True)
        assert lookup_port.CHECK_S <= time.monotonic() - started < 10
        assert ports.port(ADDRESS) == port.port  # the server may be well: the next call tries it again


def test_an_answer_not_given_within_the_timeout_is_a_retriable_network_error(ports):
    with FakePort(silent_after_hello) as port:
        ports.learn(ADDRESS, port.port)
        started = time.monotonic()
        with pytest.raises(errors.NetworkError, match="timed out after 1.5s"):
            call(ports, timeout_s=1.5)
        assert 1.5 <= time.monotonic() - started < 10


def test_an_answer_that_arrives_in_pieces_across_the_leader_checks_is_read_whole(ports):
    def slow(sock, reader):
        greeted(sock, reader)
        reader.read()
        whole = frame(ANSWER, RESPONSE.SerializeToString())
        sock.sendall(whole[:3])
        time.sleep(lookup_port.CHECK_S + 0.3)
        sock.sendall(whole[3:9])
        time.sleep(lookup_port.CHECK_S + 0.3)
        sock.sendall(whole[9:])
        hold(sock)
    checks = []
    with FakePort(slow) as port:
        ports.learn(ADDRESS, port.port)
        assert call(ports, moved=lambda: checks.append(1) or False) == RESPONSE
    assert len(checks) >= 2


@pytest.mark.parametrize("behave", [
    lambda sock, reader: (greeted(sock, reader), reader.read(), sock.close()),  # the answer is lost
    lambda sock, reader: (greeted(sock, reader), reader.read(), sock.sendall(frame(ANSWER, b"\xff\xff"))),
    lambda sock, reader: (reader.read(), sock.sendall(frame(ANSWER, bytes([2])))),  # BUSY
], ids=["closed", "not-a-response", "busy"])
def test_a_port_that_fails_is_forgotten_so_the_call_goes_over_grpc_and_may_learn_it_again(ports, behave):
    with FakePort(behave) as port:
        ports.learn(ADDRESS, port.port)
        assert call(ports) is None
        assert ports.port(ADDRESS) is None
        ports.learn(ADDRESS, port.port)  # named again by the gRPC answer: tried again
        assert ports.port(ADDRESS) == port.port


def test_a_port_that_does_not_answer_its_hello_is_not_tried_again_for_a_while(ports, monkeypatch):
    monkeypatch.setattr(lookup_port, "CONNECT_S", 0.3)
    with FakePort(lambda sock, reader: hold(sock)) as port:
        ports.learn(ADDRESS, port.port)
        started = time.monotonic()
        assert call(ports) is None
        assert 0.3 <= time.monotonic() - started < 5
        ports.learn(ADDRESS, port.port)
        assert ports.port(ADDRESS) is None  # quiet: lookups go over gRPC without waiting on it again
        assert call(ports) is None


def test_a_closed_client_keeps_no_connection(ports):
    with FakePort(answering) as port:
        ports.learn(ADDRESS, port.port)
        assert call(ports) == RESPONSE
        ports.close()
        server_side = port.socks[0]
        server_side.settimeout(10)
        assert server_side.recv(1) == b""  # the idle connection was closed
