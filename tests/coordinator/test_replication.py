"""Replicated buckets on a real ZooKeeper with a real controller: create with a replication factor (and its
errors), election when a server's registration goes, AlterIsr (fenced, stale, resent), controlled shutdown,
a leader's resignation (written, told, resent, refused), and a standby taking over with the state. Tablet
servers are registered by hand (their ZooKeeper nodes)."""

from __future__ import annotations

import pytest

from kvlease.common import errors, zkpaths
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column, TableSpec
from kvlease.common.zk import loads, make_client
from kvlease.coordinator import requests as rq
from kvlease.coordinator.assignment import UNASSIGNED
from kvlease.coordinator.controller import Controller
from kvlease.coordinator.fencing import FencedWriter, bump_epoch
from kvlease.coordinator.metrics import CoordinatorMetrics
from tests.coordinator.test_assignment import Recorder, call


def controller(zk, config, **kwargs) -> Controller:
    recorder = Recorder()
    c = Controller(zk, open_storage(config["remote.data.dir"], config), num_retained=2, max_lease_ms=3_600_000,
                   grace_ms=1000, clock_ms=lambda: 1, notify=recorder, **kwargs)
    c.reinitialize(FencedWriter(zk, bump_epoch(zk)[1]))
    c.recorder = recorder
    return c


@pytest.fixture
def make_ctrl(zk_config):
    zk = make_client(zk_config)
    made = []

    def make(**kwargs) -> Controller:
        made.append(controller(zk, zk_config, **kwargs))
        return made[-1]
    yield make
    for c in made:
        c.close()
    zk.stop()
    zk.close()


def register(ctrl, *server_ids: int, incarnation: str = "a") -> None:
    for sid in server_ids:
        node = f'{{"address": "127.0.0.1:{1000 + sid}", "incarnation": "{incarnation}"}}'.encode()
        if ctrl.zk.exists(zkpaths.tablet_server(sid)):
            ctrl.zk.set(zkpaths.tablet_server(sid), node)
        else:
            ctrl.zk.create(zkpaths.tablet_server(sid), node, ephemeral=True, makepath=True)
    call(ctrl, rq.TabletServersChanged())


def unregister(ctrl, *server_ids: int) -> None:
    for sid in server_ids:
        ctrl.zk.delete(zkpaths.tablet_server(sid))
    call(ctrl, rq.TabletServersChanged())


def create(ctrl, name, buckets, rf=None, min_isr=None, ignore_if_exists=False):
    spec = TableSpec("db", name, (Column("id", "BIGINT"),), ("id",), buckets)
    return call(ctrl, rq.CreateTable(spec, ignore_if_exists, rf, min_isr))


def sample(metrics, name):
    return metrics.registry.get_sample_value(f"kvlease_coordinator_{name}")


def states(ctrl, table):
    _table, rows = call(ctrl, rq.GetTableAssignment(table.table_id))
    return {bucket: a for _table, bucket, a, _address in rows}


def stored(ctrl, table):
    node = loads(ctrl.zk.get(zkpaths.table_assignment(table.table_id))[0])
    return {int(b): v for b, v in node["buckets"].items()}


