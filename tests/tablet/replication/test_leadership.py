"""One leadership of a replicated bucket over a real store (RocksDB and changelog in a temp dir, no processes):
writes wait for the ISR, reads wait for a new leader's HW, epochs fence, ISR changes are proposed."""

from __future__ import annotations

import itertools
import threading

import pytest

from kvlease.common import errors
from kvlease.common.tables import Column, TableInfo
from kvlease.ops.wait import wait_until
from kvlease.tablet.bucket.store import BucketStore
from kvlease.tablet.replicas.replica import Replica
from kvlease.tablet.replication.leader import Leadership
from kvlease.tablet.replication.roles import BucketRole

pytestmark = pytest.mark.unit

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1,
                  replication_factor=3, min_insync_replicas=2)


def role(isr=(1, 2, 3), epoch=4, min_insync=2) -> BucketRole:
    table = TableInfo(**{**TABLE.__dict__, "min_insync_replicas": min_insync})
    return BucketRole(table, 0, epoch, 1, "", (1, 2, 3), tuple(isr), 9)


@pytest.fixture
def store(tmp_path):
    with BucketStore.open(str(tmp_path / "b"), TABLE, segment_bytes=1 << 20, fsync=False, replicated=True) as s:
        s.become_leader(4)
        yield s


def put(store, lead, *ids):
    lead.check_write(None)
    _base, end = store.write(store.codec.to_batch([{"id": i, "v": str(i)} for i in ids]))
    lead.appended()
    return end


def found(store, *ids):
    hits, _rows = store.lookup(store.codec.to_batch([{"id": i} for i in ids]).select(["id"]))
    return hits.tolist()


def test_a_write_is_committed_once_every_isr_member_has_it(store):
    lead = Leadership(1, role(), store, now_ms=0)
    end = put(store, lead, 1, 2)
    with pytest.raises(errors.NotEnoughReplicasError, match="did not commit it"):
        lead.wait_committed(end, timeout_s=0.05)
    assert found(store, 1, 2) == [False, False]  # RocksDB holds committed data only
    assert lead.on_fetch(2, end, now_ms=1)[0] == 0  # follower 3 has not fetched: the HW waits for it
    hw, news = lead.on_fetch(3, end, now_ms=1)
    assert (hw, news) == (end, True)
    lead.wait_committed(end, timeout_s=0)
    assert found(store, 1, 2) == [True, True] and store.high_watermark == end


def test_a_leader_alone_in_its_isr_commits_at_once_and_min_insync_refuses_before_appending(store):
    alone = Leadership(1, role(isr=(1,), min_insync=1), store, now_ms=0)
    end = put(store, alone, 5)
    alone.wait_committed(end, timeout_s=0)
    assert found(store, 5) == [True]
    strict = Leadership(1, role(isr=(1,), min_insync=2), store, now_ms=0)
    with pytest.raises(errors.NotEnoughReplicasError, match="min.insync-replicas 2"):
        strict.check_write(None)
    assert store.log_end_offset == end


def test_epochs_fence_writes_and_an_ended_leadership_answers_not_leader(store):
    lead = Leadership(1, role(), store, now_ms=0)
    with pytest.raises(errors.FencedLeaderEpochError):
        lead.check_write(3)
    with pytest.raises(errors.NotLeaderError):
        lead.check_write(5)
    lead.check_write(4)
    end = put(store, lead, 1)
    outcome = []

    def waiter():
        try:
            lead.wait_committed(end, timeout_s=10)
        except errors.KvLeaseError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    lead.end()
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], errors.NotLeaderError)
    with pytest.raises(errors.NotLeaderError):
        lead.check_write(None)


