"""Replicas that still owe a bucket's restore, in the coordinator's planning (pure, no ZooKeeper): an unclean
election never makes one lead (coordinator/data_loss_plan.py ``unclean_candidates``, coordinator/election_plan.py), a
follower that carried the restore out is ``lost`` (empty) until back in the ISR, and a replica moved off the
bucket no longer owes it (coordinator/assignment.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.common.data_loss import RESTORE, UNCLEAN, DataLoss
from kvlease.coordinator import data_loss_plan, election_plan
from kvlease.coordinator import reassignment_plan as ra
from kvlease.coordinator.assignment import BucketAssignment

pytestmark = pytest.mark.unit

WHERE = "bucket 0 of db.t"
RESTORE_HINT = "bucket restore --accept-data-loss"


def restored() -> tuple[BucketAssignment, DataLoss]:
    """Replicas 1, 2, 3; leader 1 (2 and 3 out of sync) lost its data; restored onto 1 at leader epoch 7."""
    behind = BucketAssignment(1, 5, (1, 2, 3), (1,), 10)
    offline = data_loss_plan.replica_lost(behind, 1, data_loss_plan.new_dir_reason(1), {1, 2, 3})
    new, loss = data_loss_plan.restore(offline, {1, 2, 3}, (4, 1200), 1500, 5, accept_data_loss=True, where=WHERE)
    assert (new.leader, new.isr, new.lost, loss.leader_epoch, new.restore_owed_by) == (1, (1,), (), 7, (1, 2, 3))
    return new, loss


def elect(a, live, tablet=None):
    return data_loss_plan.elect(a, live, unclean=True, tablet=tablet, last_known_end=50, at_ms=1, where=WHERE)


def restore(a, live, accept=True):
    return data_loss_plan.restore(a, live, (9, 1300), 1400, 6, accept_data_loss=accept, where=WHERE)


def test_a_follower_that_carried_out_the_restore_is_lost_until_in_sync_and_the_leader_never_is():
    new, loss = restored()
    led = data_loss_plan.restore_confirmed(new, 1, loss.leader_epoch)  # the leader installed the snapshot
    assert (led.restore_owed_by, led.lost) == ((2, 3), ())
    dropped = data_loss_plan.restore_confirmed(led, 3, loss.leader_epoch)  # 3 dropped its data: empty until rebuilt
    assert (dropped.restore_owed_by, dropped.lost, dropped.bucket_epoch) == ((2,), (3,), led.bucket_epoch)
    assert data_loss_plan.restore_confirmed(dropped, 3, loss.leader_epoch) == dropped  # resent: nothing changes
    in_sync = election_plan.alter_isr(dropped, 1, dropped.leader_epoch, dropped.bucket_epoch, (1, 3), {1, 2, 3})
    assert (in_sync.isr, in_sync.lost, in_sync.restore_owed_by) == ((1, 3), (), (2,))


def test_the_unclean_elections_skip_a_replica_that_owes_the_restore_and_refuse_naming_it():
    new, loss = restored()
    state = data_loss_plan.restore_confirmed(data_loss_plan.restore_confirmed(new, 1, 7), 3, 7)
    state = election_plan.alter_isr(state, 1, state.leader_epoch, state.bucket_epoch, (1, 3), {1, 2, 3})
    state = election_plan.alter_isr(state, 1, state.leader_epoch, state.bucket_epoch, (1,), {1, 2, 3})  # 3 fell behind
    assert (state.isr, state.lost, state.restore_owed_by) == ((1,), (), (2,))  # 2 never carried it out

    automatic = election_plan.server_gone(state, {1}, {2, 3}, unclean=True)
    assert (automatic.state.leader, automatic.unclean) == (3, True)  # not 2, though first in replica order
    offline = election_plan.server_gone(state, {1}, {2, 3}).state
    assert (offline.leader, offline.isr) == (-1, (1,))
    assert election_plan.server_joined(offline, {2}, {2}, unclean=True) is None  # 3 down, 2 owes: nobody

    chosen, unclean = elect(offline, {2, 3})
    assert (chosen.leader, unclean.kind, unclean.leader) == (3, UNCLEAN, 3)
    assert elect(chosen, {2, 3}) == (chosen, unclean)  # retried: the same record
    with pytest.raises(errors.InvalidRequestError, match=r"^bucket 0 of db\.t: tablet server 2 has not carried out "
                       r"the bucket's restore of leader epoch 7 yet: it holds its data from before the restore "
                       r"\(or nothing\).*without --tablet: tablet server 3\)$"):
        elect(offline, {2, 3}, tablet=2)

    later = replace(chosen, leader=-1)  # the unclean leader 3 is gone too: a later loss, the same restore owed
    assert later.restore_owed_by == (2,)
    with pytest.raises(errors.InvalidRequestError, match=r"every live replica \[2\] has not carried out"):
        elect(later, {2})


def test_with_every_live_replica_owing_the_restore_or_lost_the_election_refuses_and_restore_takes_over():
    new, loss = restored()
    led = data_loss_plan.restore_confirmed(new, 1, loss.leader_epoch)
    offline = election_plan.server_gone(led, {1}, {2, 3}, unclean=True).state  # 2 and 3 owe it: nobody leads
    assert (offline.leader, offline.isr, offline.offline_reason) == (-1, (1,), "")

    with pytest.raises(errors.InvalidRequestError, match=r"every live replica \[2, 3\] has not carried out the "
                       r"bucket's restore of leader epoch 7 yet, so an unclean election would make it serve what "
                       r"the bucket's restore replaced.*start its in-sync replica\(s\) \[1\] again.*" + RESTORE_HINT):
        elect(offline, {2, 3})
    with pytest.raises(errors.InvalidRequestError, match=r"tablet server 2 has not carried out.*" + RESTORE_HINT):
        elect(offline, {2, 3}, tablet=2)
    one_lost = data_loss_plan.restore_confirmed(offline, 3, loss.leader_epoch)  # 3 carried it out: empty
    with pytest.raises(errors.InvalidRequestError, match=r"every live replica \[2, 3\] lost its data \(\[3\]\) or has "
                       r"not carried out the bucket's restore of leader epoch 7 yet \(\[2\]\).*" + RESTORE_HINT
                       + r".*name one that lost its data with --tablet"):
        elect(one_lost, {2, 3})
    assert elect(one_lost, {2, 3}, tablet=3)[0].leader == 3  # leading empty is the operator's to choose

    with pytest.raises(errors.InvalidRequestError, match=r"offline: every live replica \[2, 3\] has not carried out"
                       r".*loses 100 changelog offsets.*--accept-data-loss"):
        restore(offline, {2, 3}, accept=False)
    again, second = restore(offline, {2, 3})
    assert (again.leader, again.isr, again.replicas, second.kind) == (2, (2,), (1, 2, 3), RESTORE)
    assert (second.leader_epoch, again.restore_owed_by, again.losses[:-1]) == (9, (1, 2, 3), offline.losses)
    assert restore(again, {2, 3}) == (again, second)  # retried: the same record


def test_a_lost_only_bucket_waiting_for_its_in_sync_replica_may_now_be_restored():
    waiting = BucketAssignment(-1, 7, (1, 2, 3), (3,), 12, lost=(1, 2))
    with pytest.raises(errors.InvalidRequestError, match=r"every live replica \[1, 2\] lost its data.*start its "
                       r"in-sync replica\(s\) \[3\] again.*" + RESTORE_HINT + r".*--tablet"):
        elect(waiting, {1, 2})
    new, loss = restore(waiting, {1, 2})
    assert (new.leader, new.isr, loss.owed_by) == (1, (1,), (1, 2, 3))
    behind = BucketAssignment(-1, 7, (1, 2, 3), (3,), 12, lost=(1,))  # 2 is merely behind: elect it instead
    with pytest.raises(errors.InvalidRequestError, match=r"live replica\(s\) \[1, 2\] may miss committed writes"):
        restore(behind, {1, 2})


def test_a_replica_moved_off_the_bucket_no_longer_owes_its_restores_in_the_same_write():
    new, loss = restored()
    state = data_loss_plan.restore_confirmed(data_loss_plan.restore_confirmed(new, 1, 7), 3, 7)
    state = election_plan.alter_isr(state, 1, state.leader_epoch, state.bucket_epoch, (1, 3), {1, 2, 3, 4})
    moving = ra.start(state, (1, 3, 4))
    assert (moving.replicas, moving.restore_owed_by) == ((1, 3, 4, 2), (2,))  # still a replica meanwhile
    caught_up = election_plan.alter_isr(moving, 1, moving.leader_epoch, moving.bucket_epoch, (1, 3, 4), {1, 2, 3, 4})
    done = ra.progress(caught_up, {1, 3, 4})
    assert (done.replicas, done.restore_owed_by, done.losses[-1]) == ((1, 3, 4), (), replace(loss, owed_by=()))
    assert ra.removed_replicas(caught_up, done) == {2}
    assert BucketAssignment.from_json(done.to_json()) == done and done.to_json()["losses"][-1]["owed_by"] == []
    assert replace(done, replicas=done.replicas) == done  # idempotent

    stale = {**done.to_json(), "losses": [{**loss.to_json(), "owed_by": [2, 4]}]}  # written before this was kept
    assert BucketAssignment.from_json(stale).restore_owed_by == (4,)
    unknown = replace(done, losses=(replace(loss, owed_by=None), DataLoss(UNCLEAN, 9, 3, 4, 0, 1, 3)))
    assert unknown.losses[0].owed_by is None and unknown.restore_owed_by == ()  # not known: left alone

    gone = data_loss_plan.restore(BucketAssignment(-1, 8, (2, 3), (), 12, losses=(replace(loss, owed_by=(2, 3)),)),
                             {4, 5}, None, 1400, 6, accept_data_loss=True, where=WHERE)[0]
    assert gone.replicas == (4, 5) and [x.owed_by for x in gone.losses] == [(), (4, 5)]  # restored elsewhere


def test_a_replica_that_joins_the_isr_owes_no_restore_and_the_leader_still_owes_its_own():
    new, loss = restored()
    own = election_plan.alter_isr(new, 1, new.leader_epoch, new.bucket_epoch, (1,), {1, 2, 3})
    assert own == new and own.restore_owed_by == (1, 2, 3)  # its own ISR: the leader has not confirmed yet
    state = data_loss_plan.restore_confirmed(data_loss_plan.restore_confirmed(new, 1, 7), 2, 7)
    state = election_plan.alter_isr(state, 1, state.leader_epoch, state.bucket_epoch, (1, 2), {1, 2, 3})  # rebuilt
    state = election_plan.alter_isr(state, 1, state.leader_epoch, state.bucket_epoch, (1,), {1, 2, 3})  # behind
    chosen, _unclean = elect(election_plan.server_gone(state, {1}, {2, 3}).state, {2})  # 3 down, owing the restore
    assert (chosen.leader, chosen.restore_owed_by) == (2, (3,))
    caught_up = election_plan.alter_isr(chosen, 2, chosen.leader_epoch, chosen.bucket_epoch, (2, 3), {2, 3})
    assert (caught_up.isr, caught_up.restore_owed_by, caught_up.losses[0].owed_by) == ((2, 3), (), ())
    assert caught_up.in_sync({3}) == caught_up  # idempotent
