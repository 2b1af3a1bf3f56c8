"""A tablet server's leader lease (tablet/replication/leader_lease.py) and when a new leadership may serve
(tablet/replicas/replica.py): pure, a fake monotonic clock; the renewal against a real ZooKeeper."""

from __future__ import annotations

import threading

import pytest

from kvlease.common import errors, zkpaths
from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.replicas.replica import Replica
from kvlease.tablet.replication.leader_lease import LeaderLease, LeaseBasis, LeaseRenewer
from kvlease.tablet.replication.roles import BucketRole


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.unit
def test_a_renewal_counts_only_for_the_basis_of_the_last_push_and_lasts_one_duration_from_its_send():
    clock = Clock()
    lease = LeaderLease(2.0, monotonic=clock)
    woken = []
    lease.on_basis = lambda: woken.append(1)
    assert not lease.valid() and not lease.renewed(clock.now, LeaseBasis(1, 0))  # no push yet
    lease.take(LeaseBasis(1, 0))
    lease.take(LeaseBasis(1, 0))
    assert woken == [1]  # a new basis is renewed at once; the same one again is nothing new
    sent = clock.now
    clock.now += 0.5  # the read took half a second
    assert lease.renewed(sent, LeaseBasis(1, 0)) and lease.valid()
    clock.now = sent + 1.99
    assert lease.valid()
    clock.now = sent + 2.0
    assert not lease.valid()  # from the send, not the answer
    assert not lease.renewed(clock.now, LeaseBasis(1, 1))  # demoted since the push: not renewed
    assert not lease.renewed(clock.now, LeaseBasis(-1, 0))  # its registration is not its session's
    lease.take(LeaseBasis(1, 1))  # the push that tells it of the demotion
    assert lease.renewed(clock.now, LeaseBasis(1, 1)) and lease.valid()
    lease.take(LeaseBasis(1, 2))  # a push of the same session: what was granted stands
    assert lease.valid()
    lease.take(LeaseBasis(7, 2))  # a push for a new session: nothing of the old one counts
    assert not lease.valid()


@pytest.mark.unit
def test_an_answer_waits_briefly_for_a_renewal_and_an_unbounded_lease_is_always_valid():
    lease = LeaderLease(5.0)
    lease.take(LeaseBasis(3, 0))
    assert not lease.wait_valid(0.05)
    threading.Timer(0.05, lambda: lease.renewed(lease.monotonic(), LeaseBasis(3, 0))).start()
    assert lease.wait_valid(5.0)
    assert LeaderLease.unbounded().valid() and LeaderLease.unbounded().wait_valid(0)


def _table() -> TableInfo:
    return TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 2, replication_factor=3)


def _role(leader: int, epoch: int, wait_ms: int = 0) -> BucketRole:
    return BucketRole(_table(), 0, epoch, leader, "", (1, 2, 3), (1, 2, 3), epoch, lease_wait_ms=wait_ms)


class _Store:  # what take_role reaches of a follower's store
    replicated = True
    is_open = False
    leader_epoch = 0


@pytest.mark.unit
def test_a_new_leadership_serves_after_its_wait_and_a_later_push_of_it_can_only_shorten_it():
    replica = Replica(_table(), 0, _Store(), uploader=None, role=_role(1, 4), server_id=2)
    replica.take_role(_role(2, 5, wait_ms=3000), now=10.0)
    with pytest.raises(errors.LeaderNotAvailableError, match="previous leader's lease"):
        replica.check_ready(12.9)
    replica.take_role(_role(2, 5, wait_ms=9000), now=11.0)  # the same leadership told again: never later
    replica.take_role(_role(2, 5, wait_ms=0), now=11.5)  # the old leader let go
    replica.check_ready(11.5)
    assert replica.leads_epoch(5) and not replica.leads_epoch(4)
    replica.take_role(_role(3, 6), now=12.0)
    assert not replica.leads_epoch(5)


def test_the_renewer_reads_the_registration_and_the_demotions_node(zk_client):
    zk = zk_client
    zk.ensure_path(zkpaths.TABLET_SERVERS)
    zk.ensure_path(zkpaths.tablet_demotions(4))
    zk.create(zkpaths.tablet_server(4), b"{}", ephemeral=True)
    lease = LeaderLease(10.0)
    renewer = LeaseRenewer(lease, zk, 4)
    assert renewer.run_once() == 0  # no push: nothing to renew
    version = zk.get(zkpaths.tablet_demotions(4))[1].version
    lease.take(LeaseBasis(zk.client_id[0], version))
    assert renewer.run_once() == 1 and lease.valid()
    zk.set(zkpaths.tablet_demotions(4), b"")  # the coordinator took a leadership from it
    lease.take(LeaseBasis(zk.client_id[0], version))
    assert renewer.run_once() == 0
    lease.take(LeaseBasis(zk.client_id[0], version + 1))
    assert renewer.run_once() == 1
    zk.delete(zkpaths.tablet_server(4))  # not registered: no lease
    assert renewer.run_once() == 0
    lease.take(LeaseBasis(zk.client_id[0] + 1, version + 1))  # a push built for another session
    zk.create(zkpaths.tablet_server(4), b"{}", ephemeral=True)
    assert renewer.run_once() == 0