def test_create_with_a_replication_factor_and_its_errors(make_ctrl):
    ctrl = make_ctrl(default_replication=(2, 2))
    with pytest.raises(errors.InvalidRequestError, match="replication factor 2 is more than the 0 live"):
        create(ctrl, "t", 2)
    register(ctrl, 1, 2)
    with pytest.raises(errors.InvalidRequestError, match="replication factor 3 is more than the 2 live tablet"):
        create(ctrl, "t", 2, rf=3)
    with pytest.raises(errors.InvalidTableError, match="replication factor must be at least 1"):
        create(ctrl, "t", 2, rf=0)
    with pytest.raises(errors.InvalidTableError, match="min in-sync replicas must be between 1 and .* 2, got 3"):
        create(ctrl, "t", 2, rf=2, min_isr=3)
    assert ("db", "t") not in ctrl.catalog.by_name and not ctrl.zk.exists(zkpaths.table_name("db", "t"))

    t = create(ctrl, "t", 4)  # the configured defaults
    assert (t.replication_factor, t.min_insync_replicas) == (2, 2)
    assert loads(ctrl.zk.get(zkpaths.table(t.table_id))[0])["replication_factor"] == 2
    for bucket, a in stored(ctrl, t).items():
        assert sorted(a["replicas"]) == [1, 2] and a["isr"] == a["replicas"] and a["leader"] == a["replicas"][0]
        assert (a["leader_epoch"], a["bucket_epoch"]) == (1, 1)
    assert sorted(a.leader for a in states(ctrl, t).values()) == [1, 1, 2, 2]
    # each server is told every bucket it holds, led or followed, with the leader and its address
    for sid in (1, 2):
        held = ctrl.recorder.held[sid]
        assert set(held) == {(t.table_id, b) for b in range(4)}
        for (_t, _b), (a, address) in held.items():
            assert address == f"127.0.0.1:{1000 + a.leader}"
    # "if not exists" with another replication factor is another table; unnamed is the same
    with pytest.raises(errors.TableAlreadyExistError, match="replication factor 2 there, 1 asked"):
        create(ctrl, "t", 4, rf=1, min_isr=1, ignore_if_exists=True)
    assert create(ctrl, "t", 4, ignore_if_exists=True) == t
    one = create(ctrl, "one", 1, rf=1)  # min in-sync replicas defaults to at most the replication factor
    assert (one.replication_factor, one.min_insync_replicas) == (1, 1)


def test_election_when_servers_go_and_come_back(make_ctrl):
    metrics = CoordinatorMetrics()
    ctrl = make_ctrl(metrics=metrics)
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 3, rf=3)
    before = states(ctrl, t)
    led_by_1 = [b for b, a in before.items() if a.leader == 1]
    assert len(led_by_1) == 1

    unregister(ctrl, 1)
    after = states(ctrl, t)
    for b, a in after.items():
        assert 1 not in a.isr and a.leader != 1 and a.isr[0] == a.leader
        if b in led_by_1:  # the first live ISR member in replica order, both epochs bumped
            assert a.leader == [r for r in before[b].replicas if r != 1][0]
            assert (a.leader_epoch, a.bucket_epoch) == (2, 2)
        else:
            assert (a.leader, a.leader_epoch, a.bucket_epoch) == (before[b].leader, 1, 2)
    assert stored(ctrl, t) == {b: a.to_json() for b, a in after.items()}
    assert sample(metrics, "under_replicated_buckets") == 3
    b = led_by_1[0]
    new_leader = after[b].leader
    assert ctrl.recorder.held[new_leader][(t.table_id, b)][0].leader == new_leader

    # the others go too: offline, the ISR kept for the last in-sync replica
    unregister(ctrl, 2)
    unregister(ctrl, 3)
    offline = states(ctrl, t)
    assert all(a.leader == UNASSIGNED and a.isr == (3,) for a in offline.values())
    assert sample(metrics, "offline_buckets") == 3
    last = offline[b].isr[0]
    other = next(r for r in (2, 3) if r != last)
    register(ctrl, other)  # not in sync: it may not lead
    assert states(ctrl, t)[b].leader == UNASSIGNED
    register(ctrl, last)
    back = states(ctrl, t)[b]
    assert back.leader == last and back.leader_epoch == offline[b].leader_epoch + 1
    assert ctrl.recorder.held[other][(t.table_id, b)][1] == f"127.0.0.1:{1000 + last}"  # the follower is told

    # a restart seen only as a new incarnation: gone, then joined (a follower now)
    register(ctrl, 1)
    leader = back.leader
    register(ctrl, leader, incarnation="b")
    moved = states(ctrl, t)[b]  # it was the only in-sync replica: offline, then it leads again
    assert (moved.leader, moved.isr, moved.leader_epoch) == (leader, (leader,), back.leader_epoch + 2)


def test_unclean_election_is_counted(make_ctrl):
    metrics = CoordinatorMetrics()
    ctrl = make_ctrl(metrics=metrics, unclean_election=True)
    register(ctrl, 1, 2)
    t = create(ctrl, "t", 1, rf=2)
    a = states(ctrl, t)[0]
    follower = a.replicas[1]
    call(ctrl, rq.AlterIsr(a.leader, t.table_id, 0, a.leader_epoch, a.bucket_epoch, (a.leader,)))
    unregister(ctrl, a.leader)
    now = states(ctrl, t)[0]
    assert (now.leader, now.isr) == (follower, (follower,))
    assert sample(metrics, "unclean_elections_total") == 1


