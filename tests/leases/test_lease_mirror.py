"""The standby's LeaseMirror on a real ZooKeeper and remote storage (``file://`` and s3://).

- it tracks the creates, updates and deletes an active coordinator makes;
- ``exact()`` sees changes written just before it (a raw kazoo client, no waiting);
- a controller reinitialized from the mirror holds what one reinitialized by
  reading everything holds, and orphan lease files are removed by the barrier.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from kvlease.common import zkpaths
from kvlease.common.storage import open_storage
from kvlease.common.zk import dumps, loads, make_client
from kvlease.coordinator import requests as rq
from kvlease.leases import state as ls
from kvlease.coordinator.controller import Controller
from kvlease.coordinator.fencing import FencedWriter, bump_epoch
from kvlease.leases.mirror import LeaseMirror
from kvlease.leases.refcount import RefcountIndex
from kvlease.common.model import TableBucket
from kvlease.leases.store import LEASE_FILES, encode_table_file
from kvlease.ops.wait import wait_until
from tests.support.procs import persisted_leases
from tests.leases.test_lease_persistence import (  # noqa: F401 - storage_config is a fixture (file and s3)
    Clock, call, commit, make_table, new_controller, storage_config)

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]


def view(leases) -> dict:
    return {lease.lease_id: (lease.expiration_time, dict(lease.buckets)) for lease in leases}


@pytest.fixture
def env(storage_config):
    config = storage_config
    storage = open_storage(config["remote.data.dir"], config)
    clock = Clock()
    active = new_controller(config, storage, clock)
    zk = make_client(config)
    mirrors: list[LeaseMirror] = []

    def mirror() -> LeaseMirror:
        m = LeaseMirror(zk, storage, debounce_s=0.01).start()
        mirrors.append(m)
        return m

    yield active, mirror, zk, storage, clock
    for m in mirrors:
        m.stop()
    active.close()
    for client in (active.zk, zk):
        client.stop()
        client.close()


def mirrored(m: LeaseMirror) -> dict:
    """What the mirror holds now (no exactness: for polling)."""
    return {name: (e.expiration_time, {tb: sid for t in e.paths for tb, sid in e.tables[t].items()})
            for name, e in list(m._entries.items())}


def test_mirror_tracks_creates_updates_and_deletes(env):
    active, mirror, zk, storage, clock = env
    t = make_table(active, buckets=4)
    for sid in (1, 2):
        for b in range(4):
            commit(active, t.table_id, b, sid)
    tbs = [TableBucket(t.table_id, b) for b in range(4)]
    for i in range(20):
        call(active, ls.Acquire(f"pre-{i}", {tbs[i % 4]: 1}, 60_000))
    m = mirror()
    wait_until(lambda: mirrored(m) == view(persisted_leases(zk, storage).values()), 10, "initial load")
    for i in range(30):
        call(active, ls.Acquire(f"new-{i}", {tbs[i % 4]: 2, tbs[(i + 1) % 4]: 1}, 30_000))
    for i in range(0, 20, 2):
        call(active, ls.Acquire(f"pre-{i}", {tbs[(i + 2) % 4]: 2}, 90_000))  # a new table file
        call(active, ls.Renew(f"pre-{i + 1}", 120_000))  # the node only
    for i in range(0, 30, 3):
        call(active, ls.Drop(f"new-{i}"))
    call(active, ls.Release("new-1", frozenset({tbs[2]})))
    clock.now += 40_000
    call(active, ls.Expire())  # the remaining new-* expire
    expected = view(persisted_leases(zk, storage).values())
    assert "new-1" not in expected and "pre-0" in expected
    wait_until(lambda: mirrored(m) == expected, 10, "the mirror follows the active coordinator")
    leases, layout = m.exact()
    assert view(leases) == expected
    assert m.stats["reread_at_election"] == 0  # warm: nothing left to read
    assert m.refs == RefcountIndex.from_leases(leases)  # kept through creates, new files, renews, deletes
    assert layout == {name: {int(x["table_id"]): x["metadata_path"]
                             for x in loads(zk.get(zkpaths.lease(name))[0])["tables"]} for name in expected}


def _raw_lease(storage, lease_id: str, table_id: int, buckets: dict, expiration: int) -> bytes:
    path = f"{LEASE_FILES}/{table_id}/{uuid.uuid4().hex}.metadata"
    storage.write_new(path, encode_table_file(table_id, {lease_id: buckets}))
    return dumps({"version": 1, "expiration_time": expiration,
                  "tables": [{"table_id": table_id, "metadata_path": path}]})


@pytest.mark.parametrize("round_", range(5))
def test_exact_sees_changes_made_right_before_it(env, make_config, round_):
    """Writes acknowledged to another client just before ``exact()`` (no time for the
    refresher) are in its result: the sync + callback-queue barrier + re-read."""
    active, mirror, zk, storage, _clock = env
    t = make_table(active, buckets=2)
    commit(active, t.table_id, 0, 1)
    tb = TableBucket(t.table_id, 0)
    for i in range(10):
        call(active, ls.Acquire(f"L{i}", {tb: 1}, 60_000))
    m = LeaseMirror(zk, storage, debounce_s=0.01).start()
    try:
        wait_until(lambda: len(m._entries) == 10, 10, "initial load")
        m.debounce_s = 5.0  # a slow refresher from here on (not for the initial load: 5 s): exact() must do the work
        raw = make_client(make_config())
        try:
            raw.set(zkpaths.lease("L1"), _raw_lease(storage, "L1", t.table_id, {tb: 7}, 5_000_000 + round_))
            raw.set(zkpaths.lease("L2"), _raw_lease(storage, "L2", t.table_id, {tb: 8}, 6_000_000))
            raw.delete(zkpaths.lease("L3"))
            raw.create(zkpaths.lease("N1"), _raw_lease(storage, "N1", t.table_id, {tb: 9}, 7_000_000))
        finally:
            raw.stop()
            raw.close()
        leases, layout = m.exact()
    finally:
        m.stop()
    persisted = persisted_leases(zk, storage)
    assert view(leases) == view(persisted.values())
    assert m.refs == RefcountIndex.from_leases(leases)  # kept as read, handed to the new active
    got = view(leases)
    assert got["L1"] == (5_000_000 + round_, {tb: 7}) and got["N1"] == (7_000_000, {tb: 9}) and "L3" not in got
    assert set(layout) == set(persisted)
    assert m.stats["reread_at_election"] >= 3  # L1, L2, N1: read by exact(), not the refresher


def test_exact_before_the_initial_load_finished(env):
    active, mirror, zk, storage, _clock = env
    t = make_table(active, buckets=2)
    commit(active, t.table_id, 1, 1)
    for i in range(50):
        call(active, ls.Acquire(f"L{i}", {TableBucket(t.table_id, 1): 1}, 60_000))
    m = mirror()
    leases, _layout = m.exact()  # at once
    assert view(leases) == view(persisted_leases(zk, storage).values())


def test_controller_reinitialized_from_the_mirror(env):
    active, mirror, zk, storage, clock = env
    t = make_table(active, buckets=2)
    commit(active, t.table_id, 0, 1)
    commit(active, t.table_id, 1, 1)
    for i in range(10):
        call(active, ls.Acquire(f"L{i}", {TableBucket(t.table_id, i % 2): 1}, 60_000 + i))
    stray = f"{LEASE_FILES}/L0/{t.table_id}/{'ab' * 16}.metadata"
    storage.write_new(stray, b'{"version":1,"lease_id":"L0","table_id":1,"buckets":[]}')
    m = mirror()
    wait_until(lambda: len(m._entries) == 10, 10, "initial load")
    call(active, ls.Drop("L4"))
    b = Controller(zk, storage, num_retained=2, max_lease_ms=86_400_000, grace_ms=30_000, clock_ms=clock)
    try:
        _epoch, version = bump_epoch(zk)
        stats = b.reinitialize(FencedWriter(zk, version), mirror=m, defer_orphans=True)
        m.stop()
        assert stats["leases"] == 9
        b.leases.validate()  # the refcount index it took over from the mirror is that of its leases
        assert view(b.leases.leases.values()) == view(persisted_leases(zk, storage).values())
        assert storage.exists(stray)  # deferred
        listed = storage.list(LEASE_FILES)
        assert call(b, rq.RemoveOrphanLeaseFiles(tuple(listed))) == [stray]
        # the new active writes on the adopted layout: the old file goes when the pointer moves
        old = b.lease_store._paths["L0"][t.table_id]
        call(b, ls.Acquire("L0", {TableBucket(t.table_id, 1): 1}, 60_000))
        assert not storage.exists(old)
        b.close()  # waits for the background deletions
        assert not storage.exists(stray)
        assert storage.list(LEASE_FILES) == sorted(
            p for tables in b.lease_store._paths.values() for p in tables.values())
    finally:
        b.close()


def test_a_grace_written_back_is_mirrored_and_not_granted_again(env):
    """A standby's mirror carries the grace mark: the failover after next drops the lease."""
    active, mirror, zk, storage, clock = env
    t = make_table(active, buckets=1)
    commit(active, t.table_id, 0, 1)
    tb = TableBucket(t.table_id, 0)
    call(active, ls.Acquire("gap", {tb: 1}, 1_000))
    call(active, ls.Acquire("long", {tb: 1}, 600_000))
    m = mirror()
    wait_until(lambda: set(mirrored(m)) == {"gap", "long"}, 10, "initial load")
    clock.now += 5_000  # "active" died before its timer dropped "gap"
    controllers = []

    def take_over(mirror_=None) -> Controller:
        ctrl = Controller(zk, storage, num_retained=2, max_lease_ms=86_400_000, grace_ms=20_000, clock_ms=clock)
        controllers.append(ctrl)
        _epoch, version = bump_epoch(zk)
        ctrl.stats = ctrl.reinitialize(FencedWriter(zk, version), mirror=mirror_)
        return ctrl

    try:
        b = take_over()
        assert (b.stats["graced"], b.stats["expired"]) == (1, 0)
        graced_until = clock.now + 20_000
        assert b.leases.get("gap").expiration_time == graced_until
        wait_until(lambda: mirrored(m).get("gap", (0,))[0] == graced_until, 10, "the mirror sees the grace")
        clock.now = graced_until  # b died too, before its timer ran
        c = take_over(m)
        m.stop()
        assert (c.stats["graced"], c.stats["expired"]) == (0, 1)
        assert c.leases.get("gap") is None and not zk.exists(zkpaths.lease("gap"))
        assert set(persisted_leases(zk, storage)) == {"long"}
        assert c.leases.refs.holders(tb, 1) == {"long"}
    finally:
        for ctrl in controllers:
            ctrl.close()


