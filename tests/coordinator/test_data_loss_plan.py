"""Pure planning of lost replicas, restores and operator elections (coordinator/data_loss_plan.py), and the
reader's check of reused offsets (common/data_loss_plan.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.common.data_loss import RESTORE, UNCLEAN, UNKNOWN, DataLoss, resolved_count, unseen_loss
from kvlease.common.proto.coordinator_pb2 import DataLossPb
from kvlease.common.tables import Column, TableInfo
from kvlease.coordinator import data_loss_plan
from kvlease.coordinator.assignment import Assignments, BucketAssignment
from kvlease.coordinator.data_dirs import DataDirs
from kvlease.coordinator.election_plan import servers_changed
from kvlease.coordinator.notifier import bucket_role_pb

REASON = data_loss_plan.new_dir_reason(2)
TABLE = TableInfo(7, "db", "t", [Column("id", "BIGINT")], ["id"], 1, replication_factor=3)


def replicated(leader=1, isr=(1, 2, 3), replicas=(1, 2, 3), epoch=5) -> BucketAssignment:
    return BucketAssignment(leader, epoch, replicas, isr, 10)


def test_one_replica_bucket_whose_replica_lost_its_data_goes_offline_with_the_reason():
    a = BucketAssignment(2, 4)
    lost = data_loss_plan.replica_lost(a, 2, REASON, {2})
    assert (lost.leader, lost.replicas, lost.isr) == (-1, (2,), ())
    assert (lost.leader_epoch, lost.bucket_epoch) == (5, 5)
    assert lost.offline_reason.startswith(REASON) and "no other replica" in lost.offline_reason
    assert data_loss_plan.lost_data(lost)
    assert data_loss_plan.replica_lost(lost, 2, REASON, {2}) == lost  # reported again: nothing more
    assert data_loss_plan.replica_lost(a, 7, REASON, {2}) == a  # not its replica


def test_lost_leader_hands_over_to_the_next_live_isr_member_and_leaves_the_isr():
    a = replicated(leader=2, isr=(1, 2, 3))
    new = data_loss_plan.replica_lost(a, 2, REASON, {1, 2, 3})
    assert (new.leader, new.isr, new.leader_epoch, new.offline_reason) == (1, (1, 3), 6, "")


def test_lost_follower_only_leaves_the_isr():
    new = data_loss_plan.replica_lost(replicated(leader=1), 2, REASON, {1, 2, 3})
    assert (new.leader, new.isr, new.leader_epoch, new.bucket_epoch) == (1, (1, 3), 5, 11)


def test_last_isr_member_lost_leaves_the_bucket_offline_and_never_in_sync():
    a = replicated(leader=2, isr=(2,))
    new = data_loss_plan.replica_lost(a, 2, REASON, {1, 2, 3})
    assert (new.leader, new.isr) == (-1, ())
    assert "no other in-sync replica" in new.offline_reason
    # an offline bucket's kept ISR loses it too
    kept = replicated(leader=-1, isr=(2,))
    new = data_loss_plan.replica_lost(kept, 2, REASON, {1, 2, 3})
    assert new.isr == () and data_loss_plan.lost_data(new)


def test_lost_leader_whose_other_isr_members_are_down_waits_for_them_without_a_loss():
    new = data_loss_plan.replica_lost(replicated(leader=2, isr=(2, 3)), 2, REASON, {1, 2})
    assert (new.leader, new.isr, new.offline_reason) == (-1, (3,), "")


def test_restarted_server_with_a_new_dir_is_not_elected_even_with_unclean_election_on():
    assignments = Assignments()
    assignments.by_table = {7: {0: replicated(leader=2, isr=(2,)), 1: BucketAssignment(2, 1)}}
    lost = data_loss_plan.servers_lost(assignments, {2: REASON}, {1, 2, 3})
    overlay = Assignments()
    overlay.by_table = {**assignments.by_table, **lost}
    changes, unclean = servers_changed(overlay, {2}, {2}, {1, 2, 3}, {}, unclean=True)
    final = {**lost, **changes}[7]
    assert final[0].leader == -1 and data_loss_plan.lost_data(final[0]) and unclean == []
    assert final[1].leader == -1 and data_loss_plan.lost_data(final[1])


def test_data_dirs_first_sight_is_recorded_and_a_new_dir_is_a_loss():
    dirs = DataDirs()
    assert dirs.lost({1: "a", 2: ""}) == {}
    assert [op.path for op in dirs.ops({1: "a", 2: ""})] == ["/tabletservers/dirs/1"]
    dirs.recorded({1: "a", 2: ""})
    assert dirs.lost({1: "a"}) == {} and dirs.ops({1: "a"}) == []
    assert dirs.lost({1: "b"}) == {1: data_loss_plan.new_dir_reason(1)}
    assert [op.kind for op in dirs.ops({1: "b"})] == ["set"]
    assert dirs.lost({1: ""}) == {}  # an older tablet server registers no dir id


def test_restore_needs_the_flag_says_what_is_lost_and_is_idempotent():
    offline = data_loss_plan.replica_lost(BucketAssignment(2, 4), 2, REASON, {2})
    with pytest.raises(errors.InvalidRequestError, match=r"loses 300 changelog offsets \(1200\.\.1499\).*--accept"):
        data_loss_plan.restore(offline, {2}, (4, 1200), 1500, 99, accept_data_loss=False, where="bucket 0 of db.t")
    new, loss = data_loss_plan.restore(offline, {2}, (4, 1200), 1500, 99, accept_data_loss=True, where="b")
    assert loss == DataLoss(RESTORE, 6, 1200, 1500, 4, 99, 2, owed_by=(2,))  # the replicas owe it
    assert (new.leader, new.isr, new.leader_epoch, new.offline_reason, new.losses) == (2, (2,), 6, "", (loss,))
    again, same = data_loss_plan.restore(new, {2}, (4, 1200), 1500, 123, accept_data_loss=True, where="b")
    assert (again, same) == (new, loss)
    assert loss.lost_offsets() == 300


def test_restore_without_snapshot_restarts_empty_and_refuses_a_bucket_not_lost():
    offline = data_loss_plan.replica_lost(replicated(leader=2, isr=(2,)), 2, REASON, {1, 2, 3})
    new, loss = data_loss_plan.restore(offline, {1, 3}, None, UNKNOWN, 5, accept_data_loss=True, where="b")
    assert (loss.from_offset, loss.snapshot_id, new.leader, new.isr) == (0, 0, 1, (1,))
    assert loss.lost_offsets() is None and "unknown" in loss.describe()
    with pytest.raises(errors.InvalidRequestError, match="not offline for lost data"):
        data_loss_plan.restore(replicated(), {1}, None, UNKNOWN, 5, accept_data_loss=True, where="b")
    with pytest.raises(errors.InvalidRequestError, match="is live"):
        data_loss_plan.restore(offline, set(), None, UNKNOWN, 5, accept_data_loss=True, where="b")


def test_a_restore_is_owed_by_each_of_its_replicas_until_that_one_confirms_it():
    offline = data_loss_plan.replica_lost(replicated(leader=2, isr=(2,)), 2, REASON, {1, 2, 3})
    new, loss = data_loss_plan.restore(offline, {1, 2, 3}, (4, 1200), 1500, 5, accept_data_loss=True, where="b")
    assert loss.owed_by == (1, 2, 3) and [loss.owes(r) for r in (1, 2, 9)] == [True, True, False]
    pushed = {r: bucket_role_pb(TABLE, 0, new, "h:1", server_id=r) for r in (1, 2)}
    assert [pushed[r].restore_owed for r in (1, 2)] == [True, True] and pushed[1].latest_loss.leader_epoch == 7

    one = data_loss_plan.restore_confirmed(new, 2, loss.leader_epoch)
    assert one.losses[-1].owed_by == (1, 3)
    assert (one.leader, one.isr, one.leader_epoch, one.bucket_epoch) == (new.leader, new.isr, 7, new.bucket_epoch)
    assert bucket_role_pb(TABLE, 0, one, "h:1", server_id=2).restore_owed is False
    assert data_loss_plan.restore_confirmed(one, 2, loss.leader_epoch) == one  # resent: nothing changes
    assert data_loss_plan.restore_confirmed(one, 1, loss.leader_epoch - 1) == one  # not that restore
    assert data_loss_plan.restore(one, {1, 2, 3}, (4, 1200), 1500, 6, accept_data_loss=True, where="b")[0] == one
    assert BucketAssignment.from_json(one.to_json()) == one  # kept in ZooKeeper
    assert DataLoss.from_pb(loss.to_pb(DataLossPb)).owed_by is None  # the coordinator's own: each replica is told

    before = DataLoss(RESTORE, 7, 1200, 1500, 4, 5, 1)  # recorded before owed_by was kept
    old = replace(new, losses=(before,))
    assert before.owes(1) is None and data_loss_plan.restore_confirmed(old, 1, 7) == old
    assert not bucket_role_pb(TABLE, 0, old, "h:1", server_id=1).HasField("restore_owed")
    assert DataLoss.from_json({k: v for k, v in loss.to_json().items() if k != "owed_by"}).owed_by is None


def test_clean_election_picks_a_live_isr_member_or_refuses():
    a = replicated(leader=1, isr=(1, 3))
    new, loss = data_loss_plan.elect(a, {1, 2, 3}, unclean=False, tablet=3, last_known_end=UNKNOWN, at_ms=0, where="b")
    assert (new.leader, new.leader_epoch, loss) == (3, 6, None)
    same, _ = data_loss_plan.elect(new, {1, 2, 3}, unclean=False, tablet=3, last_known_end=UNKNOWN, at_ms=0, where="b")
    assert same == new  # retried
    with pytest.raises(errors.InvalidRequestError, match="not in its ISR"):
        data_loss_plan.elect(a, {1, 2, 3}, unclean=False, tablet=2, last_known_end=UNKNOWN, at_ms=0, where="b")
    offline = replicated(leader=-1, isr=())
    with pytest.raises(errors.InvalidRequestError, match="--unclean"):
        data_loss_plan.elect(offline, {1, 2, 3}, unclean=False, tablet=None, last_known_end=UNKNOWN, at_ms=0, where="b")


def test_unclean_election_leads_alone_until_the_log_end_is_reported():
    offline = data_loss_plan.replica_lost(replicated(leader=2, isr=(2,)), 2, REASON, {1, 2, 3})
    new, loss = data_loss_plan.elect(offline, {1, 3}, unclean=True, tablet=3, last_known_end=900, at_ms=7, where="b")
    assert (new.leader, new.isr, loss.kind, loss.from_offset, loss.leader) == (3, (3,), UNCLEAN, UNKNOWN, 3)
    assert data_loss_plan.pending_takeover(new)
    again, same = data_loss_plan.elect(new, {1, 3}, unclean=True, tablet=None, last_known_end=1, at_ms=8, where="b")
    assert (again, same) == (new, loss)
    assert data_loss_plan.takeover_reported(new, 1, new.leader_epoch, 700) == new  # not its leader
    assert data_loss_plan.takeover_reported(new, 3, new.leader_epoch - 1, 700) == new  # stale epoch
    done = data_loss_plan.takeover_reported(new, 3, new.leader_epoch, 700)
    assert done.losses[-1].from_offset == 700 and not data_loss_plan.pending_takeover(done)
    assert data_loss_plan.takeover_reported(done, 3, new.leader_epoch, 800) == done  # resolved once
    with pytest.raises(errors.InvalidRequestError, match="one replica"):
        data_loss_plan.elect(BucketAssignment(-1, 1, (2,), ()), {2}, unclean=True, tablet=None, last_known_end=0,
                        at_ms=0, where="b")


def test_assignment_json_round_trip_keeps_reason_and_losses_and_omits_defaults():
    loss = DataLoss(RESTORE, 6, 1200, 1500, 4, 99, 2)
    a = BucketAssignment(2, 6, (2,), (2,), 7, losses=(loss,))
    assert BucketAssignment.from_json(a.to_json()) == a
    offline = BucketAssignment(-1, 6, (2,), (), 7, offline_reason="data lost")
    assert BucketAssignment.from_json(offline.to_json()) == offline
    assert "losses" not in offline.to_json() and "offline_reason" not in BucketAssignment(2, 1).to_json()


def test_reader_check_adopts_losses_past_its_position_and_fails_on_reused_offsets():
    first = DataLoss(RESTORE, 2, 1200, 1535, 4, 0, 1)
    pending = DataLoss(UNCLEAN, 3, UNKNOWN, 1500, 0, 0, 2)
    assert unseen_loss([first], 0, 1534) is first  # it read 1200..1533: reused
    assert unseen_loss([first], 0, 1200) is None  # it read nothing past the restore point
    assert unseen_loss([first], 1, 5000) is None  # seen already
    assert resolved_count([first, pending]) == 1 and unseen_loss([first, pending], 1, 9999) is None
