"""Lost data on a real ZooKeeper with a real controller: a tablet server registering a new data dir, replica
losses reported, restore and operator elections written fenced and kept across a failover. Tablet servers are
registered by hand (their ZooKeeper nodes)."""

from __future__ import annotations

import json

import pytest

from kvlease.common import errors, zkpaths
from kvlease.coordinator import requests as rq
from tests.coordinator.test_assignment import call
from tests.coordinator.test_replication import create, make_ctrl, states, stored  # noqa: F401  (fixture)

pytestmark = pytest.mark.zk


def register(ctrl, dirs: dict[int, str], incarnation: str = "a") -> None:
    for sid, dir_id in dirs.items():
        node = json.dumps({"address": f"127.0.0.1:{1000 + sid}", "incarnation": incarnation,
                           "dir_id": dir_id}).encode()
        if ctrl.zk.exists(zkpaths.tablet_server(sid)):
            ctrl.zk.set(zkpaths.tablet_server(sid), node)
        else:
            ctrl.zk.create(zkpaths.tablet_server(sid), node, ephemeral=True, makepath=True)
    call(ctrl, rq.TabletServersChanged())


def test_a_new_data_dir_loses_its_replicas_and_restore_brings_the_bucket_back(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, {1: "d1", 2: "d2"})
    single = create(ctrl, "single", 2, rf=1)
    replicated = create(ctrl, "rep", 2, rf=2)
    assert json.loads(ctrl.zk.get(zkpaths.tablet_dir(1))[0]) == {"dir_id": "d1"}  # first sight: recorded
    on_1 = [b for b, a in states(ctrl, single).items() if a.leader == 1]
    register(ctrl, {1: "d1"}, incarnation="b")  # a plain restart: nothing lost
    assert all(not a.offline_reason for a in states(ctrl, single).values())

    register(ctrl, {1: "new"}, incarnation="c")  # a wiped disk
    lost = states(ctrl, single)
    assert all(lost[b].leader == -1 and "new data dir" in lost[b].offline_reason for b in on_1)
    assert all(1 not in a.isr and a.leader != 1 for a in states(ctrl, replicated).values())
    assert all("offline_reason" in stored(ctrl, single)[b] for b in on_1)  # persisted, fenced
    assert json.loads(ctrl.zk.get(zkpaths.tablet_dir(1))[0]) == {"dir_id": "new"}

    standby = make_ctrl()  # a failover keeps the dir ids and the offline state: nothing lost again, nothing served
    assert standby.members.dirs.by_server == {1: "new", 2: "d2"}
    register(standby, {1: "new"}, incarnation="c")
    assert {b: states(standby, single)[b] for b in on_1} == {b: lost[b] for b in on_1}  # not lost again
    bucket = on_1[0]
    with pytest.raises(errors.InvalidRequestError, match="--accept-data-loss"):
        call(standby, rq.RestoreBucket(single.table_id, bucket, False))
    loss, state = call(standby, rq.RestoreBucket(single.table_id, bucket, True))
    assert (loss.kind, loss.from_offset, loss.snapshot_id, loss.last_known_end) == ("restore", 0, 0, -1)
    assert (state.leader, state.offline_reason, state.losses) == (1, "", (loss,))
    assert call(standby, rq.RestoreBucket(single.table_id, bucket, True)) == (loss, state)  # retried
    assert stored(standby, single)[bucket]["losses"][0]["kind"] == "restore"
    assert standby.recorder.pushes  # the restore was told to the bucket's server


