"""tablet/log/waits.py: a FetchLog long poll fetches again on news, answers when ready, its wait capped."""

from __future__ import annotations

import threading
import time

import pytest

from kvlease.tablet.log.waits import MAX_WAIT_MS, LogWaits, wait_seconds

pytestmark = pytest.mark.unit


def test_the_wait_is_capped_and_ends_before_the_call_deadline():
    assert wait_seconds(0, None) == 0.0
    assert wait_seconds(-5, None) == 0.0
    assert wait_seconds(500, None) == 0.5
    assert wait_seconds(10 * MAX_WAIT_MS, None) == MAX_WAIT_MS / 1000
    assert wait_seconds(5_000, 1.2) == pytest.approx(1.0)
    assert wait_seconds(5_000, 0.1) == 0.0


def test_a_ready_answer_is_returned_at_once_and_a_fetch_error_raised():
    waits, fetched = LogWaits(), []
    assert waits.poll(lambda: fetched.append(1) or "rows", bool, 10.0) == "rows" and fetched == [1]

    def fail():
        raise ValueError("out of range")
    with pytest.raises(ValueError, match="out of range"):
        waits.poll(fail, bool, 10.0)


def test_news_makes_it_fetch_again_and_nothing_new_ends_after_the_wait():
    waits, answers = LogWaits(), iter(["", "", "new"])
    fetches = []

    def fetch():
        fetches.append(time.monotonic())
        return next(answers)

    done = threading.Event()

    def notify_twice():  # each news after the fetch before it (news earlier is simply seen by that fetch)
        for seen in (1, 2):
            while len(fetches) < seen:
                if done.wait(0.01):  # the poll ended before this fetch: nothing more to notify
                    return
            time.sleep(0.05)
            waits.notify()
    notifier = threading.Thread(target=notify_twice, daemon=True)
    notifier.start()
    t0 = time.monotonic()
    try:
        assert waits.poll(fetch, bool, 10.0) == "new"
    finally:
        done.set()
        notifier.join(5)
    assert len(fetches) == 3 and time.monotonic() - t0 < 5.0  # woken twice, not by the wait's end

    t0 = time.monotonic()
    assert waits.poll(lambda: "", bool, 0.2) == ""
    assert 0.18 <= time.monotonic() - t0 < 2.0


def test_closing_ends_waiting_polls_and_later_ones_do_not_wait():
    waits, answered = LogWaits(), []
    poll = threading.Thread(target=lambda: answered.append(waits.poll(lambda: "", bool, 30.0)), daemon=True)
    poll.start()
    time.sleep(0.1)
    waits.close()
    poll.join(5)
    assert answered == [""]
    t0 = time.monotonic()
    assert waits.poll(lambda: "", bool, 30.0) == "" and time.monotonic() - t0 < 1.0


def test_at_most_max_waiting_calls_wait_and_one_more_answers_at_once():
    waits, answered = LogWaits(max_waiting=1), []
    poll = threading.Thread(target=lambda: answered.append(waits.poll(lambda: "", bool, 30.0)))
    poll.start()
    try:
        time.sleep(0.1)
        assert waits.waiting == 1
        t0 = time.monotonic()
        assert waits.poll(lambda: "", bool, 30.0) == "" and time.monotonic() - t0 < 1.0  # the RPC threads' share
    finally:
        waits.close()
        poll.join(5)
    assert answered == [""] and waits.waiting == 0
