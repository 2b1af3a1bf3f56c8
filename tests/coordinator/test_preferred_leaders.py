"""Automatic preferred-leader elections on a real ZooKeeper with a real controller (coordinator/preferred_leaders.py):
a restarted server's buckets go back to it as its replicas rejoin their ISRs (written fenced, every replica told,
counted), not with auto.leader-rebalance.enabled off; the periodic imbalance check at
leader.imbalance.check-interval; and ``Rebalance(leaders_only)``, which starts no replica move. Tablet servers
are registered by hand; their catching up is the leader's AlterIsr, sent by hand; the clock is the test's."""

from __future__ import annotations


import pytest

from kvlease.common.storage import open_storage
from kvlease.coordinator import requests as rq
from kvlease.coordinator.controller import Controller, LeaderRebalance
from kvlease.coordinator.fencing import FencedWriter, bump_epoch
from kvlease.coordinator.metrics import CoordinatorMetrics
from kvlease.leases import state as ls
from tests.coordinator.test_assignment import Recorder, call
from tests.coordinator.test_replication import create, register, sample, states, stored, unregister

pytestmark = pytest.mark.zk

CHECK_MS = 30_000


@pytest.fixture
def make_ctrl(zk_config):
    from kvlease.common.zk import make_client

    zk = make_client(zk_config)
    made = []

    def make(**settings) -> Controller:
        clock = [1]
        c = Controller(zk, open_storage(zk_config["remote.data.dir"], zk_config), num_retained=2,
                       max_lease_ms=3_600_000, grace_ms=1000, clock_ms=lambda: clock[0], notify=Recorder(),
                       metrics=CoordinatorMetrics(), leader_rebalance=LeaderRebalance(**{
                           "check_interval_ms": CHECK_MS, **settings}))
        c.reinitialize(FencedWriter(zk, bump_epoch(zk)[1]))
        c.recorder, c.clock = c.members.notify, clock
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()
    zk.stop()
    zk.close()


def restart(ctrl, server: int, incarnation: str) -> None:
    """``server`` restarted: a new incarnation, out of every ISR, leading nothing."""
    unregister(ctrl, server)
    register(ctrl, 1, 2, 3, incarnation=incarnation)


def back_in_sync(ctrl, table, server: int) -> None:
    """Each bucket's leader adds ``server`` to its ISR, one AlterIsr after the other."""
    for bucket, a in sorted(states(ctrl, table).items()):
        if server not in a.isr:
            call(ctrl, rq.AlterIsr(a.leader, table.table_id, bucket, a.leader_epoch, a.bucket_epoch,
                                   tuple(a.isr) + (server,)))


def tick(ctrl, advance_ms: int) -> None:
    ctrl.clock[0] += advance_ms
    ctrl.process([(ls.Expire(), None)])


def led_by(ctrl, table, server: int) -> list[int]:
    return sorted(b for b, a in states(ctrl, table).items() if a.leader == server)


def preferred_by(ctrl, table, server: int) -> list[int]:
    return sorted(b for b, a in states(ctrl, table).items() if a.replicas[0] == server)


def test_a_restarted_server_leads_its_buckets_again_once_back_in_their_isr(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 6, rf=3)
    mine = preferred_by(ctrl, t, 1)
    assert len(mine) == 2 and led_by(ctrl, t, 1) == mine
    restart(ctrl, 1, "b")
    assert led_by(ctrl, t, 1) == []
    before = states(ctrl, t)
    back_in_sync(ctrl, t, 1)
    after = states(ctrl, t)
    assert led_by(ctrl, t, 1) == mine  # elected as each AlterIsr brought it back
    for bucket in mine:
        assert after[bucket].leader_epoch == before[bucket].leader_epoch + 1
        assert stored(ctrl, t)[bucket]["leader"] == 1  # written, not only applied
        assert ctrl.recorder.held[1][(t.table_id, bucket)][0].leader == 1  # told
        old_leader = before[bucket].leader
        assert ctrl.recorder.held[old_leader][(t.table_id, bucket)][0].leader == 1  # the old leader too
    assert sample(ctrl.metrics, "preferred_leader_elections_total") == len(mine)
    tick(ctrl, CHECK_MS)  # balanced: the check elects nothing more
    assert sample(ctrl.metrics, "preferred_leader_elections_total") == len(mine)