def test_the_mirror_is_right_after_its_zookeeper_session_expired(env, storage_config):
    """Session expiry drops every watch: the mirror reloads everything on the new session,
    so changes made while it had none are seen, and later changes are tracked again."""
    active, _mirror, zk, storage, _clock = env
    t = make_table(active, buckets=2)
    commit(active, t.table_id, 0, 1)
    commit(active, t.table_id, 1, 1)
    tbs = [TableBucket(t.table_id, b) for b in range(2)]
    for i in range(20):
        call(active, ls.Acquire(f"L{i}", {tbs[i % 2]: 1}, 60_000))
    mzk = make_client(storage_config)
    lost = threading.Event()
    mzk.add_listener(lambda state: state == KazooState.LOST and lost.set())
    m = LeaseMirror(mzk, storage, debounce_s=0.01).start()
    try:
        wait_until(lambda: mirrored(m) == view(persisted_leases(zk, storage).values()), 10, "initial load")
        # expire the mirror's session: another client on the same session id closes it
        twin = KazooClient(hosts=storage_config.get("zookeeper.address"), client_id=mzk.client_id, timeout=10)
        twin.start(timeout=10)
        twin.stop()
        twin.close()
        for i in range(0, 20, 4):  # meanwhile: the watches these would fire are gone with the session
            call(active, ls.Renew(f"L{i}", 90_000 + i))
            call(active, ls.Drop(f"L{i + 1}"))
            call(active, ls.Acquire(f"L{i + 2}", {tbs[1 - (i + 2) % 2]: 1}, 70_000))  # a second table file
            call(active, ls.Acquire(f"N{i}", {tbs[0]: 1}, 50_000))
        assert lost.wait(10), "the mirror's session did not expire"
        wait_until(lambda: mzk.connected, 10, "a new session")
        wait_until(lambda: mirrored(m) == view(persisted_leases(zk, storage).values()), 10,
                   "the mirror reloaded after the session expired")
        for i in range(3, 20, 4):  # the new session's watches are armed: later changes are tracked
            call(active, ls.Renew(f"L{i}", 120_000 + i))
        call(active, ls.Drop("N0"))
        wait_until(lambda: mirrored(m) == view(persisted_leases(zk, storage).values()), 10,
                   "changes after the new session")
        assert m.stats["rounds"] >= 2 and m._loaded
        call(active, ls.Renew("L7", 150_000))  # right before the election: exact() sees it
        leases, layout = m.exact()
        persisted = persisted_leases(zk, storage)
        assert view(leases) == view(persisted.values()) and set(layout) == set(persisted)
        assert m.refs == RefcountIndex.from_leases(leases)
        assert leases and persisted["L7"].expiration_time == _clock() + 150_000
    finally:
        m.stop()
        mzk.stop()
        mzk.close()


