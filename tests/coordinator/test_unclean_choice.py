"""An unclean election without ``--tablet`` never picks a replica that lost its data when another can lead
(coordinator/data_loss_plan.py ``unclean_choice``; the ``lost`` list of coordinator/assignment.py): pure planning,
then a real controller on a real ZooKeeper (the list persisted, read after a failover, cleared on rejoining)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvlease.common import errors
from kvlease.common.data_loss import UNCLEAN
from kvlease.coordinator import data_loss_plan
from kvlease.coordinator import requests as rq
from kvlease.coordinator.assignment import BucketAssignment
from tests.coordinator.test_assignment import call
from tests.coordinator.test_data_loss_zk import register
from tests.coordinator.test_replication import create, make_ctrl, states, stored  # noqa: F401  (fixture)

WHERE = "bucket 0 of db.t"
DAMAGED = "data lost on tablet server 1: its files are damaged"


def elect(a, live, tablet=None):
    return data_loss_plan.elect(a, live, unclean=True, tablet=tablet, last_known_end=50, at_ms=1, where=WHERE)


@pytest.mark.unit
def test_a_lost_replica_is_remembered_until_it_is_in_sync_again():
    a = BucketAssignment(3, 5, (1, 2, 3), (3, 1), 10)
    lost = data_loss_plan.replica_lost(a, 1, DAMAGED, {1, 2, 3})
    assert (lost.isr, lost.lost, lost.bucket_epoch) == ((3,), (1,), 11)
    out_of_sync = data_loss_plan.replica_lost(lost, 2, "data lost on tablet server 2", {1, 2, 3})
    assert (out_of_sync.isr, out_of_sync.lost, out_of_sync.bucket_epoch) == ((3,), (1, 2), 12)  # only remembered
    assert data_loss_plan.replica_lost(out_of_sync, 2, "again", {1, 2, 3}) == out_of_sync  # resent: nothing more
    rejoined = replace(out_of_sync, isr=(3, 1))  # caught up (rebuilt): in the ISR, no longer lost
    assert rejoined.lost == (2,)
    assert replace(rejoined, replicas=(1, 3)).lost == ()  # moved off: forgotten
    assert BucketAssignment.from_json(out_of_sync.to_json()) == out_of_sync
    assert "lost" not in a.to_json() and BucketAssignment.from_json(a.to_json()).lost == ()
    led = data_loss_plan.replica_lost(a, 3, DAMAGED, {1, 2, 3})  # the leader: the next ISR member leads
    assert (led.leader, led.lost) == (1, (3,))


@pytest.mark.unit
def test_the_unclean_election_prefers_a_replica_that_kept_its_data():
    offline = BucketAssignment(-1, 7, (1, 2, 3), (3,), 12, lost=(1,))  # 3 (in sync) is down, 1 lost its data
    new, loss = elect(offline, {1, 2})
    assert (new.leader, new.isr, loss.kind, loss.leader) == (2, (2,), UNCLEAN, 2)
    assert new.lost == (1,)  # still lost: it rebuilds from the new leader
    assert elect(new, {1, 2}) == (new, loss)  # retried: the same record
    forced, forced_loss = elect(offline, {1, 2}, tablet=1)  # the operator may still name it
    assert (forced.leader, forced.lost, forced_loss.leader) == (1, (), 1)


@pytest.mark.unit
def test_with_every_live_replica_lost_it_refuses_and_says_what_to_do_instead():
    waiting = BucketAssignment(-1, 7, (1, 2, 3), (3,), 12, lost=(1, 2))  # in-sync 3 may come back
    with pytest.raises(errors.InvalidRequestError, match=r"every live replica \[1, 2\] lost its data.*start its "
                                                         r"in-sync replica\(s\) \[3\] again.*--tablet"):
        elect(waiting, {1, 2})
    lost_for_good = replace(waiting, isr=(), offline_reason=DAMAGED + "; no other in-sync replica has it")
    with pytest.raises(errors.InvalidRequestError, match="bucket restore --accept-data-loss"):
        elect(lost_for_good, {1, 2})
    new, _loss = elect(lost_for_good, {1, 2}, tablet=2)
    assert new.leader == 2
    with pytest.raises(errors.InvalidRequestError, match="none of its replicas"):
        elect(lost_for_good, set())


@pytest.mark.zk
def test_the_lost_list_is_persisted_and_the_election_on_a_real_controller_skips_it(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, {1: "d1", 2: "d2", 3: "d3"})
    t = create(ctrl, "t", 1, rf=3)
    a = states(ctrl, t)[0]
    first, second = [r for r in a.replicas if r != a.leader]  # first: the one the old rule would elect
    call(ctrl, rq.ReportReplicaLoss(first, t.table_id, 0, "its files are damaged"))
    assert stored(ctrl, t)[0]["lost"] == [first]
    b = states(ctrl, t)[0]
    call(ctrl, rq.AlterIsr(a.leader, t.table_id, 0, b.leader_epoch, b.bucket_epoch, (a.leader,)))  # second lags
    ctrl.zk.delete(f"/tabletservers/ids/{a.leader}")  # the only in-sync replica goes: offline
    call(ctrl, rq.TabletServersChanged())
    assert states(ctrl, t)[0].offline

    standby = make_ctrl()  # the list survives a failover
    register(standby, {first: f"d{first}", second: f"d{second}"})
    assert states(standby, t)[0].lost == (first,)
    loss, elected = call(standby, rq.ElectLeader(t.table_id, 0, True))
    assert (elected.leader, loss.leader) == (second, second)
    call(standby, rq.AlterIsr(second, t.table_id, 0, elected.leader_epoch, elected.bucket_epoch, (second, first)))
    assert states(standby, t)[0].lost == ()  # rebuilt and in sync: no longer lost
    assert "lost" not in json.loads(json.dumps(stored(standby, t)[0]))


@pytest.mark.unit
def test_the_automatic_unclean_election_never_picks_a_lost_replica():
    from kvlease.coordinator.election_plan import server_gone, server_joined
    a = BucketAssignment(3, 5, (1, 2, 3), (3,), 10, lost=(1,))
    outcome = server_gone(a, {3}, {1, 2}, unclean=True)
    assert (outcome.state.leader, outcome.unclean) == (2, True)
    all_lost = replace(a, lost=(1, 2))
    offline = server_gone(all_lost, {3}, {1, 2}, unclean=True).state
    assert (offline.leader, offline.isr) == (-1, (3,))  # offline, waiting for 3 (or an operator)
    assert server_joined(replace(offline, isr=()), {1}, {1, 2}, unclean=True) is None