def test_reported_replica_loss_and_log_ends_then_unclean_election(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, {1: "d1", 2: "d2"})
    t = create(ctrl, "t", 1, rf=2)
    a = states(ctrl, t)[0]
    leader, follower = a.leader, next(r for r in a.replicas if r != a.leader)
    call(ctrl, rq.ReportLogEnds(leader, ((t.table_id, 0, a.leader_epoch, 42),)))
    assert ctrl.losses.last_known_end(t.table_id, 0) == 42
    call(ctrl, rq.ReportLogEnds(follower, ((t.table_id, 0, a.leader_epoch, 99),)))  # not its leader: ignored
    assert ctrl.losses.last_known_end(t.table_id, 0) == 42

    call(ctrl, rq.ReportReplicaLoss(leader, t.table_id, 0, "its files are corrupt"))
    moved = states(ctrl, t)[0]
    assert (moved.leader, moved.isr) == (follower, (follower,))  # the next ISR member leads, cleanly
    call(ctrl, rq.ReportReplicaLoss(follower, t.table_id, 0, "its files are corrupt"))
    offline = states(ctrl, t)[0]
    assert offline.leader == -1 and "corrupt" in offline.offline_reason and offline.isr == ()
    assert call(ctrl, rq.ReportReplicaLoss(follower, t.table_id, 0, "again")) == offline  # idempotent

    loss, state = call(ctrl, rq.ElectLeader(t.table_id, 0, True, follower))
    assert (state.leader, state.isr, loss.kind, loss.from_offset, loss.last_known_end) == (
        follower, (follower,), "unclean", -1, 42)
    call(ctrl, rq.ReportLogEnds(follower, ((t.table_id, 0, state.leader_epoch, 30),), True))
    resolved = states(ctrl, t)[0].losses[-1]
    assert (resolved.from_offset, resolved.lost_offsets()) == (30, 12)


def test_one_flush_stores_each_tables_ends_in_its_own_node(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, {1: "d1"})
    t, other = create(ctrl, "t", 3, rf=1), create(ctrl, "other", 2, rf=1)
    ends = tuple((table.table_id, b, a.leader_epoch, 10 * table.table_id + b)
                 for table in (t, other) for b, a in sorted(states(ctrl, table).items()))
    call(ctrl, rq.ReportLogEnds(1, ends))
    assert ctrl.losses.ends.flush(force=True) == 2
    for table in (t, other):
        node = json.loads(ctrl.zk.get(zkpaths.log_ends(table.table_id))[0])
        assert sorted(node["buckets"]) == [str(b) for b in range(table.buckets)]
        assert [end for _epoch, end in node["buckets"].values()] == [10 * table.table_id + b
                                                                     for b in range(table.buckets)]
    # one end of one table moves: that table's node is written again (all its buckets), the other is not
    other_version = ctrl.zk.get(zkpaths.log_ends(other.table_id))[1].version
    (_t, bucket, epoch, end), *_ = ends
    call(ctrl, rq.ReportLogEnds(1, ((t.table_id, bucket, epoch, end + 5),)))
    assert ctrl.losses.ends.flush(force=True) == 1
    node = json.loads(ctrl.zk.get(zkpaths.log_ends(t.table_id))[0])
    assert node["buckets"][str(bucket)][1] == end + 5 and len(node["buckets"]) == t.buckets
    assert ctrl.zk.get(zkpaths.log_ends(other.table_id))[1].version == other_version


def test_reported_log_ends_are_stored_for_a_coordinator_taking_over_and_go_with_their_table(make_ctrl):
    """The server whose disk is gone reports nothing again: what it reported last must survive a failover,
    or a restore after one could not say how many offsets it loses."""
    ctrl = make_ctrl()
    register(ctrl, {1: "d1"})
    t = create(ctrl, "t", 2, rf=1)
    other = create(ctrl, "other", 1, rf=1)
    ends = tuple((t.table_id, b, a.leader_epoch, 40 + b) for b, a in sorted(states(ctrl, t).items()))
    call(ctrl, rq.ReportLogEnds(1, ends))
    assert ctrl.losses.ends.flush() == 0  # not yet: at most every FLUSH_MS
    assert ctrl.losses.ends.flush(force=True) == 1  # one node: the table whose ends moved
    assert ctrl.losses.ends.flush(force=True) == 0  # nothing moved since
    standby = make_ctrl()
    assert [standby.losses.last_known_end(t.table_id, b) for b in (0, 1)] == [40, 41]
    assert standby.losses.last_known_end(other.table_id, 0) == -1

    register(standby, {1: "new"}, incarnation="b")  # the disk is gone: bucket 0 offline, restored from nothing
    loss, _state = call(standby, rq.RestoreBucket(t.table_id, 0, True))
    assert (loss.from_offset, loss.last_known_end, loss.lost_offsets()) == (0, 40, 40)

    call(standby, rq.DropTable("db", "t"))
    assert standby.losses.last_known_end(t.table_id, 1) == -1
    assert standby.zk.exists(zkpaths.log_ends(t.table_id))
    assert standby.losses.ends.flush(force=True) == 1  # its node deleted
    assert not standby.zk.exists(zkpaths.log_ends(t.table_id))


