"""The tablet side of a leader that cannot write: when a led bucket's failures call for a resignation
(pure, a fake clock), the short cause a failure is reported by, and its call to the coordinator resent after
its answer was lost (a stand-in coordinator on loopback)."""

from __future__ import annotations

import errno

import pytest

from kvlease.client.coordinator_caller import CoordinatorCaller
from kvlease.client.server_calls import ServerCalls
from kvlease.common.logentry import ChangelogError
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.tablet.replicas.step_down import StepDowns, cause
from kvlease.tablet.store.kvstore import BucketStoreError
from tests.client.test_admin_retry import TIMEOUT_S, LateFirstAnswer, stand_in

pytestmark = pytest.mark.unit

KEY = (7, 0)


def test_a_bucket_resigns_once_it_has_failed_for_the_timeout_and_is_failed_now():
    s = StepDowns(after_s=3.0)
    assert not s.due(KEY, True, 4, 100.0)
    assert not s.due(KEY, True, 4, 102.9)
    assert not s.due(KEY, False, 4, 103.0)  # reopened just now: nothing to resign while it works
    assert not s.due(KEY, False, 4, 103.1, failed_between=True)  # failed and reopened between two looks
    assert s.due(KEY, True, 4, 103.2)  # failed again right after: the same streak
    s.resigned(KEY, 4)
    assert not s.due(KEY, True, 4, 104.0)  # asked and taken for that epoch: the push makes it a follower


def test_a_failure_cleared_for_the_timeout_ends_the_streak():
    s = StepDowns(after_s=3.0)
    assert not s.due(KEY, True, 4, 100.0)
    assert not s.due(KEY, False, 4, 101.0, failed_between=True)  # a failure between two looks keeps it going
    assert not s.due(KEY, False, 4, 103.0)
    assert s.failing() == {KEY}
    assert not s.due(KEY, False, 4, 104.0)  # no failure for 3 s: over
    assert s.failing() == set()
    assert not s.due(KEY, True, 4, 104.5)  # a new failure starts a new streak
    assert not s.due(KEY, True, 4, 107.4)
    assert s.due(KEY, True, 4, 107.5)


def test_a_refused_resignation_is_asked_again_after_the_timeout():
    s = StepDowns(after_s=3.0)
    s.due(KEY, True, 4, 100.0)
    assert s.due(KEY, True, 4, 103.0)
    s.refused(KEY, 103.0)  # no other in-sync replica (or the coordinator was away)
    assert not s.due(KEY, True, 4, 105.9)
    assert s.due(KEY, True, 4, 106.0)


def test_a_bucket_led_again_starts_a_new_streak():
    s = StepDowns(after_s=3.0)
    s.due(KEY, True, 4, 100.0)
    assert s.due(KEY, True, 4, 103.0)
    s.resigned(KEY, 4)
    s.keep(set())  # it follows now
    assert s.failing() == set()
    assert not s.due(KEY, True, 6, 110.0)  # elected back at epoch 6 (its writes worked meanwhile), failing again
    assert s.due(KEY, True, 6, 113.0)


@pytest.mark.parametrize("failure, expected", [
    (ChangelogError("changelog /d/log: write failed: [Errno 28] No space left on device"),
     "ENOSPC: No space left on device"),
    (BucketStoreError("cannot open RocksDB /d/kv: IO error: No space left on device: While appending to file: "
                      "/d/kv/MANIFEST-000015: No space left on device"), "ENOSPC: No space left on device"),
    (OSError(errno.EIO, "Input/output error"), "EIO: Input/output error"),
    (OSError(errno.EROFS, "Read-only file system"), "EROFS: Read-only file system"),
    (ValueError("x" * 300), "x" * 120),
    (None, "unknown"),
], ids=["changelog-enospc", "rocksdb-enospc", "eio", "erofs", "other", "none"])
def test_a_failure_is_named_by_its_errno(failure, expected):
    assert cause(failure) == expected


def test_a_failure_raised_from_an_oserror_is_named_by_it():
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as exc:
            raise BucketStoreError("bucket /d: applying failed") from exc
    except BucketStoreError as wrapped:
        assert cause(wrapped) == "EDQUOT: Disk quota exceeded"


class LateResignation(LateFirstAnswer):
    def ResignLeadership(self, request, context):
        self._count("ResignLeadership", context)  # the resent call finds the leadership over: the current state
        return pb.ResignLeadershipResponse(buckets=[pb.ResignedBucketPb(bucket=pb.BucketAssignmentPb(
            bucket=0, leader_id=2, leader_epoch=5, replicas=[1, 2], isr=[2]))])


def test_a_resignation_whose_answer_was_lost_is_sent_again():
    servicer = LateResignation()
    with stand_in(servicer) as address, CoordinatorCaller([address], request_timeout_s=TIMEOUT_S,
                                                          retry_total_s=10) as caller:
        [answer] = ServerCalls(caller.call).resign_leadership(1, [(7, 0, 4, "ENOSPC")])
    assert servicer.calls["ResignLeadership"] == 2
    assert (answer.table_id, answer.bucket, answer.state.leader_id, answer.state.isr, answer.refused,
            answer.error) == (7, 0, 2, (2,), "", None)
