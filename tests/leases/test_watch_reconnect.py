"""Every watch-driven cache stays exact across ZooKeeper connection losses (real ZooKeeper servers).

kazoo forgets every watch when its connection drops (it has no SetWatches):
it fires each once with ``path=None`` and arms nothing again. Each cache is
checked the same two ways:

- **restart**: a standalone ZooKeeper is killed (-9) and started again on the
  same data; the clients reconnect on their sessions; then what the cache
  watches is changed, and the cache must follow;
- **away**: the cache's client is pinned to the ensemble's leader; the leader
  is killed; the other two nodes elect a new one and the writer changes what
  the cache watches *while its client has no connection*; the old leader comes
  back and the cache must show those changes, and follow later ones.

The caches: the standby's lease mirror (and what ``exact()`` hands a new
active coordinator), the user and ACL caches of the security layer.
"""

from __future__ import annotations

import logging
from typing import Callable

import pytest
from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from kvlease.common.config import Config
from kvlease.common.security.acl import Operation, Resource
from kvlease.common.security.acl_store import AclCache, AclStore
from kvlease.common.security.users import UserCache, UserStore
from kvlease.common.security.watched import WatchedDirectory
from kvlease.common.storage import open_storage
from kvlease.common.zk import make_client
from kvlease.leases import state as ls
from kvlease.leases.mirror import LeaseMirror
from kvlease.leases.refcount import RefcountIndex
from kvlease.common.model import TableBucket
from kvlease.ops.local_cluster import ZooKeeperCluster, server_mode
from tests.conftest import TEST_DEFAULTS
from kvlease.ops.wait import wait_until
from tests.support.procs import persisted_leases
from tests.leases.test_lease_persistence import Clock, call, commit, make_table, new_controller

pytestmark = [pytest.mark.timeout(180)]

HOUR_MS = 3_600_000
SESSION_S = 30  # outlives a node's restart
#: How long a client may take to reconnect to a restarted node: kazoo retries at least every second,
#: and a node still starting turns it away (ops/local_cluster/zookeeper.py: never silence, which made
#: kazoo wait the whole session timeout and lose its session).
RECONNECT_S = 15


def _config(address: str, zk_root: str, remote_dir: str) -> Config:
    """A session that outlives a node's restart: the connection is lost, the session is not (a lost
    session reloads everything, a path tests/leases/test_lease_mirror.py covers)."""
    return Config({**TEST_DEFAULTS, "zookeeper.address": address, "zookeeper.path.root": zk_root,
                   "zookeeper.session-timeout": f"{SESSION_S}s", "remote.data.dir": f"file://{remote_dir}"}, env={})


class Faults:
    """The two ways a cache's connection is lost; ``cache_address``/``writer_address`` are the
    ZooKeeper addresses of the cache's client and of the writer's."""

    def __init__(self, kind: str, zk: ZooKeeperCluster) -> None:
        self.kind = kind
        self.zk = zk
        if kind == "restart":
            self.cache_index = 0
            self.writer_address = zk.connect_string
        else:
            self.cache_index = next(i for i, n in enumerate(zk.nodes) if server_mode(n.client_port) == "leader")
            self.writer_address = ",".join(n.address for i, n in enumerate(zk.nodes) if i != self.cache_index)
        self.cache_address = zk.nodes[self.cache_index].address

    def lose(self, cache, writer, while_away: Callable[[], None]) -> None:
        """Take the cache's node away, bring it back, and wait until both clients are connected again.
        ``while_away`` makes its changes through ``writer`` while the cache's client has no connection
        where the ensemble allows it (a standalone server has nobody to take them: right after)."""
        self.zk.kill(self.cache_index)
        wait_until(lambda: not cache.connected, 10, "the cache's client noticed the loss")
        if self.kind == "away":
            _writable(writer)  # the other two elected a leader
            while_away()
            assert not cache.connected
        self.zk.restart(self.cache_index)
        wait_until(lambda: cache.connected, RECONNECT_S, "the cache's client reconnected")
        _writable(writer)
        if self.kind == "restart":
            while_away()