def test_a_new_leader_serves_reads_once_its_hw_reached_the_log_it_took_over(store):
    first = Leadership(1, role(), store, now_ms=0)
    end = put(store, first, 1, 2, 3)  # appended, not committed: the next leader's log holds it uncommitted
    first.end()
    store.become_follower(5)
    store.become_leader(6)
    second = Leadership(1, role(epoch=6), store, now_ms=0)
    with pytest.raises(errors.LeaderNotAvailableError, match="catching up"):
        second.check_read()
    second.on_fetch(2, end, now_ms=1)
    second.on_fetch(3, end, now_ms=1)
    second.check_read()
    assert found(store, 1, 2, 3) == [True, True, True]


def test_isr_changes_shrink_a_lagging_follower_and_expand_one_fetching_at_the_hw(store):
    lead = Leadership(1, role(isr=(1, 2), min_insync=1), store, now_ms=0)
    end = put(store, lead, 1)
    lead.on_fetch(2, 0, now_ms=100)  # follower 2 stays behind
    assert lead.propose_isr_change(now_ms=500, max_lag_ms=1000) is None
    assert lead.propose_isr_change(now_ms=5000, max_lag_ms=1000) == ([1], 4, 9)
    assert lead.propose_isr_change(now_ms=5001, max_lag_ms=1000) is None  # one change in flight
    lead.isr_changed([1], 10)
    lead.wait_committed(end, timeout_s=0)  # the slow follower left: the leader alone commits
    lead.on_fetch(3, end, now_ms=5100)  # replica 3, outside the ISR, is caught up and fetching
    assert lead.propose_isr_change(now_ms=5200, max_lag_ms=1000) == ([1, 3], 4, 10)
    lead.isr_change_failed(now_ms=5200)
    assert lead.propose_isr_change(now_ms=5300, max_lag_ms=1000) is None  # backs off after a failure
    lead.on_fetch(3, end, now_ms=6200)
    assert lead.propose_isr_change(now_ms=6300, max_lag_ms=1000) == ([1, 3], 4, 10)


def test_a_fetch_that_makes_a_follower_due_to_join_the_isr_wakes_the_isr_keeper(store):
    """The ISR keeper runs its rounds every 0.2 s; a follower catching up asks for one at once (a rebuilt or
    restarted replica is back in sync without waiting for the next round), only while a change can be made."""
    due = []
    lead = Leadership(1, role(isr=(1,), min_insync=1), store, now_ms=0, on_isr_due=lambda: due.append(1))
    end = put(store, lead, 1, 2)
    lead.on_fetch(2, 0, now_ms=10)  # behind the HW: not due
    assert due == []
    lead.on_fetch(2, end, now_ms=20)  # caught up
    assert due == [1]
    assert lead.propose_isr_change(now_ms=21, max_lag_ms=1000) == ([1, 2], 4, 9)
    lead.on_fetch(3, end, now_ms=22)  # a change is in flight: the keeper proposes 3 after it
    assert due == [1]
    lead.isr_change_failed(now_ms=30)  # backs off for a second: no wake-ups meanwhile
    lead.on_fetch(3, end, now_ms=40)
    assert due == [1]
    lead.on_fetch(3, end, now_ms=1030)
    assert due == [1, 1]
    lead.isr_changed([1, 2, 3], 10)
    lead.on_fetch(3, end, now_ms=1040)  # a member: nothing to do
    assert due == [1, 1]


def test_a_refused_expansion_forgets_the_followers_it_would_have_added(store):
    """The coordinator refuses to add a server that is not live; when it comes back (perhaps on a new disk,
    holding nothing) it must fetch again before it is proposed again, not join on what it fetched before."""
    lead = Leadership(1, role(isr=(1,), min_insync=1), store, now_ms=0)
    end = put(store, lead, 1)
    lead.on_fetch(2, end, now_ms=10)
    assert lead.propose_isr_change(now_ms=20, max_lag_ms=10_000) == ([1, 2], 4, 9)
    lead.isr_change_failed(now_ms=30)  # "tablet server(s) [2] are not live"
    assert lead.view.follower(2).log_end is None
    assert lead.propose_isr_change(now_ms=2000, max_lag_ms=10_000) is None  # what it fetched is forgotten
    lead.on_fetch(2, end, now_ms=2100)  # it fetches again
    assert lead.propose_isr_change(now_ms=2200, max_lag_ms=10_000) == ([1, 2], 4, 9)