def _handle(table_id: int, sid: int, log_offset: int):
    from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
    return SnapshotHandle(TableBucket(table_id, 0), sid, log_offset, f"kv/{table_id}/0/snap-{sid}/_METADATA",
                          (SnapshotFile(f"kv/{table_id}/0/shared/{sid}.sst", 1),))


def test_snapshots_of_a_lost_history_stay_dropped_across_a_failover(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, {1: "d1", 2: "d2"})
    t = create(ctrl, "t", 1, rf=2)
    for sid, offset in ((1, 10), (2, 20)):
        call(ctrl, rq.CommitSnapshot(_handle(t.table_id, sid, offset)))
    a = states(ctrl, t)[0]
    leader, follower = a.leader, next(r for r in a.replicas if r != a.leader)
    call(ctrl, rq.ReportReplicaLoss(follower, t.table_id, 0, "behind"))
    call(ctrl, rq.ReportReplicaLoss(leader, t.table_id, 0, "its files are corrupt"))
    loss, state = call(ctrl, rq.ElectLeader(t.table_id, 0, True, follower))
    assert loss.newest_snapshot_id == 2
    ctrl.losses.on_resolved = lambda tb, losses: None  # the coordinator dies between the two writes
    call(ctrl, rq.ReportLogEnds(follower, ((t.table_id, 0, state.leader_epoch, 15),), True))
    assert [h.snapshot_id for h, _l, _r in call(ctrl, rq.ListSnapshots(t.table_id))] == [1, 2]

    standby = make_ctrl()  # takes over: the resolved loss drops snapshot 2 (offset 20 > 15), deleted at once
    assert [h.snapshot_id for h, _l, _r in call(standby, rq.ListSnapshots(t.table_id))] == [1]
    assert ctrl.zk.get_children(zkpaths.bucket_snapshots(t.table_id, 0)) == ["1"]
    call(standby, rq.ReportLogEnds(follower, ((t.table_id, 0, state.leader_epoch, 15),), True))  # resent: no-op
    call(standby, rq.CommitSnapshot(_handle(t.table_id, 3, 16)))  # the new leader's: not blocked by snapshot 2
    assert [h.snapshot_id for h, _l, _r in call(standby, rq.ListSnapshots(t.table_id))] == [1, 3]
    standby.snapshots.validate()


def test_restore_of_a_bucket_whose_server_is_gone_moves_it_to_a_live_server_not_decommissioned(make_ctrl):
    ctrl = make_ctrl()
    register(ctrl, {1: "d1"})
    t = create(ctrl, "gone", 1, rf=1)
    assert states(ctrl, t)[0].replicas == (1,)
    register(ctrl, {2: "d2", 3: "d3"})
    assert call(ctrl, rq.DecommissionTablet(2)) is not None  # holds nothing: only marked
    ctrl.zk.delete(zkpaths.tablet_server(1))  # gone for good
    call(ctrl, rq.TabletServersChanged())
    with pytest.raises(errors.InvalidRequestError, match="bucket restore db.gone --bucket 0 --accept-data-loss "
                                                         "--tablet N"):
        call(ctrl, rq.DecommissionTablet(1))
    with pytest.raises(errors.InvalidRequestError, match="tablet server 2 is decommissioned"):
        call(ctrl, rq.RestoreBucket(t.table_id, 0, True, 2))
    loss, state = call(ctrl, rq.RestoreBucket(t.table_id, 0, True))
    assert (state.leader, state.replicas, state.isr, loss.leader) == (3, (3,), (3,), 3)
    assert stored(ctrl, t)[0]["replicas"] == [3]  # persisted, fenced
    assert ctrl.recorder.held[3][(t.table_id, 0)][0].leader_epoch == loss.leader_epoch  # told to its new server

    standby = make_ctrl()  # a retry after a failover answers the same record (the takeover bumped the epoch)
    call(standby, rq.TabletServersChanged())
    again, now = call(standby, rq.RestoreBucket(t.table_id, 0, True))
    assert (again, now.leader, now.replicas, now.losses) == (loss, 3, (3,), (loss,))
