"""Pure planning of a restore whose bucket's replicas are gone for good (coordinator/data_loss_plan.py): where the
bucket goes, which replicas are kept or replaced, what is refused, and a retried restore."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.common.data_loss import RESTORE, UNKNOWN, DataLoss
from kvlease.coordinator import data_loss_plan
from kvlease.coordinator.assignment import BucketAssignment
from kvlease.coordinator.reassignment_plan import removed_replicas

WHERE = "bucket 0 of db.t"


def restore(a, live, tablet=None, servers=None, accept=True, snapshot=(4, 1200), end=1500):
    return data_loss_plan.restore(a, live, snapshot, end, 99, accept_data_loss=accept, where=WHERE, tablet=tablet,
                             servers=servers)


def gone_one_replica() -> BucketAssignment:
    """A one-replica bucket whose server 2 left (it keeps its leader: offline while 2 is not live)."""
    return BucketAssignment(2, 5, (2,), (2,), 8)


def test_one_replica_bucket_whose_server_is_gone_moves_to_the_least_loaded_live_server():
    servers = data_loss_plan.RestoreServers(load={3: 4, 4: 1, 5: 1})
    with pytest.raises(errors.InvalidRequestError,
                       match=r"none of its replicas \[2\] is live\. Restoring it onto tablet server 4 \(replicas "
                             r"\[4\]\) from snapshot 4 \(log offset 1200\) loses 300 changelog offsets"):
        restore(gone_one_replica(), {3, 4, 5}, servers=servers, accept=False)
    new, loss = restore(gone_one_replica(), {3, 4, 5}, servers=servers)
    assert loss == DataLoss(RESTORE, 6, 1200, 1500, 4, 99, 4, owed_by=(4,))
    assert (new.leader, new.replicas, new.isr, new.leader_epoch, new.bucket_epoch) == (4, (4,), (4,), 6, 9)
    assert new.offline_reason == "" and new.losses == (loss,)
    assert removed_replicas(gone_one_replica(), new) == {2}  # told `removed` (or deletes its stray copy later)
    again, same = restore(new, {3, 4, 5}, servers=servers)  # a retry: its answer was lost
    assert (again, same) == (new, loss)
    assert restore(new, {3, 4, 5}, tablet=4, servers=servers) == (new, loss)


def test_the_default_server_is_not_decommissioned_and_has_room():
    servers = data_loss_plan.RestoreServers(load={3: 0, 4: 1, 5: 2, 6: 3}, room={3: None, 4: 0, 6: 5},
                                       excluded=frozenset({3}))
    new, _ = restore(gone_one_replica(), {3, 4, 5, 6}, servers=servers)
    assert new.replicas == (5,)  # 3 decommissioned, 4 full; 5 (no limit) before 6 (more load)


def test_named_tablet_leads_and_bad_choices_are_refused():
    servers = data_loss_plan.RestoreServers(load={3: 0, 4: 9}, room={3: 0, 4: None}, excluded=frozenset({5}))
    new, loss = restore(gone_one_replica(), {3, 4, 5}, tablet=4, servers=servers)
    assert (new.leader, new.replicas, loss.leader) == (4, (4,), 4)
    for tablet, why in ((7, "not live"), (3, "most replicas"), (5, "decommissioned.*recommission --tablet 5")):
        with pytest.raises(errors.InvalidRequestError, match=f"tablet server {tablet} .*{why}|{why}"):
            restore(gone_one_replica(), {3, 4, 5}, tablet=tablet, servers=servers)
    with pytest.raises(errors.InvalidRequestError, match="no other live tablet server with room.*start a tablet"):
        restore(gone_one_replica(), {3}, servers=servers)


def test_replicated_bucket_all_of_whose_servers_are_gone_gets_its_replication_factor_back():
    offline = BucketAssignment(-1, 5, (1, 2, 3), (1,), 8)
    servers = data_loss_plan.RestoreServers(load={4: 0, 5: 1, 6: 2, 7: 3})
    new, loss = restore(offline, {4, 5, 6, 7}, servers=servers)
    assert (new.leader, new.replicas, new.isr, loss.leader) == (4, (4, 5, 6), (4,), 4)
    assert removed_replicas(offline, new) == {1, 2, 3}
    few, _ = restore(offline, {4, 5}, servers=servers)
    assert few.replicas == (4, 5)  # fewer live servers than its replication factor: fewer replicas


def test_a_named_server_outside_the_replicas_keeps_the_live_ones_and_replaces_the_dead():
    lost = data_loss_plan.replica_lost(BucketAssignment(1, 5, (1, 2, 3), (1,), 8), 1, data_loss_plan.new_dir_reason(1),
                                  {1, 2})
    assert data_loss_plan.lost_data(lost)
    new, _ = restore(lost, {1, 2, 5, 6}, tablet=6, servers=data_loss_plan.RestoreServers(load={5: 0, 6: 0}))
    assert new.replicas == (6, 1, 2) and new.leader == 6  # dead 3 gave its place; lost-but-live 1 rebuilds
    assert new.lost == (1,)  # remembered until it is in sync again (an unclean election prefers others)
    kept, _ = restore(lost, {1, 2, 5, 6}, tablet=2)
    assert (kept.leader, kept.replicas) == (2, (1, 2, 3))  # a live replica named: the replicas stay
    first, _ = restore(lost, {1, 2, 5, 6})
    assert (first.leader, first.replicas) == (1, (1, 2, 3))  # as before: the first live replica


def test_a_bucket_being_moved_when_it_is_restored_elsewhere_drops_the_move():
    moving = BucketAssignment(-1, 5, (2, 3), (2,), 8, reassign=(3,))
    new, _ = restore(moving, {4}, servers=data_loss_plan.RestoreServers())
    assert (new.replicas, new.reassign) == ((4,), None)


def test_refusals_say_what_to_do_instead():
    waiting = BucketAssignment(-1, 5, (1, 2), (1,), 8)  # its in-sync replica 1 is down, 2 is behind
    with pytest.raises(errors.InvalidRequestError,
                       match=r"waiting for its in-sync replica\(s\) \[1\].*live replica\(s\) \[2\].*start tablet "
                             r"server\(s\) \[1\] again.*bucket elect --unclean"):
        restore(waiting, {2, 3})
    with pytest.raises(errors.InvalidRequestError, match="led by tablet server 1"):
        restore(BucketAssignment(1, 5, (1, 2), (1, 2), 8), {1, 2})
    with pytest.raises(errors.InvalidRequestError, match="not assigned yet"):
        restore(BucketAssignment(-1, 0), {1})
    restored, loss = restore(gone_one_replica(), {3}, servers=data_loss_plan.RestoreServers())
    with pytest.raises(errors.InvalidRequestError, match="led by tablet server 3"):
        restore(restored, {3, 4}, tablet=4)  # not a retry: another server named
    assert loss.lost_offsets() == 300


def test_restore_without_a_snapshot_or_known_log_end_says_so():
    with pytest.raises(errors.InvalidRequestError, match="no snapshot is kept.*unknown number"):
        restore(gone_one_replica(), {3}, snapshot=None, end=UNKNOWN, accept=False)


def test_a_restored_bucket_whose_new_server_is_gone_too_is_restored_again_with_a_new_record():
    first, loss = restore(gone_one_replica(), {3}, servers=data_loss_plan.RestoreServers())
    second, again = restore(first, {4}, servers=data_loss_plan.RestoreServers())  # 3 gone as well
    assert (second.leader, second.replicas, again.leader_epoch) == (4, (4,), loss.leader_epoch + 1)
    assert second.losses == (replace(loss, owed_by=()), again)  # 3, no longer a replica, owes the first no more
    offline, _ = restore(BucketAssignment(-1, 5, (2,), (), 8), {4})  # offline with no ISR kept: the same
    assert offline.replicas == (4,)