def test_a_waiting_fetch_that_looks_again_does_not_bring_back_a_follower_that_left_the_isr(store):
    """A follower's long poll waits at the leader after the follower died (its call still runs here): when it
    looks again (news of another bucket), the log end the leadership forgot when the follower left the ISR
    must stay forgotten, or the follower restarted on a wiped disk joins the ISR before it holds anything."""
    import types

    from kvlease.common.proto import tablet_pb2 as pb
    from kvlease.tablet.replication.fetch_service import ReplicaFetchService

    lead = Leadership(1, role(isr=(1, 2), min_insync=1), store, now_ms=0)
    end = put(store, lead, 1)
    replica = types.SimpleNamespace(leads=True, leadership=lambda: lead, store=store, table=TABLE, loss_work=None,
                                    uploader=types.SimpleNamespace(base=None))  # no snapshot yet
    service = ReplicaFetchService(types.SimpleNamespace(replica=lambda table_id, bucket: replica),
                                  clock_ms=itertools.count(1000).__next__)  # each look its own time
    request = pb.ReplicaFetchRequest(replica_id=2, max_wait_ms=5000, buckets=[pb.ReplicaFetchBucketPb(
        table_id=TABLE.table_id, bucket=0, fetch_offset=end, leader_epoch=4, last_fetched_epoch=-1, max_bytes=1 << 20)])
    looks = []  # each look of a fetch at the bucket: the first takes the follower's progress, later ones poll

    def counting(name):
        look = getattr(lead, name)

        def counted(*args):
            answer = look(*args)
            looks.append(name)
            return answer
        return counted
    lead.on_fetch, lead.polled = counting("on_fetch"), counting("polled")
    assert service.fetch(request).buckets[0].high_watermark == end  # caught up: the HW is told at once
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(service.fetch(request)))
    waiting.start()  # nothing new: it waits
    try:
        wait_until(lambda: len(looks) >= 2, 5, "the waiting fetch arrived (took the follower's progress)")
        lead.isr_changed([1], 10)  # the follower died: the coordinator took it out of the ISR
        assert lead.view.follower(2).log_end is None
        service.notify()  # news elsewhere: the waiting fetch looks again
        wait_until(lambda: len(looks) >= 3, 5, "the waiting fetch looked again")
        assert lead.view.follower(2).log_end is None
        assert lead.propose_isr_change(now_ms=2000, max_lag_ms=10_000) is None
    finally:
        service.close()
        waiting.join(10)
    assert answers and not waiting.is_alive()


def test_a_leader_with_loss_work_answers_its_followers_nothing_until_it_is_done(store):
    """A restored bucket's leader whose restore is not carried out and confirmed yet: its follower's fetch is
    answered LEADER_NOT_AVAILABLE, and the leadership hears nothing of it (no ISR expansion), so no follower
    joins the ISR of a leader that still owes the restore, nor copies the data the restore replaces."""
    import types

    from kvlease.common.errors import ErrorCode
    from kvlease.common.proto import tablet_pb2 as pb
    from kvlease.tablet.replicas import lost_data
    from kvlease.tablet.replication.fetch_service import ReplicaFetchService

    lead = Leadership(1, role(isr=(1,), min_insync=1), store, now_ms=0)
    end = put(store, lead, 1)
    replica = types.SimpleNamespace(leads=True, leadership=lambda: lead, store=store, table=TABLE, bucket=0,
                                    loss_work=lost_data.CONFIRM, where="bucket 0 of table db.t",
                                    details={"table_id": TABLE.table_id, "bucket": 0},
                                    uploader=types.SimpleNamespace(base=None))
    service = ReplicaFetchService(types.SimpleNamespace(replica=lambda table_id, bucket: replica),
                                  clock_ms=itertools.count(1000).__next__)
    request = pb.ReplicaFetchRequest(replica_id=2, max_wait_ms=0, buckets=[pb.ReplicaFetchBucketPb(
        table_id=TABLE.table_id, bucket=0, fetch_offset=end, leader_epoch=4, last_fetched_epoch=-1, max_bytes=1 << 20)])
    try:
        [refused] = service.fetch(request).buckets
        assert refused.error.code == ErrorCode.LEADER_NOT_AVAILABLE and not refused.entries
        assert lead.view.follower(2).log_end is None and lead.propose_isr_change(now_ms=2000, max_lag_ms=10_000) is None
        replica.loss_work = None  # confirmed: it answers
        [answered] = service.fetch(request).buckets
        assert not answered.error.code and answered.high_watermark == end
        assert lead.propose_isr_change(now_ms=3000, max_lag_ms=10_000) is not None  # the follower joins now
    finally:
        service.close()