def _writable(client, timeout_s: float = 30.0) -> None:
    """Wait until a ``sync`` through ``client`` succeeds: it is connected to a quorum with a leader."""
    wait_until(lambda: client.sync("/"), timeout_s, "a sync through the writer", interval_s=0.1,
               retry_on=(ConnectionLoss, SessionExpiredError))


@pytest.fixture(params=["restart", "away"])
def faults(request, kvlease_tmp) -> Faults:
    """A ZooKeeper of the test's own: standalone (``restart``) or a 3-node ensemble (``away``)."""
    zk = request.getfixturevalue("zk_single" if request.param == "restart" else "zk_ensemble")
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # connection losses are the point
    return Faults(request.param, zk)


@pytest.fixture
def clients():
    made = []

    def make(config: Config):
        client = make_client(config)
        made.append(client)
        return client

    yield make
    for client in made:
        client.stop()
        client.close()


@pytest.fixture
def standby(faults, clients, zk_root, remote_dir):
    """``(active, mirror, storage, clock)``: an active controller writing through the writer's address
    and a standby's lease mirror on the cache's address."""
    writer_config = _config(faults.writer_address, zk_root, remote_dir)
    storage = open_storage(writer_config["remote.data.dir"], writer_config)
    clock = Clock()
    active = new_controller(writer_config, storage, clock)
    mirror = LeaseMirror(clients(_config(faults.cache_address, zk_root, remote_dir)), storage, debounce_s=0.01)
    mirror.start()
    yield active, mirror, storage, clock
    mirror.stop()
    active.close()
    active.zk.stop()
    active.zk.close()


def test_lease_mirror_is_exact_after_its_connection_was_lost(faults, standby):
    """The issue's sequence: lease L on snapshot 1; the connection drops; snapshots 2 and 3; L moves to
    3 with a new deadline; the standby takes over and must hand over L as acknowledged."""
    active, mirror, storage, clock = standby
    table = make_table(active, buckets=2)
    tbs = [TableBucket(table.table_id, b) for b in range(2)]
    for b in range(2):
        commit(active, table.table_id, b, 1)
    call(active, ls.Acquire("L", {tbs[0]: 1, tbs[1]: 1}, 60_000))
    for i in range(10):
        call(active, ls.Acquire(f"other-{i}", {tbs[i % 2]: 1}, 60_000))
    wait_until(lambda: _mirrored(mirror) == _view(persisted_leases(active.zk, storage).values()), 10,
               "initial load")

    def change() -> None:
        for sid in (2, 3):
            for b in range(2):
                commit(active, table.table_id, b, sid)
        call(active, ls.Acquire("L", {tbs[0]: 3, tbs[1]: 3}, 3 * HOUR_MS))
        call(active, ls.Drop("other-0"))
        call(active, ls.Renew("other-1", 2 * HOUR_MS))

    faults.lose(mirror.zk, active.zk, change)
    call(active, ls.Acquire("other-2", {tbs[0]: 2}, HOUR_MS))  # after the reconnection too
    call(active, ls.Acquire("new", {tbs[1]: 3}, HOUR_MS))
    expected = _view(persisted_leases(active.zk, storage).values())
    assert expected["L"] == (clock() + 3 * HOUR_MS, {tbs[0]: 3, tbs[1]: 3})
    wait_until(lambda: _mirrored(mirror) == expected, 15, "the mirror follows after the reconnection")
    call(active, ls.Renew("L", 4 * HOUR_MS))  # right before the election: exact() must see it
    expected = _view(persisted_leases(active.zk, storage).values())
    leases, layout = mirror.exact()
    assert _view(leases) == expected
    assert set(layout) == set(expected)
    assert mirror.refs == RefcountIndex.from_leases(leases)