def test_with_automatic_elections_off_only_rebalance_gives_leadership_back(make_ctrl):
    ctrl = make_ctrl(enabled=False)
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 6, rf=3)
    mine = preferred_by(ctrl, t, 1)
    restart(ctrl, 1, "b")
    back_in_sync(ctrl, t, 1)
    tick(ctrl, CHECK_MS)
    assert led_by(ctrl, t, 1) == []
    moves, leaders = call(ctrl, rq.Rebalance(leaders_only=True))
    assert moves == [] and sorted(b for (_t, b, _a), _old in leaders) == mine
    assert led_by(ctrl, t, 1) == mine
    assert call(ctrl, rq.Rebalance(leaders_only=True)) == ([], [])  # resent: nothing more


def test_the_periodic_check_elects_the_servers_over_the_imbalance_threshold(make_ctrl):
    ctrl = make_ctrl(threshold_pct=10)
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 6, rf=3)
    mine = preferred_by(ctrl, t, 1)
    for bucket in mine:  # an operator moved them away; 1 stays in the ISR (no AlterIsr brings it back)
        other = states(ctrl, t)[bucket].replicas[1]
        call(ctrl, rq.ElectLeader(t.table_id, bucket, False, other))
    assert led_by(ctrl, t, 1) == []
    tick(ctrl, CHECK_MS - 1)  # not yet
    assert led_by(ctrl, t, 1) == []
    tick(ctrl, 1)
    assert led_by(ctrl, t, 1) == mine


def test_a_threshold_not_exceeded_leaves_the_leaders(make_ctrl):
    ctrl = make_ctrl(threshold_pct=50)
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 6, rf=3)
    moved = preferred_by(ctrl, t, 1)[0]
    call(ctrl, rq.ElectLeader(t.table_id, moved, False, states(ctrl, t)[moved].replicas[1]))
    tick(ctrl, CHECK_MS)  # 1 of its 2: 50% does not exceed 50%
    assert states(ctrl, t)[moved].leader != 1


def test_rebalance_of_the_leaders_starts_no_replica_move(make_ctrl):
    ctrl = make_ctrl(enabled=False)
    register(ctrl, 1, 2)
    t = create(ctrl, "t", 4, rf=2)
    register(ctrl, 1, 2, 3)  # 3 holds nothing: a full rebalance would move replicas to it
    assert call(ctrl, rq.Rebalance(leaders_only=True)) == ([], [])
    assert all(a.reassign is None for a in states(ctrl, t).values())
    moves, _leaders = call(ctrl, rq.Rebalance())
    assert moves


def test_a_server_that_gave_a_leadership_up_is_not_elected_back_for_a_check_interval(make_ctrl):
    """A full disk: it resigned (ResignLeadership) and left the ISR; back in it with nothing new to write (its
    disk may still be full), it is not made leader again at once, only after a check interval."""
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 3, rf=3)
    bucket, a = next((b, a) for b, a in sorted(states(ctrl, t).items()) if a.leader == a.replicas[0])
    server = a.leader
    outcomes = call(ctrl, rq.ResignLeadership(server, [(t.table_id, bucket, a.leader_epoch, "ENOSPC (test)")]))
    assert not outcomes[0].refused and states(ctrl, t)[bucket].leader != server
    after = states(ctrl, t)[bucket]
    call(ctrl, rq.AlterIsr(after.leader, t.table_id, bucket, after.leader_epoch, after.bucket_epoch,
                           tuple(after.isr) + (server,)))
    assert server in states(ctrl, t)[bucket].isr and states(ctrl, t)[bucket].leader != server  # not at once
    tick(ctrl, CHECK_MS // 2)
    assert states(ctrl, t)[bucket].leader != server
    tick(ctrl, CHECK_MS)  # a check interval after it resigned: the periodic check hands it back
    assert states(ctrl, t)[bucket].leader == server