def test_a_woken_periodic_runs_its_round_at_once_and_stops_promptly():
    from kvlease.tablet.periodic import Periodic

    class Rounds(Periodic):
        def __init__(self):
            super().__init__(interval_s=60)
            self.ran = threading.Event()

        def run_once(self):
            self.ran.set()
            return 0

    rounds = Rounds().start()
    try:
        assert not rounds.ran.wait(0.2)  # the interval is a minute
        rounds.wake()
        assert rounds.ran.wait(5)
    finally:
        rounds.stop()
    assert not rounds._thread.is_alive()


def test_a_write_committed_after_the_isr_fell_below_min_insync_is_not_acknowledged(store):
    lead = Leadership(1, role(isr=(1, 2), min_insync=2), store, now_ms=0)
    end = put(store, lead, 1)
    lead.isr_changed([1], 10)  # follower 2 left: the leader alone commits the write ...
    with pytest.raises(errors.NotEnoughReplicasError, match="fewer than min.insync-replicas 2"):
        lead.wait_committed(end, timeout_s=1)  # ... but one copy is less than the table asks for
    assert store.high_watermark == end
    lead.isr_changed([1, 2], 11)
    lead.wait_committed(end, timeout_s=0)  # a resend, once enough replicas are in sync, is answered


def test_a_push_built_before_an_isr_expansion_leaves_the_hw_waiting_for_the_follower_it_adds(store):
    """The coordinator pushes every bucket of a server when one of them changes: a push of the bucket epoch an
    expansion was proposed under, arriving before the change's answer, must not end the HW's wait for the joining
    follower. The coordinator may accept the change and at once make that follower leader (a preferred-leader
    election): a write the leader committed alone meanwhile would be acknowledged and lost (found by the chaos
    drill: docs/drills.md "What the drills found")."""
    table = TableInfo(**{**TABLE.__dict__, "min_insync_replicas": 1})

    def pushed(isr, bucket_epoch):
        return BucketRole(table, 0, 4, 1, "", (1, 2, 3), isr, bucket_epoch)

    replica = Replica(table, 0, store, uploader=None, role=pushed((1,), 9), server_id=1)
    lead = replica.leadership()
    first = put(store, lead, 1)  # the leader alone in its ISR commits at once
    lead.on_fetch(2, first, now_ms=1)  # follower 2 caught up: it may join
    assert lead.propose_isr_change(now_ms=1, max_lag_ms=10_000) == ([1, 2], 4, 9)
    later = put(store, lead, 2)
    replica.take_role(pushed((1,), 9))  # built before the change (another bucket of the server changed)
    with pytest.raises(errors.NotEnoughReplicasError, match="did not commit it"):
        lead.wait_committed(later, timeout_s=0.05)  # follower 2, perhaps the next leader, lacks it
    assert found(store, 2) == [False] and lead.view.proposed_isr == {1, 2}
    replica.take_role(pushed((1, 2), 10))  # the change accepted: the ISR it made
    assert lead.view.proposed_isr is None and lead.isr == {1, 2}
    assert lead.on_fetch(2, later, now_ms=2)[0] == later
    lead.wait_committed(later, timeout_s=0)