def test_a_lease_whose_file_is_missing_is_retried_once_a_round_not_in_a_spin(env):
    """A node whose file cannot be read is read again next round (after the debounce), and
    ``exact()`` reports it unreadable; meanwhile the other leases load."""
    active, mirror, zk, storage, _clock = env
    t = make_table(active, buckets=1)
    commit(active, t.table_id, 0, 1)
    tb = TableBucket(t.table_id, 0)
    call(active, ls.Acquire("fine", {tb: 1}, 60_000))
    zk.create(zkpaths.lease("broken"), dumps({"version": 1, "expiration_time": 9_000_000, "tables": [
        {"table_id": t.table_id, "metadata_path": f"{LEASE_FILES}/broken/{t.table_id}/{'cd' * 16}.metadata"}]}))
    m = LeaseMirror(zk, storage, debounce_s=0.1).start()
    try:
        wait_until(lambda: "fine" in mirrored(m), 10, "the readable lease")
        reads = m.stats["node_reads"]
        time.sleep(1.0)  # a rate: the reads over a second
        assert m.stats["node_reads"] - reads <= 15  # ~one read per 0.1 s round, not thousands
        assert "broken" not in mirrored(m)
        leases, layout = m.exact()
        assert [lease.lease_id for lease in leases] == ["fine"] and set(m.unreadable) == {"broken"}
        assert set(layout) == {"fine", "broken"}
    finally:
        m.stop()


def test_leases_sharing_a_file_read_in_many_chunks_read_it_once(env, storage_config, monkeypatch):
    from kvlease.leases import mirror as mirror_module
    from kvlease.ops.bench.seed import seed_leases

    active, mirror, zk, storage, clock = env
    t = make_table(active, buckets=4)
    for b in range(4):
        commit(active, t.table_id, b, 1)
    ids = [f"s-{i}" for i in range(2_500)]
    assert seed_leases(storage_config, t.table_id, 4, ids, clock.now + 600_000) == 2_500  # 1,000 per file
    files = storage.list(LEASE_FILES)
    assert len(files) == 3
    monkeypatch.setattr(mirror_module, "CHUNK", 100)  # each file's leases spread over many chunks
    m = mirror()
    wait_until(lambda: len(mirrored(m)) == 2_500, 60, "initial load")
    assert mirrored(m) == view(persisted_leases(zk, storage).values())
    assert m.stats["file_reads"] == 3  # not once per chunk naming it (~25 each)
