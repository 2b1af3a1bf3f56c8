"""A commit's log-end check (coordinator/snapshot_checks.py LeaderLogEnds) takes the leader's answer as it
comes: a whole-request error (a leader that has not taken the push naming its partition yet answers
NOT_LEADER) is that error, retriable, not a crash of the commit."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.proto import tablet_pb2
from kvlease.common.wire import error_pb
from kvlease.coordinator.snapshot_checks import LeaderLogEnds

pytestmark = pytest.mark.unit

HANDLE = SnapshotHandle(TableBucket(7, 1, 12), 3, 40, "m")


class Leader:
    """The leader's ListOffsets, answering ``response``."""

    def __init__(self, response) -> None:
        self.response = response

    def ListOffsets(self, request, timeout):
        assert (request.table_id, request.partition_id, list(request.buckets)) == (7, 12, [1])
        return self.response


def check(response) -> None:
    ends = LeaderLogEnds()
    ends._channels.stub = lambda address, cls: Leader(response)
    try:
        ends.check(HANDLE, "leader:1")
    finally:
        ends.close()


def test_a_leader_that_does_not_hold_the_partition_yet_is_not_leader():
    not_yet = errors.NotLeaderError("this tablet server holds no bucket of partition 12: retry on the leader")
    with pytest.raises(errors.NotLeaderError) as caught:
        check(tablet_pb2.ListOffsetsResponse(error=error_pb(not_yet)))
    assert isinstance(caught.value, errors.RetriableError)


def test_an_answer_without_the_bucket_is_leader_not_available():
    with pytest.raises(errors.LeaderNotAvailableError):
        check(tablet_pb2.ListOffsetsResponse())


def test_the_bucket_s_own_answer_decides():
    check(tablet_pb2.ListOffsetsResponse(offsets=[tablet_pb2.BucketOffsetsPb(bucket=1, latest=40)]))
    with pytest.raises(errors.InvalidSnapshotError, match="beyond the bucket's changelog end 39"):
        check(tablet_pb2.ListOffsetsResponse(offsets=[tablet_pb2.BucketOffsetsPb(bucket=1, latest=39)]))
    with pytest.raises(errors.NotLeaderError):
        check(tablet_pb2.ListOffsetsResponse(offsets=[tablet_pb2.BucketOffsetsPb(
            bucket=1, error=error_pb(errors.NotLeaderError("not the leader")))]))
