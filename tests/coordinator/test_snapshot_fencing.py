"""A deposed leader's snapshot is refused, after a data loss or a clean leader change
(coordinator/snapshot_checks.py ``check_epoch``): the pure check, then a real controller on a real ZooKeeper (an
unclean election, then commits of both sides), then the wire (``CommitKvSnapshotRequest.leader_epoch``/
``server_id``) on a real coordinator over gRPC."""

from __future__ import annotations

import time

import pytest

from kvlease.common import errors, zkpaths
from kvlease.common.data_loss import RESTORE, UNCLEAN, DataLoss
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
from kvlease.coordinator import requests as rq
from kvlease.coordinator.assignment import BucketAssignment
from kvlease.coordinator.snapshot_checks import check_epoch
from tests.coordinator.test_assignment import call
from tests.coordinator.test_coordinator_service import client, pair, table  # noqa: F401  (fixtures)
from tests.coordinator.test_data_loss_zk import register
from tests.coordinator.test_replication import create, make_ctrl, states  # noqa: F401  (fixture)
from tests.support.snapshot_manifests import snapshot

HANDLE = SnapshotHandle(TableBucket(9, 0), 7, 70, "kv/9/0/snap-7/_METADATA")


def state(*losses: DataLoss, leader_epoch: int = 6) -> BucketAssignment:
    return BucketAssignment(leader=2, leader_epoch=leader_epoch, replicas=(1, 2), isr=(2,), bucket_epoch=9,
                            losses=losses)


@pytest.mark.unit
def test_an_epoch_older_than_the_latest_loss_is_fenced_naming_the_loss():
    lost = state(DataLoss(RESTORE, 3, 0), DataLoss(UNCLEAN, 5, 40, newest_snapshot_id=6))
    with pytest.raises(errors.FencedLeaderEpochError, match="leader epoch 4, before the bucket's data loss at "
                                                            "leader epoch 5") as refused:
        check_epoch(HANDLE, lost, 4, 1)
    assert refused.value.details["leader_epoch"] == 6
    check_epoch(HANDLE, lost, 6, 2)  # the bucket's own epoch
    check_epoch(HANDLE, lost, None, None)  # an older tablet server says nothing: taken as before


@pytest.mark.unit
def test_any_epoch_older_than_the_buckets_is_a_deposed_leaders():
    """A clean leader change or a move bumps the epoch: a snapshot its old leader takes (a zombie resumed after
    a pause, one that has not heard yet) is refused; the new leader takes the next one (issue 39)."""
    for epoch, losses in ((5, ()), (1, ()), (3, (DataLoss(RESTORE, 2, 0),))):  # after the loss, before the change
        with pytest.raises(errors.FencedLeaderEpochError, match=f"taken under leader epoch {epoch}, the bucket is "
                                                                r"led at epoch 6 now \(by tablet server 2\): a "
                                                                "deposed leader's snapshot") as refused:
            check_epoch(HANDLE, state(*losses), epoch, 1)
        assert refused.value.details["leader_epoch"] == 6
    check_epoch(HANDLE, state(), 6, 2)


@pytest.mark.unit
def test_a_server_that_is_not_a_replica_is_fenced():
    with pytest.raises(errors.FencedLeaderEpochError, match="tablet server 3 is not one of the bucket's "
                                                            r"replicas \[1, 2\]"):
        check_epoch(HANDLE, state(), 6, 3)


def _handle(table_id: int, sid: int, log_offset: int) -> SnapshotHandle:
    return SnapshotHandle(TableBucket(table_id, 0), sid, log_offset, f"kv/{table_id}/0/snap-{sid}/_METADATA",
                          (SnapshotFile(f"kv/{table_id}/0/shared/{sid}.sst", 1),))


def _kept(ctrl, table_id: int) -> list[int]:
    return [h.snapshot_id for h, _l, _r in call(ctrl, rq.ListSnapshots(table_id))]


@pytest.mark.zk
def test_a_zombie_leaders_commit_after_an_unclean_election_is_refused(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, {1: "d1", 2: "d2"})
    t = create(ctrl, "t", 1, rf=2)
    a = states(ctrl, t)[0]
    leader, follower = a.leader, next(r for r in a.replicas if r != a.leader)
    first = _handle(t.table_id, 1, 10)
    call(ctrl, rq.CommitSnapshot(first, a.leader_epoch, leader))
    call(ctrl, rq.ReportReplicaLoss(follower, t.table_id, 0, "behind"))
    call(ctrl, rq.ReportReplicaLoss(leader, t.table_id, 0, "its files are corrupt"))
    loss, elected = call(ctrl, rq.ElectLeader(t.table_id, 0, True, follower))
    assert loss.leader_epoch == elected.leader_epoch > a.leader_epoch
    call(ctrl, rq.ReportLogEnds(follower, ((t.table_id, 0, elected.leader_epoch, 15),), True))  # snapshot 1 (10) is below: kept

    zombie = _handle(t.table_id, 2, 12)  # the old leader, still running, snapshots its history after all that
    with pytest.raises(errors.FencedLeaderEpochError, match="holds a history the bucket no longer has"):
        call(ctrl, rq.CommitSnapshot(zombie, a.leader_epoch, leader))
    assert _kept(ctrl, t.table_id) == [1]
    assert ctrl.zk.get_children(zkpaths.bucket_snapshots(t.table_id, 0)) == ["1"]
    call(ctrl, rq.CommitSnapshot(first, a.leader_epoch, leader))  # a retry of one stored before the loss: answered
    call(ctrl, rq.CommitSnapshot(zombie))  # ... and a tablet server too old to say its epoch is taken as before
    assert _kept(ctrl, t.table_id) == [1, 2]

    ours = _handle(t.table_id, 3, 16)  # the new leader's, at the loss's epoch: taken, and again when resent
    call(ctrl, rq.CommitSnapshot(ours, elected.leader_epoch, follower))
    call(ctrl, rq.CommitSnapshot(ours, elected.leader_epoch, follower))
    assert _kept(ctrl, t.table_id)[-1] == 3
    ctrl.snapshots.validate()


@pytest.mark.zk
def test_the_wire_carries_the_epoch_and_the_server(client, pair, table):  # noqa: F811
    tb = TableBucket(table.table_id, 2)
    before = [s.handle.snapshot_id for s in client.list_kv_snapshots(table.table_id) if s.bucket == tb]
    foreign = snapshot(pair[0].storage, tb, 5, 50)
    started = time.monotonic()
    with pytest.raises(errors.FencedLeaderEpochError, match="tablet server 99 is not one of the bucket's replicas"):
        client.commit_kv_snapshot(foreign, leader_epoch=0, server_id=99)
    assert time.monotonic() - started < 5  # answered, not retried until the client's timeout
    assert [s.handle.snapshot_id for s in client.list_kv_snapshots(table.table_id) if s.bucket == tb] == before
    client.commit_kv_snapshot(foreign, leader_epoch=0)  # the bucket's own epoch: taken
    client.commit_kv_snapshot(foreign, leader_epoch=0)  # resent: the same outcome
    assert [s.handle.snapshot_id for s in client.list_kv_snapshots(table.table_id) if s.bucket == tb] == [*before, 5]
