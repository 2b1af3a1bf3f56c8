"""Tier 1: the pure scanner-session state machine (tablet/scan/manager.py) on a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.tablet.scan import manager as scan
from kvlease.tablet.scan.manager import (OPEN_CALL, Close, CloseAll, CloseBucket, Continue, Failed, Open, Refuse,
                                         Release, Replay, ScannerManager, Serve, Served, Tick)

pytestmark = pytest.mark.unit

B0, B1 = TableBucket(1, 0), TableBucket(1, 1)
TTL = 1000


def manager(per_bucket=8, per_server=200, ttl=TTL) -> ScannerManager:
    return ScannerManager(per_bucket, per_server, ttl)


def run(m: ScannerManager, *events) -> list[object]:
    out = m.handle(*events)
    m.validate()
    return out


def refused(out, error_cls) -> bool:
    return len(out) >= 1 and isinstance(out[-1], Refuse) and type(out[-1].error) is error_cls


def opened(m, sid=b"s1", bucket=B0, limit=None, now=0, rows=1, has_more=True):
    """Open ``sid`` and serve its first batch."""
    assert run(m, Open(sid, bucket, limit, now)) == [Serve(sid, OPEN_CALL, limit)]
    return run(m, Served(sid, OPEN_CALL, rows, has_more, now))


# --- request forms ------------------------------------------------------------------------

@pytest.mark.parametrize("has_open,has_id,close,size,limit,kind", [
    (True, False, False, 1, None, scan.OPEN),
    (True, False, False, 1, 0, scan.OPEN),
    (False, True, False, 1, None, scan.CONTINUE),
    (False, True, True, 0, None, scan.CLOSE),  # a close needs no batch size
    (False, True, True, -5, None, scan.CLOSE),
])
def test_request_kinds(has_open, has_id, close, size, limit, kind):
    assert scan.request_kind(has_open, has_id, close, size, limit) == kind


@pytest.mark.parametrize("has_open,has_id,close,size,limit", [
    (True, True, False, 1, None),    # both
    (False, False, False, 1, None),  # neither
    (False, False, True, 1, None),   # close without an id
    (True, False, True, 1, None),    # close with bucket_scan_req
    (True, False, False, 0, None),   # open without a batch size
    (False, True, False, 0, None),   # continue without a batch size
    (False, True, False, -1, None),
    (True, False, False, 1, -1),     # negative limit
])
def test_invalid_request_forms(has_open, has_id, close, size, limit):
    with pytest.raises(errors.InvalidScanRequestError):
        scan.request_kind(has_open, has_id, close, size, limit)


# --- open, continue, replay, close ------------------------------------------------------------

def test_open_serves_the_first_batch_then_continuations_count_from_zero():
    m = manager()
    assert opened(m) == []
    assert run(m, Continue(b"s1", 0, 10)) == [Serve(b"s1", 0, None)]
    assert run(m, Served(b"s1", 0, 5, True, 10)) == []
    assert run(m, Continue(b"s1", 1, 20)) == [Serve(b"s1", 1, None)]
    assert run(m, Served(b"s1", 1, 5, False, 20)) == [Release(b"s1", B0, scan.FINISHED)]
    assert m.open_count() == 0 and m.per_bucket == {}
    assert refused(run(m, Continue(b"s1", 2, 30)), errors.UnknownScannerIdError)


def test_an_empty_bucket_registers_no_session():
    m = manager()
    assert opened(m, rows=0, has_more=False) == [Release(b"s1", B0, scan.FINISHED)]
    assert m.open_count() == 0


def test_the_open_is_not_a_call_seq():
    m = manager()
    opened(m)
    assert refused(run(m, Continue(b"s1", OPEN_CALL, 1)), errors.InvalidScanRequestError)  # no replay of the open
    assert refused(run(m, Continue(b"s1", 1, 1)), errors.InvalidScanRequestError)
    assert run(m, Continue(b"s1", 0, 1)) == [Serve(b"s1", 0, None)]


def test_resending_the_last_call_replays_it_other_numbers_are_invalid_and_the_session_stays():
    m = manager()
    opened(m)
    run(m, Continue(b"s1", 0, 1), Served(b"s1", 0, 3, True, 1))
    assert run(m, Continue(b"s1", 0, 2)) == [Replay(b"s1", 0)]
    assert run(m, Continue(b"s1", 0, 3)) == [Replay(b"s1", 0)]
    for bad in (-1, 2, 7, -100):
        assert refused(run(m, Continue(b"s1", bad, 4)), errors.InvalidScanRequestError)
    assert run(m, Continue(b"s1", 1, 5)) == [Serve(b"s1", 1, None)]


def test_the_last_batch_replays_after_the_session_ended():
    m = manager()
    opened(m)
    run(m, Continue(b"s1", 0, 1))
    assert run(m, Served(b"s1", 0, 2, False, 1)) == [Release(b"s1", B0, scan.FINISHED)]
    assert m.open_count() == 0
    assert run(m, Continue(b"s1", 0, 2)) == [Replay(b"s1", 0)]
    assert refused(run(m, Continue(b"s1", 1, 2)), errors.UnknownScannerIdError)
    assert refused(run(m, Continue(b"s1", 0, 1 + 2 * TTL + 1)), errors.UnknownScannerIdError)
    # a scan answered whole by its open has no call to replay
    opened(m, b"s2", has_more=False)
    assert refused(run(m, Continue(b"s2", OPEN_CALL, 3)), errors.UnknownScannerIdError)
    assert b"s2" not in m.gone


def test_a_concurrent_request_is_refused_without_ending_the_session():
    m = manager()
    opened(m)
    assert run(m, Continue(b"s1", 0, 1)) == [Serve(b"s1", 0, None)]
    for seq in (0, 1, -1):
        out = run(m, Continue(b"s1", seq, 2))
        assert refused(out, errors.InvalidScanRequestError) and "in progress" in out[-1].error.message
    assert run(m, Served(b"s1", 0, 1, True, 3)) == []
    assert run(m, Continue(b"s1", 1, 4)) == [Serve(b"s1", 1, None)]


def test_limit_caps_the_rows_of_every_serve_and_ends_the_session():
    m = manager()
    opened(m, limit=10, rows=4)
    assert run(m, Continue(b"s1", 0, 1)) == [Serve(b"s1", 0, 6)]
    assert run(m, Served(b"s1", 0, 6, True, 1)) == [Release(b"s1", B0, scan.FINISHED)]
    m2 = manager()
    assert opened(m2, limit=0, rows=0, has_more=False) == [Release(b"s1", B0, scan.FINISHED)]


def test_close_releases_and_an_unknown_close_succeeds():
    m = manager()
    opened(m)
    assert run(m, Close(b"s1", 1)) == [Release(b"s1", B0, scan.CLOSED)]
    assert run(m, Close(b"s1", 2)) == []
    assert run(m, Close(b"never", 2)) == []
    assert refused(run(m, Continue(b"s1", 0, 3)), errors.UnknownScannerIdError)


def test_close_during_a_call_takes_effect_when_it_ends():
    m = manager()
    opened(m)
    run(m, Continue(b"s1", 0, 1))
    assert run(m, Close(b"s1", 2)) == []
    assert m.open_count() == 1  # its snapshot is still being read
    assert refused(run(m, Continue(b"s1", 1, 2)), errors.UnknownScannerIdError)
    assert run(m, Served(b"s1", 0, 1, True, 3)) == [Release(b"s1", B0, scan.CLOSED)]


def test_a_failed_call_ends_the_session():
    m = manager()
    opened(m)
    run(m, Continue(b"s1", 0, 1))
    assert run(m, Failed(b"s1", 0, 2)) == [Release(b"s1", B0, scan.FAILED)]
    m2 = manager()
    run(m2, Open(b"s2", B0, None, 0))
    assert run(m2, Failed(b"s2", OPEN_CALL, 1)) == [Release(b"s2", B0, scan.FAILED)]
    assert m2.open_count() == 0


def test_an_outcome_for_a_call_not_in_flight_is_a_shell_bug():
    m = manager()
    opened(m)
    with pytest.raises(AssertionError):
        m.handle(Served(b"s1", 0, 1, True, 1))


# --- limits ---------------------------------------------------------------------------------

def test_per_bucket_and_per_server_limits():
    m = manager(per_bucket=2, per_server=3)
    opened(m, b"a", B0)
    opened(m, b"b", B0)
    assert refused(run(m, Open(b"c", B0, None, 0)), errors.TooManyScannersError)
    opened(m, b"c", B1)
    assert refused(run(m, Open(b"d", B1, None, 0)), errors.TooManyScannersError)  # the server is full
    run(m, Close(b"a", 1))
    assert run(m, Open(b"d", B0, None, 1)) == [Serve(b"d", OPEN_CALL, None)]  # a reserved open counts
    assert refused(run(m, Open(b"e", B1, None, 1)), errors.TooManyScannersError)


def test_per_bucket_counts_drop_their_entry_at_zero():
    m = manager()
    for i in range(50):
        opened(m, bytes([i]), TableBucket(i, 0))
        run(m, Close(bytes([i]), 1))
    assert m.per_bucket == {}


# --- expiry -------------------------------------------------------------------------------------

def test_idle_past_the_ttl_expires_on_access():
    m = manager()
    opened(m, now=0)
    out = run(m, Continue(b"s1", 0, TTL + 1))
    assert out[0] == Release(b"s1", B0, scan.EXPIRED) and refused(out, errors.ScannerExpiredError)
    assert refused(run(m, Continue(b"s1", 0, TTL + 2)), errors.ScannerExpiredError)
    # at exactly the ttl it is still alive
    m2 = manager()
    opened(m2, now=0)
    assert run(m2, Continue(b"s1", 0, TTL)) == [Serve(b"s1", 0, None)]


def test_every_served_call_and_replay_refreshes_the_idle_time():
    m = manager()
    opened(m, now=0)
    run(m, Continue(b"s1", 0, 900), Served(b"s1", 0, 1, True, 900))
    assert run(m, Continue(b"s1", 0, 1800)) == [Replay(b"s1", 0)]
    assert run(m, Continue(b"s1", 1, 2700)) == [Serve(b"s1", 1, None)]


def test_the_reaper_expires_idle_sessions_not_busy_ones():
    m = manager()
    opened(m, b"idle", now=0)
    opened(m, b"busy", now=0)
    opened(m, b"fresh", now=0)
    run(m, Continue(b"busy", 0, 0))
    run(m, Continue(b"fresh", 0, 500), Served(b"fresh", 0, 1, True, 500))
    assert run(m, Tick(TTL + 1)) == [Release(b"idle", B0, scan.EXPIRED)]
    assert m.open_count() == 2
    assert refused(run(m, Continue(b"idle", 0, TTL + 2)), errors.ScannerExpiredError)


def test_expired_ids_answer_expired_for_two_ttls_then_unknown():
    m = manager()
    opened(m, now=0)
    run(m, Tick(TTL + 1))
    assert refused(run(m, Continue(b"s1", 0, 3 * TTL + 1)), errors.ScannerExpiredError)
    assert refused(run(m, Continue(b"s1", 0, 3 * TTL + 2)), errors.UnknownScannerIdError)  # even before a prune
    run(m, Tick(3 * TTL + 2))
    assert m.gone == {}


# --- leadership -----------------------------------------------------------------------------

def test_closing_a_bucket_ends_its_sessions_with_not_leader():
    m = manager()
    opened(m, b"a", B0)
    opened(m, b"b", B1)
    assert run(m, CloseBucket(B0, 5)) == [Release(b"a", B0, scan.NOT_LEADER)]
    assert refused(run(m, Continue(b"a", 0, 6)), errors.NotLeaderError)
    assert run(m, Continue(b"b", 0, 6)) == [Serve(b"b", 0, None)]
    assert refused(run(m, Continue(b"a", 0, 5 + 2 * TTL + 1)), errors.UnknownScannerIdError)


def test_closing_a_bucket_during_a_call_ends_the_session_when_the_call_ends():
    m = manager()
    opened(m, b"a", B0)
    run(m, Continue(b"a", 0, 1))
    assert run(m, CloseBucket(B0, 2)) == []
    assert refused(run(m, Continue(b"a", 1, 3)), errors.NotLeaderError)
    assert run(m, Served(b"a", 0, 1, True, 3)) == [Release(b"a", B0, scan.NOT_LEADER)]
    # an open in flight too
    run(m, Open(b"o", B0, None, 4))
    assert run(m, CloseBucket(B0, 5)) == []
    assert run(m, Served(b"o", OPEN_CALL, 1, True, 6)) == [Release(b"o", B0, scan.NOT_LEADER)]
    assert refused(run(m, Continue(b"o", 0, 7)), errors.NotLeaderError)


def test_close_all():
    m = manager()
    opened(m, b"a", B0)
    opened(m, b"b", B1)
    run(m, Continue(b"b", 0, 1))
    assert run(m, CloseAll(2)) == [Release(b"a", B0, scan.SHUTDOWN)]
    assert run(m, Failed(b"b", 0, 3)) == [Release(b"b", B1, scan.SHUTDOWN)]
    assert m.open_count() == 0


# --- random sequences --------------------------------------------------------------------------

IDS = [b"a", b"b", b"c", b"d"]
BUCKETS = [B0, B1]
event_st = st.one_of(
    st.tuples(st.just("open"), st.sampled_from(IDS), st.sampled_from(BUCKETS), st.one_of(st.none(), st.integers(0, 5))),
    st.tuples(st.just("continue"), st.sampled_from(IDS), st.integers(-2, 4)),
    st.tuples(st.just("close"), st.sampled_from(IDS)),
    st.tuples(st.just("finish"), st.sampled_from(IDS), st.integers(0, 3), st.booleans(), st.booleans()),
    st.tuples(st.just("tick"),),
    st.tuples(st.just("close_bucket"), st.sampled_from(BUCKETS)),
    st.tuples(st.just("wait"), st.integers(0, 2 * TTL)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(event_st, max_size=60))
def test_random_sequences_keep_the_invariants(steps):
    """Any sequence, with the shell's own calls (Served/Failed) only for calls in flight:
    invariants hold after every step, every Serve is for the next call, and a session's
    calls are answered at most once each."""
    m = manager(per_bucket=2, per_server=3)
    now = 0
    in_flight: dict[bytes, tuple[int, int | None]] = {}  # id -> (call, max_rows) the shell is serving
    released: set[bytes] = set()
    for step in steps:
        kind = step[0]
        if kind == "open":
            if step[1] in m.sessions or step[1] in released:
                continue  # the shell never reuses an id
            out = run(m, Open(step[1], step[2], step[3], now))
        elif kind == "continue":
            out = run(m, Continue(step[1], step[2], now))
        elif kind == "close":
            out = run(m, Close(step[1], now))
        elif kind == "finish":
            if step[1] not in in_flight:
                continue
            call, max_rows = in_flight.pop(step[1])
            rows = step[2] if max_rows is None else min(step[2], max_rows)
            event = Failed(step[1], call, now) if step[4] else Served(step[1], call, rows, step[3], now)
            out = run(m, event)
        elif kind == "tick":
            out = run(m, Tick(now))
        elif kind == "close_bucket":
            out = run(m, CloseBucket(step[1], now))
        else:
            now += step[1]
            continue
        for ins in out:
            if isinstance(ins, Serve):
                assert ins.scanner_id not in in_flight
                session = m.sessions[ins.scanner_id]
                assert ins.call == session.next_call()
                assert ins.max_rows is None or ins.max_rows >= 0
                in_flight[ins.scanner_id] = (ins.call, ins.max_rows)
            elif isinstance(ins, Release):
                assert ins.scanner_id not in in_flight, "released while its call is in flight"
                assert ins.scanner_id not in m.sessions
                released.add(ins.scanner_id)
            elif isinstance(ins, Replay):
                if ins.scanner_id in m.sessions:
                    assert m.sessions[ins.scanner_id].last_call == ins.call
                else:
                    assert m.gone[ins.scanner_id][::2] == (scan.FINISHED, ins.call)
        assert set(in_flight) == {sid for sid, s in m.sessions.items() if s.in_flight is not None}


@pytest.mark.unit
def test_the_scan_service_refuses_an_instruction_it_does_not_carry_out():
    from kvlease.common.config import Config
    from kvlease.common.statemachine import Instruction, UnhandledError
    from kvlease.tablet.scan.service import ScanService

    class Unknown(Instruction):
        pass

    class NoReplicas:
        close_listeners: list = []

    service = ScanService(NoReplicas(), Config(env={}))
    try:
        assert service._run(scan.Tick(0)) == []  # the known path still works
        service.manager.handle = lambda event: [Unknown()]
        with pytest.raises(UnhandledError, match="Unknown"):
            service._run(scan.Tick(0))
        del service.manager.handle  # the manager's own handle again, for close()
    finally:
        service.close()
