"""client.coalescing.Coalescer: concurrent calls travel together, each keeps its own outcome."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvlease.client.coalescing import BatchInterrupted, Coalescer
from kvlease.ops.wait import wait_until

pytestmark = pytest.mark.unit


class Gate:
    """send functions that record what they were sent and block until opened."""

    def __init__(self, fail_many: BaseException | None = None) -> None:
        self.sent: list[tuple[str, list]] = []
        self.open = threading.Event()
        self.lock = threading.Lock()
        self.fail_many = fail_many

    def one(self, request):
        with self.lock:
            self.sent.append(("one", [request]))
        self.open.wait(10)
        if request < 0:
            raise ValueError(f"bad {request}")
        return request * 10

    def many(self, requests):
        with self.lock:
            self.sent.append(("many", list(requests)))
        self.open.wait(10)
        if self.fail_many is not None:
            raise self.fail_many
        return [ValueError(f"bad {r}") if r < 0 else r * 10 for r in requests]


def test_a_lone_call_is_sent_at_once_and_alone():
    gate = Gate()
    gate.open.set()
    c = Coalescer(gate.one, gate.many)
    assert c.call(4) == 40
    with pytest.raises(ValueError, match="bad -1"):
        c.call(-1)
    assert gate.sent == [("one", [4]), ("one", [-1])]


def test_calls_made_while_the_slots_are_busy_go_as_one_batch_each_with_its_own_outcome():
    gate = Gate()
    c = Coalescer(gate.one, gate.many, max_in_flight=2)
    with ThreadPoolExecutor(8) as pool:
        first = [pool.submit(c.call, r) for r in (1, 2)]  # both go alone: two slots
        wait_until(lambda: len(gate.sent) == 2, 10, "both sent", interval_s=0.002)
        queued = []
        for r in (3, -4, 5, 6):  # queued in this order
            queued.append(pool.submit(c.call, r))
            wait_until(lambda: c.waiting() == len(queued), 10, f"{r} queued", interval_s=0.002)
        assert len(gate.sent) == 2  # nothing else sent while both slots are busy
        gate.open.set()
        assert [f.result(10) for f in first] == [10, 20]
        assert [f.result(10) for f in queued if f is not queued[1]] == [30, 50, 60]
        with pytest.raises(ValueError, match="bad -4"):
            queued[1].result(10)
    assert sorted(r for _kind, rs in gate.sent for r in rs) == [-4, 1, 2, 3, 5, 6]
    assert ("many", [3, -4, 5, 6]) in gate.sent  # the queued calls went together, in their order
    assert c.waiting() == 0


def test_a_batch_that_fails_as_a_whole_fails_each_of_its_calls_and_the_next_calls_still_go():
    gate = Gate(fail_many=ConnectionError("lost"))
    c = Coalescer(gate.one, gate.many, max_in_flight=1)
    with ThreadPoolExecutor(4) as pool:
        head = pool.submit(c.call, 1)
        wait_until(lambda: len(gate.sent) == 1, 10, "the first sent", interval_s=0.002)
        tail = []
        for r in (2, 3):
            tail.append(pool.submit(c.call, r))
            wait_until(lambda: c.waiting() == len(tail), 10, f"{r} queued", interval_s=0.002)
        gate.open.set()
        assert head.result(10) == 10
        for f in tail:
            with pytest.raises(ConnectionError, match="lost"):
                f.result(10)
    gate.fail_many = None
    assert c.call(7) == 70  # no slot was lost
    assert c.waiting() == 0


class Stop(BaseException):
    """Stands for KeyboardInterrupt / SystemExit in the thread sending a batch."""


def test_a_sender_stopped_mid_batch_leaves_the_others_an_unknown_outcome_and_frees_its_slot():
    gate = Gate(fail_many=Stop())
    c = Coalescer(gate.one, gate.many, max_in_flight=1)

    def call(r):
        try:
            return c.call(r)
        except Stop:
            return "stopped"
    with ThreadPoolExecutor(4) as pool:
        head = pool.submit(c.call, 1)
        wait_until(lambda: len(gate.sent) == 1, 10, "the first sent", interval_s=0.002)
        tail = [pool.submit(call, r) for r in (2, 3)]
        wait_until(lambda: c.waiting() == 2, 10, "both queued", interval_s=0.002)
        gate.open.set()
        assert head.result(10) == 10
        outcomes = []
        for f in tail:
            try:
                outcomes.append(f.result(10))
            except BatchInterrupted as exc:
                outcomes.append("unknown" if "outcome is unknown" in str(exc) else str(exc))
    assert sorted(outcomes) == ["stopped", "unknown"]  # the sender gets its Stop, the other an unknown outcome
    gate.fail_many = None
    assert c.call(7) == 70 and c.waiting() == 0


def test_batches_are_cut_at_max_batch():
    gate = Gate()
    c = Coalescer(gate.one, gate.many, max_batch=3, max_in_flight=1)
    with ThreadPoolExecutor(10) as pool:
        head = pool.submit(c.call, 0)
        wait_until(lambda: len(gate.sent) == 1, 10, "the first sent", interval_s=0.002)
        rest = []
        for r in range(1, 8):  # queued in this order
            rest.append(pool.submit(c.call, r))
            wait_until(lambda: c.waiting() == r, 10, f"{r} queued", interval_s=0.002)
        gate.open.set()
        assert [f.result(10) for f in [head, *rest]] == [r * 10 for r in range(8)]
    assert gate.sent == [("one", [0]), ("many", [1, 2, 3]), ("many", [4, 5, 6]), ("one", [7])]


def test_many_threads_each_get_their_own_answer():
    gate = Gate()
    gate.open.set()
    sizes: list[int] = []

    def one(request):
        time.sleep(0.001)  # a round trip: the other threads queue meanwhile
        return gate.one(request)

    def many(requests):
        sizes.append(len(requests))
        time.sleep(0.001)  # a round trip
        return gate.many(requests)

    c = Coalescer(one, many)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(c.call, range(2000)))
    assert results == [r * 10 for r in range(2000)]
    assert sizes and max(sizes) > 1  # some did travel together
    assert c.waiting() == 0


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        Coalescer(lambda r: r, lambda rs: rs, max_batch=0)
    with pytest.raises(ValueError):
        Coalescer(lambda r: r, lambda rs: rs, max_in_flight=0)
