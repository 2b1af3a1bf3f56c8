"""``common.zk.PollHandler``: kazoo's handler with a poll-based ``select``, checked against the
contract of kazoo's own (ready objects as passed in, timeouts, bad descriptors) and on a real
ZooKeeper with pipelined requests, a watch and a dropped connection."""

from __future__ import annotations

import os
import resource
import socket
import threading
import time

import pytest
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import SequentialThreadingHandler

from kvlease.common.zk import PollHandler, make_client
from kvlease.ops.wait import wait_until


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_readable_only_once_data_arrived(pair):
    a, b = pair
    handler = PollHandler()
    assert handler.select([a], [], [], 0) == ([], [], [])
    b.send(b"x")
    readable, writable, errors = handler.select([a, b.fileno()], [], [], 1.0)
    assert readable == [a] and writable == [] and errors == []


def test_writable_objects_come_back_as_passed_and_both_lists_can_name_one_socket(pair):
    a, b = pair
    b.send(b"x")
    readable, writable, _ = PollHandler().select([a], [a, b], [], 1.0)
    assert readable == [a]
    assert writable == [a, b]


def test_a_timeout_returns_nothing_after_about_that_long(pair):
    a, _b = pair
    start = time.monotonic()
    assert PollHandler().select([a], [], [], 0.2) == ([], [], [])
    assert 0.15 <= time.monotonic() - start < 2.0


def test_no_timeout_waits_until_ready(pair):
    a, b = pair
    threading.Timer(0.2, b.send, (b"x",)).start()
    assert PollHandler().select([a], [], [], None)[0] == [a]


def test_a_peer_hanging_up_reads_as_readable(pair):
    a, b = pair
    b.close()
    assert PollHandler().select([a], [], [], 1.0)[0] == [a]


def test_bad_input_raises_what_kazoos_own_handler_raises(pair):
    a, _b = pair
    closed = socket.socket()
    closed.close()
    for handler in (PollHandler(), SequentialThreadingHandler()):
        with pytest.raises(TypeError):
            handler.select([closed], [], [], 0)
        with pytest.raises(ValueError):
            handler.select([a], [], [], -1)


def test_a_descriptor_that_is_not_open_raises_value_error():
    # the highest descriptor the process may have: a just-closed one could be reused by another thread
    fd = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1
    with pytest.raises(OSError):
        os.fstat(fd)  # not open
    for handler in (PollHandler(), SequentialThreadingHandler()):
        with pytest.raises(ValueError):
            handler.select([fd], [], [], 0)


def test_make_client_uses_it_against_real_zookeeper(zk_config):
    client = make_client(zk_config)
    try:
        assert isinstance(client.handler, PollHandler)
        client.ensure_path("/h")
        futures = [client.create_async(f"/h/n{i}", str(i).encode()) for i in range(500)]
        for f in futures:
            f.get(timeout=30)
        values = [client.get_async(f"/h/n{i}") for i in range(500)]
        assert [v.get(timeout=30)[0] for v in values] == [str(i).encode() for i in range(500)]
        fired = threading.Event()
        client.get("/h/n7", watch=lambda event: fired.set())
        client.set("/h/n7", b"changed")
        assert fired.wait(10)
        # a dropped connection: kazoo reconnects (same session) through the handler's select
        client._connection._socket.shutdown(socket.SHUT_RDWR)
        wait_until(lambda: client.get("/h/n7")[0] == b"changed", 20, "the client reconnected", interval_s=0.1,
                   retry_on=(KazooException,))  # still reconnecting
    finally:
        client.stop()
        client.close()
