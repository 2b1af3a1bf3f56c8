"""ops/wait.py: the one polling helper of ops and the tests, and the one wait for a table's replicas in sync."""

from __future__ import annotations

import types

import pytest

from kvlease.ops.wait import NotReached, out_of_sync, poll, wait_in_sync, wait_until


def counter(ready_at: int):
    calls = []

    def predicate():
        calls.append(1)
        return len(calls) if len(calls) >= ready_at else 0
    return predicate, calls


@pytest.mark.unit
def test_poll_returns_the_first_truthy_value_or_the_last_one_seen():
    predicate, calls = counter(3)
    assert poll(predicate, 5, interval_s=0) == (3, True) and len(calls) == 3
    assert poll(lambda: [], 0, interval_s=0) == ([], False)


@pytest.mark.unit
def test_wait_until_names_what_was_awaited_and_the_last_value():
    assert wait_until(counter(2)[0], 5, "two calls", interval_s=0) == 2
    with pytest.raises(NotReached, match=r"the answer: not reached within 0.01s \(last: \{\}\)") as info:
        wait_until(dict, 0.01, "the answer")
    with pytest.raises(NotReached, match=r"the answer: not reached within 0.01s \(last: 0\)"):
        wait_until(lambda: 0, 0.01, "the answer", interval_s=0)
    assert isinstance(info.value, AssertionError)


@pytest.mark.unit
def test_wait_until_counts_the_exceptions_it_is_given_as_not_yet_and_names_the_last_one():
    calls = []

    def refused(times: int):
        def call():
            calls.append(1)
            if len(calls) <= times:
                raise PermissionError(f"refused {len(calls)}")
            return "allowed"
        return call
    assert wait_until(refused(2), 5, "allowed", interval_s=0, retry_on=(PermissionError,)) == "allowed"
    assert len(calls) == 3
    last = r"allowed: not reached within 0.01s \(last: PermissionError\('refused \d+'\)\)"
    with pytest.raises(NotReached, match=last) as info:
        wait_until(refused(10 ** 6), 0.01, "allowed", interval_s=0.005, retry_on=(PermissionError,))
    assert isinstance(info.value.__cause__, PermissionError)
    with pytest.raises(PermissionError):  # an exception not named ends the wait
        wait_until(refused(10 ** 6), 5, "allowed", retry_on=(KeyError,))


def bucket(isr, replicas=(1, 2, 3), leader="127.0.0.1:1", leader_id=1):
    return types.SimpleNamespace(isr=tuple(isr), replicas=tuple(replicas), leader_address=leader, leader_id=leader_id)


class Admin:
    def __init__(self, states):
        self.states = list(states)

    def get_table_assignment(self, table_id):
        return None, self.states.pop(0) if len(self.states) > 1 else self.states[0]


@pytest.mark.unit
def test_out_of_sync_names_each_lagging_bucket():
    state = {0: bucket((1, 2, 3)), 1: bucket((1,)), 2: bucket((1, 2, 3), leader="")}
    assert out_of_sync(state) == ["bucket 1: in-sync replicas [1] of [1, 2, 3]",
                                  "bucket 2: in-sync replicas [1, 2, 3] of [1, 2, 3], no live leader"]


@pytest.mark.unit
def test_wait_in_sync_polls_until_nothing_lags_or_gives_what_still_lags():
    lagging, in_sync = {0: bucket((1,))}, {0: bucket((1, 2, 3))}
    state, behind, took = wait_in_sync(Admin([lagging, lagging, in_sync]), 7, 5, interval_s=0)
    assert state == in_sync and behind == [] and took is not None
    state, behind, took = wait_in_sync(Admin([lagging]), 7, 0.01, interval_s=0)
    assert state == lagging and behind == ["bucket 0: in-sync replicas [1] of [1, 2, 3]"] and took is None
    state, behind, took = wait_in_sync(Admin([lagging]), 7, 1, lagging=lambda s: [], interval_s=0)
    assert took is not None and behind == []