def test_lease_mirror_exact_right_after_a_reconnection_rereads_what_it_cannot_prove(faults, standby):
    """exact() straight after the connection came back (the refresher had no round in between):
    every node whose watch was dropped is read again, so a change made just before is not missed."""
    active, mirror, storage, _clock = standby
    table = make_table(active, buckets=1)
    tb = TableBucket(table.table_id, 0)
    commit(active, table.table_id, 0, 1)
    for i in range(5):
        call(active, ls.Acquire(f"L{i}", {tb: 1}, 60_000))
    wait_until(lambda: _mirrored(mirror) == _view(persisted_leases(active.zk, storage).values()), 10,
               "initial load")
    mirror.debounce_s = 60.0  # no refresher round from here on: exact() alone must be right

    def change() -> None:
        commit(active, table.table_id, 0, 2)
        call(active, ls.Acquire("L0", {tb: 2}, 2 * HOUR_MS))
        call(active, ls.Renew("L1", 3 * HOUR_MS))

    faults.lose(mirror.zk, active.zk, change)
    leases, _layout = mirror.exact()
    assert _view(leases) == _view(persisted_leases(active.zk, storage).values())
    assert mirror.stats["reread_at_election"] >= 5


def test_watched_directory_follows_across_connection_losses(faults, clients, zk_root, remote_dir):
    writer = clients(_config(faults.writer_address, zk_root, remote_dir))
    cache_zk = clients(_config(faults.cache_address, zk_root, remote_dir))
    path = "/watched"
    writer.ensure_path(path)
    for name in ("a", "b", "c"):
        writer.create(f"{path}/{name}", name.encode())
    directory = WatchedDirectory(cache_zk, path)
    try:
        wait_until(lambda: directory.snapshot == {"a": b"a", "b": b"b", "c": b"c"}, 10, "initial load")

        def change() -> None:
            writer.delete(f"{path}/a")
            writer.set(f"{path}/b", b"b2")
            writer.create(f"{path}/d", b"d")

        faults.lose(cache_zk, writer, change)
        wait_until(lambda: directory.snapshot == {"b": b"b2", "c": b"c", "d": b"d"}, 15,
                   "the changes made around the connection loss")
        writer.delete(f"{path}/c")
        writer.set(f"{path}/d", b"d2")
        writer.create(f"{path}/a", b"a2")
        wait_until(lambda: directory.snapshot == {"a": b"a2", "b": b"b2", "d": b"d2"}, 15,
                   "later changes (the watches are armed again)")
    finally:
        directory.stop()


def test_a_removed_user_and_a_revoked_grant_do_not_survive_a_reconnection(faults, clients, zk_root, remote_dir):
    writer = clients(_config(faults.writer_address, zk_root, remote_dir))
    cache_zk = clients(_config(faults.cache_address, zk_root, remote_dir))
    users, acls = UserStore(writer), AclStore(writer)
    users.add("alice", "alice-secret")
    users.add("bob", "bob-secret")
    table = Resource.table("db.t")
    acls.add(table, "User:alice", Operation.READ)
    acls.add(table, "User:bob", Operation.READ)
    user_cache, acl_cache = UserCache(cache_zk), AclCache(cache_zk)
    try:
        wait_until(lambda: user_cache.users() == ["alice", "bob"], 10, "users loaded")
        wait_until(lambda: acl_cache.authorizer.allowed("User:bob", Operation.READ, table), 10, "ACLs loaded")

        def change() -> None:
            users.remove("alice")
            acls.remove(table, "User:bob", Operation.READ)

        faults.lose(cache_zk, writer, change)
        wait_until(lambda: user_cache.users() == ["bob"], 15, "alice's removal reached the cache")
        wait_until(lambda: not acl_cache.authorizer.allowed("User:bob", Operation.READ, table), 15,
                   "bob's revoked grant reached the cache")
        users.remove("bob")
        acls.remove(table, "User:alice", Operation.READ)
        acls.add(table, "User:carol", Operation.WRITE)
        wait_until(lambda: user_cache.users() == [], 15, "a removal after the reconnection")
        wait_until(lambda: not acl_cache.authorizer.allowed("User:alice", Operation.READ, table)
                   and acl_cache.authorizer.allowed("User:carol", Operation.WRITE, table), 15,
                   "grants changed after the reconnection")
    finally:
        user_cache.stop()
        acl_cache.stop()


def _view(leases) -> dict:
    return {lease.lease_id: (lease.expiration_time, dict(lease.buckets)) for lease in leases}


def _mirrored(m: LeaseMirror) -> dict:
    return {name: (e.expiration_time, {tb: sid for t in e.paths for tb, sid in e.tables[t].items()})
            for name, e in list(m._entries.items())}  # noqa: SLF001 - what it holds now (for polling)