def test_alter_isr_fenced_stale_resent_and_refused(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 1, rf=3)
    a = states(ctrl, t)[0]
    shrunk = (a.leader,) + a.replicas[1:2]
    new = call(ctrl, rq.AlterIsr(a.leader, t.table_id, 0, a.leader_epoch, a.bucket_epoch, shrunk))
    assert (new.isr, new.bucket_epoch, new.leader_epoch) == (shrunk, a.bucket_epoch + 1, a.leader_epoch)
    assert stored(ctrl, t)[0]["isr"] == list(shrunk)
    # its answer was lost: sent again with the old bucket epoch, it finds its ISR and succeeds
    assert call(ctrl, rq.AlterIsr(a.leader, t.table_id, 0, a.leader_epoch, a.bucket_epoch, shrunk)) == new
    # a stale bucket epoch, a stale leader epoch, a follower: fenced, with the current state
    for server, leader_epoch, bucket_epoch in ((a.leader, a.leader_epoch, a.bucket_epoch),
                                               (a.leader, a.leader_epoch - 1, new.bucket_epoch),
                                               (a.replicas[1], a.leader_epoch, new.bucket_epoch)):
        with pytest.raises(errors.FencedLeaderEpochError) as info:
            call(ctrl, rq.AlterIsr(server, t.table_id, 0, leader_epoch, bucket_epoch, a.replicas))
        assert info.value.details == {"leader": a.leader, "leader_epoch": a.leader_epoch,
                                      "bucket_epoch": new.bucket_epoch, "isr": list(shrunk)}
    unregister(ctrl, a.replicas[2])
    with pytest.raises(errors.InvalidRequestError, match="not live"):
        call(ctrl, rq.AlterIsr(a.leader, t.table_id, 0, a.leader_epoch, new.bucket_epoch, a.replicas))
    assert states(ctrl, t)[0] == new


def test_a_resignation_is_written_and_told_answered_again_when_resent_and_refused_with_no_one_to_lead(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2)
    t = create(ctrl, "t", 1, rf=2)
    a = states(ctrl, t)[0]
    other = next(r for r in a.replicas if r != a.leader)
    pushes = len(ctrl.recorder.pushes)
    resign = rq.ResignLeadership(a.leader, ((t.table_id, 0, a.leader_epoch, "No space left on device"),))
    [moved] = call(ctrl, resign)
    assert moved.refused == "" and (moved.state.leader, moved.state.isr) == (other, (other,))
    assert states(ctrl, t)[0] == moved.state and stored(ctrl, t)[0]["leader"] == other  # written, then applied
    assert {sid for sid, *_ in ctrl.recorder.pushes[pushes:]} >= {a.leader, other}  # both replicas told
    assert call(ctrl, resign) == [moved]  # resent after its answer was lost: the same answer
    # the new leader cannot write either: nobody else is in sync, it keeps the bucket; a bucket it lacks
    kept, missing = call(ctrl, rq.ResignLeadership(other, ((t.table_id, 0, moved.state.leader_epoch, "EIO"),
                                                           (t.table_id, 3, 1, "EIO"))))
    assert kept.state == moved.state and "no other live in-sync replica" in kept.refused
    assert isinstance(missing, errors.InvalidRequestError) and "has no bucket 3" in missing.message
    assert states(ctrl, t)[0] == moved.state


def test_controlled_shutdown_moves_leaderships_and_a_standby_keeps_the_state(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, 1, 2, 3)
    t = create(ctrl, "t", 6, rf=2)
    single = create(ctrl, "single", 2, rf=1)
    assert any(a.leader == 1 for a in states(ctrl, t).values())
    pushes = len(ctrl.recorder.pushes)
    assert call(ctrl, rq.ControlledShutdown(1)) == 0
    after = states(ctrl, t)
    assert all(a.leader != 1 and 1 not in a.isr for a in after.values())
    assert len(ctrl.recorder.pushes) > pushes
    assert call(ctrl, rq.ControlledShutdown(1)) == 0  # idempotent
    assert states(ctrl, t) == after
    assert all(a.leader_epoch == 1 for a in states(ctrl, single).values())  # one replica: nothing moves

    standby = make_ctrl()  # a failover: the new coordinator reads the same state
    assert standby.assignments.by_table == ctrl.assignments.by_table
