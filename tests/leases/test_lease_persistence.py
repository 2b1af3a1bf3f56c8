"""The coordinator's shell on a real ZooKeeper and real remote storage (file:// and s3://).

These drive :class:`kvlease.coordinator.controller.Controller` directly (no gRPC): a
request goes in, the writes hit ZooKeeper and storage, and a second controller
reinitialized from the same ZooKeeper + storage must see the same state.
"""

from __future__ import annotations

import json
from concurrent.futures import Future

import pytest

from kvlease.common import errors, zkpaths
from kvlease.common.storage import RemoteStorage, StorageError, open_storage
from kvlease.common.tables import Column, TableSpec
from kvlease.common.zk import dumps, loads, make_client
from kvlease.coordinator import requests as rq
from kvlease.leases import state as ls
from kvlease.coordinator.controller import Controller
from kvlease.coordinator.fencing import FencedWriter, bump_epoch
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
from kvlease.leases.store import LEASE_FILES

pytestmark = pytest.mark.zk


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class FlakyStorage(RemoteStorage):
    """Delegates to a real storage; fails writes (or deletes) while told to."""

    def __init__(self, inner: RemoteStorage) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.fail_writes = False

    def read(self, path):
        return self.inner.read(path)

    def write_new(self, path, data):
        if self.fail_writes:
            raise StorageError(f"injected failure writing {path}")
        self.inner.write_new(path, data)

    def put(self, path, data):
        if self.fail_writes:
            raise StorageError(f"injected failure writing {path}")
        self.inner.put(path, data)

    def delete(self, path):
        self.inner.delete(path)

    def list(self, prefix):
        return self.inner.list(prefix)

    def exists(self, path):
        return self.inner.exists(path)


def new_controller(config, storage, clock, *, grace_ms=30_000, num_retained=2):
    zk = make_client(config)
    controller = Controller(zk, storage, num_retained=num_retained, max_lease_ms=86_400_000,
                            grace_ms=grace_ms, clock_ms=clock)
    _epoch, version = bump_epoch(zk)
    controller.reinitialize(FencedWriter(zk, version))
    return controller


def call(controller: Controller, request):
    future: Future = Future()
    deferred = controller.process([(request, future)])
    assert not deferred
    return future.result(timeout=0)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def storage_config(request, make_config):
    if request.param == "file":
        return make_config()
    return make_config(request.getfixturevalue("s3_overrides"))


@pytest.fixture
def env(storage_config):
    clock = Clock()
    storage = FlakyStorage(open_storage(storage_config["remote.data.dir"], storage_config))
    controllers = []

    def make(**kwargs):
        ctrl = new_controller(storage_config, storage, clock, **kwargs)
        controllers.append(ctrl)
        return ctrl

    yield make, storage, clock, storage_config
    for ctrl in controllers:
        ctrl.close()
        ctrl.zk.stop()
        ctrl.zk.close()


def make_table(ctrl, name="t", buckets=4):
    spec = TableSpec("db", name, (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), buckets)
    return call(ctrl, rq.CreateTable(spec))


def commit(ctrl, table_id, bucket, sid, shared=("shared/a.sst",), storage=None):
    base = f"kv/{table_id}/{bucket}"
    files = tuple(SnapshotFile(f"{base}/{name}", 10) for name in shared)
    handle = SnapshotHandle(TableBucket(table_id, bucket), sid, sid * 100, f"{base}/snap-{sid}/_METADATA", files)
    if storage is not None:
        for path in handle.file_paths():
            if not storage.exists(path):
                storage.put(path, b"x")
    call(ctrl, rq.CommitSnapshot(handle))
    return handle


def table_with_snapshot_1_of_two_buckets(ctrl):
    """A new table with snapshot 1 of buckets 0 and 1 committed; the table and the two buckets."""
    t = make_table(ctrl)
    commit(ctrl, t.table_id, 0, 1)
    commit(ctrl, t.table_id, 1, 1)
    return t, TableBucket(t.table_id, 0), TableBucket(t.table_id, 1)


def lease_files(storage) -> list[str]:
    return storage.list(LEASE_FILES)


def zk_lease_node(ctrl, lease_id):
    data, _ = ctrl.zk.get(zkpaths.lease(lease_id))
    return loads(data)


def test_round_trip_through_reinitialization(env):
    make, storage, clock, _ = env
    a = make()
    t1, t2 = make_table(a, "t1"), make_table(a, "t2", buckets=2)
    for tb in range(4):
        commit(a, t1.table_id, tb, 1)
    commit(a, t2.table_id, 0, 1)
    commit(a, t2.table_id, 1, 7)
    out = call(a, ls.Acquire("job-1", {TableBucket(t1.table_id, 0): 1, TableBucket(t1.table_id, 1): 1,
                                            TableBucket(t2.table_id, 1): 7}, 60_000))
    assert out.unavailable == {}
    out = call(a, ls.Acquire("job-2", {TableBucket(t1.table_id, 0): 1, TableBucket(t2.table_id, 0): 99}, 60_000))
    assert out.unavailable == {TableBucket(t2.table_id, 0): 99}
    assert call(a, ls.Release("job-1", frozenset({TableBucket(t1.table_id, 1)}))) == ls.ReleaseOutcome(True, True)
    clock.now += 5_000
    renewed = call(a, ls.Renew("job-2", 120_000))
    assert renewed == clock.now + 120_000

    before = {lease.lease_id: lease for lease in call(a, rq.ListLeases())}
    b = make()  # a new epoch: reinitializes from ZooKeeper + storage
    after = {lease.lease_id: lease for lease in call(b, rq.ListLeases())}
    assert after == before
    assert after["job-1"].buckets == {TableBucket(t1.table_id, 0): 1, TableBucket(t2.table_id, 1): 7}
    assert b.leases.refs == a.leases.refs
    assert b.leases.refs.holders(TableBucket(t1.table_id, 0), 1) == {"job-1", "job-2"}
    # exactly one metadata file per (lease, table), each one pointed at by ZooKeeper
    pointed = {t["metadata_path"] for lid in after for t in zk_lease_node(b, lid)["tables"]}
    assert sorted(pointed) == lease_files(storage)
    assert len(pointed) == 3  # job-1: t1 + t2, job-2: t1


def test_only_changed_tables_get_new_files(env):
    make, storage, _clock, _ = env
    a = make()
    t1, t2 = make_table(a, "t1"), make_table(a, "t2")
    commit(a, t1.table_id, 0, 1)
    commit(a, t1.table_id, 0, 2)
    commit(a, t2.table_id, 0, 1)
    call(a, ls.Acquire("L", {TableBucket(t1.table_id, 0): 1, TableBucket(t2.table_id, 0): 1}, 60_000))
    first = {t["table_id"]: t["metadata_path"] for t in zk_lease_node(a, "L")["tables"]}
    call(a, ls.Acquire("L", {TableBucket(t1.table_id, 0): 2}, 60_000))
    second = {t["table_id"]: t["metadata_path"] for t in zk_lease_node(a, "L")["tables"]}
    assert second[t2.table_id] == first[t2.table_id]
    assert second[t1.table_id] != first[t1.table_id]
    assert lease_files(storage) == sorted(second.values())  # the old t1 file is gone
    call(a, ls.Renew("L", 30_000))  # renew rewrites no file
    assert {t["table_id"]: t["metadata_path"] for t in zk_lease_node(a, "L")["tables"]} == second


def test_orphan_lease_files_removed_on_reinitialization(env):
    make, storage, _clock, _ = env
    a = make()
    t = make_table(a)
    commit(a, t.table_id, 0, 1)
    call(a, ls.Acquire("keep", {TableBucket(t.table_id, 0): 1}, 60_000))
    kept = lease_files(storage)
    storage.put(f"{LEASE_FILES}/keep/{t.table_id}/stray.metadata", b"{}")
    storage.put(f"{LEASE_FILES}/gone-lease/{t.table_id}/abc.metadata", b"{}")
    b = make()
    assert lease_files(storage) == kept
    assert b.leases.get("keep") is not None


def test_failed_remote_write_changes_nothing(env):
    make, storage, clock, _ = env
    a = make()
    t = make_table(a)
    commit(a, t.table_id, 0, 1)
    commit(a, t.table_id, 0, 2)
    call(a, ls.Acquire("L", {TableBucket(t.table_id, 0): 1}, 60_000))
    node_before, files_before = zk_lease_node(a, "L"), lease_files(storage)
    refs_before = a.leases.refs.as_dict()

    storage.fail_writes = True
    with pytest.raises(StorageError):
        call(a, ls.Acquire("L", {TableBucket(t.table_id, 0): 2}, 60_000))
    with pytest.raises(StorageError):
        call(a, ls.Acquire("new", {TableBucket(t.table_id, 0): 2}, 60_000))
    storage.fail_writes = False

    assert a.leases.get("L").buckets == {TableBucket(t.table_id, 0): 1}
    assert a.leases.get("new") is None
    assert a.leases.refs.as_dict() == refs_before
    assert zk_lease_node(a, "L") == node_before
    assert not a.zk.exists(zkpaths.lease("new"))
    assert lease_files(storage) == files_before
    a.leases.validate()
    # and it works again once storage does
    assert call(a, ls.Acquire("new", {TableBucket(t.table_id, 0): 2}, 60_000)).acquired


def test_failed_zookeeper_write_changes_nothing(env):
    make, storage, _clock, _ = env
    a = make()
    t = make_table(a)
    commit(a, t.table_id, 0, 1)
    call(a, ls.Acquire("L", {TableBucket(t.table_id, 0): 1}, 60_000))
    # someone removed the node behind the coordinator's back: the update's multi-op fails
    a.zk.delete(zkpaths.lease("L"))
    files_before = lease_files(storage)
    with pytest.raises(errors.StorageError):
        call(a, ls.Renew("L", 90_000))
    assert a.leases.get("L").expiration_time == 1_000_000 + 60_000
    with pytest.raises(errors.StorageError):
        call(a, ls.Acquire("L", {TableBucket(t.table_id, 1): 1}, 60_000))
    assert lease_files(storage) == files_before  # the new file of the failed write was removed
    a.leases.validate()


def test_expiry_frees_snapshots_and_reclaims_them(env):
    make, storage, clock, _ = env
    a = make()
    t = make_table(a)
    h1 = commit(a, t.table_id, 0, 1, shared=("shared/a.sst", "shared/old.sst"), storage=storage)
    call(a, ls.Acquire("L", {TableBucket(t.table_id, 0): 1}, 10_000))
    commit(a, t.table_id, 0, 2, storage=storage)
    commit(a, t.table_id, 0, 3, storage=storage)
    # snapshot 1 is past retention but leased: kept, with its files
    assert a.snapshots.has_snapshot(TableBucket(t.table_id, 0), 1)
    assert all(storage.exists(p) for p in h1.file_paths())
    clock.now += 10_000
    call(a, ls.Expire())
    a.close()  # waits for the background file deletions
    assert a.leases.get("L") is None
    assert not a.snapshots.has_snapshot(TableBucket(t.table_id, 0), 1)
    assert not a.zk.exists(zkpaths.snapshot(t.table_id, 0, 1))
    assert not storage.exists(h1.metadata_path)
    assert not storage.exists(f"kv/{t.table_id}/0/shared/old.sst")
    assert storage.exists(f"kv/{t.table_id}/0/shared/a.sst")  # still used by snapshots 2 and 3
    assert not a.zk.exists(zkpaths.lease("L"))
    assert lease_files(storage) == []


def test_release_reclaims_at_once(env):
    make, storage, _clock, _ = env
    a = make()
    t = make_table(a)
    h1 = commit(a, t.table_id, 1, 1, shared=("shared/x.sst",), storage=storage)
    call(a, ls.Acquire("L1", {TableBucket(t.table_id, 1): 1}, 60_000))
    call(a, ls.Acquire("L2", {TableBucket(t.table_id, 1): 1}, 60_000))
    commit(a, t.table_id, 1, 2, shared=("shared/y.sst",), storage=storage)
    commit(a, t.table_id, 1, 3, shared=("shared/y.sst",), storage=storage)
    assert call(a, ls.Drop("L1")) is True
    assert a.snapshots.has_snapshot(TableBucket(t.table_id, 1), 1)  # L2 still holds it
    assert call(a, ls.Release("L2", frozenset({TableBucket(t.table_id, 1)}))) == ls.ReleaseOutcome(True, False)
    a.close()
    assert not a.snapshots.has_snapshot(TableBucket(t.table_id, 1), 1)
    assert not storage.exists(f"kv/{t.table_id}/1/shared/x.sst")
    assert not storage.exists(h1.metadata_path)


def test_leases_expired_during_the_gap_get_the_grace(env):
    make, _storage, clock, _ = env
    a = make()
    t = make_table(a)
    commit(a, t.table_id, 0, 1)
    call(a, ls.Acquire("short", {TableBucket(t.table_id, 0): 1}, 1_000))
    call(a, ls.Acquire("long", {TableBucket(t.table_id, 0): 1}, 600_000))
    clock.now += 5_000  # "a" died; nobody expired "short"
    b = make(grace_ms=20_000)
    assert b.leases.get("short").expiration_time == clock.now + 20_000
    assert b.leases.get("long").expiration_time == 1_000_000 + 600_000
    clock.now += 20_000
    call(b, ls.Expire())
    assert b.leases.get("short") is None and b.leases.get("long") is not None


def test_drop_table_removes_it_from_every_lease(env):
    make, storage, _clock, _ = env
    a = make()
    t1, t2 = make_table(a, "t1"), make_table(a, "t2")
    h = commit(a, t1.table_id, 0, 1, storage=storage)
    commit(a, t2.table_id, 0, 1, storage=storage)
    call(a, ls.Acquire("both", {TableBucket(t1.table_id, 0): 1, TableBucket(t2.table_id, 0): 1}, 60_000))
    call(a, ls.Acquire("only", {TableBucket(t1.table_id, 0): 1}, 60_000))
    call(a, rq.DropTable("db", "t1"))
    a.close()
    assert a.leases.get("only") is None
    assert a.leases.get("both").buckets == {TableBucket(t2.table_id, 0): 1}
    assert [t["table_id"] for t in zk_lease_node(a, "both")["tables"]] == [t2.table_id]
    assert not a.zk.exists(zkpaths.table(t1.table_id))
    assert not storage.exists(h.metadata_path)
    assert storage.list(f"kv/{t1.table_id}") == []
    assert all(f"/{t1.table_id}/" not in p for p in lease_files(storage))
    with pytest.raises(errors.TableNotExistError):
        call(a, ls.Acquire("x", {TableBucket(t1.table_id, 0): 1}, 60_000))
    # table ids are never reused, also after a failover
    b = make()
    t3 = make_table(b, "t1")
    assert t3.table_id > t2.table_id


def test_the_failover_grace_is_written_back_and_granted_once(env):
    make, storage, clock, _ = env
    a = make()
    t, tb0, tb1 = table_with_snapshot_1_of_two_buckets(a)
    call(a, ls.Acquire("gap", {tb0: 1, tb1: 1}, 1_000))
    files = lease_files(storage)
    clock.now += 5_000  # "a" died; nobody expired "gap"
    b = make(grace_ms=20_000)
    graced_until = clock.now + 20_000
    node = zk_lease_node(b, "gap")
    assert (node["expiration_time"], node["graced"]) == (graced_until, True)  # the grace is persisted
    assert lease_files(storage) == files  # it changes no bucket: no new file
    assert call(b, rq.DescribeLease("gap")).expiration_time == graced_until
    assert [lease.lease_id for lease in call(b, rq.ListLeases())] == ["gap"]

    clock.now = graced_until + 1  # "b" died before its timer dropped "gap"
    c = make(grace_ms=20_000)
    assert c.leases.get("gap") is None  # no second grace: dropped as it loads
    assert not c.zk.exists(zkpaths.lease("gap"))
    assert lease_files(storage) == []
    assert not c.leases.refs.is_leased(tb0, 1) and not c.leases.refs.is_leased(tb1, 1)
    with pytest.raises(errors.LeaseNotFoundError):
        call(c, rq.DescribeLease("gap"))


def test_a_lease_past_its_deadline_is_gone_for_every_request_before_the_timer(env):
    make, storage, clock, _ = env
    a = make()
    t = make_table(a)
    for bucket in range(3):
        commit(a, t.table_id, bucket, 1)
    tb0, tb1, tb2 = (TableBucket(t.table_id, b) for b in range(3))
    for name in ("renewed", "released", "dropped", "acquired", "listed"):
        call(a, ls.Acquire(name, {tb0: 1, tb1: 1}, 10_000))
    clock.now += 10_000  # every deadline reached; no Expire handed in

    assert call(a, rq.ListLeases()) == []  # hidden at once
    with pytest.raises(errors.LeaseNotFoundError):
        call(a, rq.DescribeLease("listed"))
    with pytest.raises(errors.LeaseNotFoundError, match="expired"):
        call(a, ls.Renew("renewed", 10_000))
    assert call(a, ls.Release("released", frozenset({tb0}))) == ls.ReleaseOutcome(False, False)
    assert call(a, ls.Drop("dropped")) is False
    fresh = call(a, ls.Acquire("acquired", {tb2: 1}, 30_000))
    assert (fresh.expiration_time, fresh.acquired) == (clock.now + 30_000, {tb2: 1})
    # each request dropped the lease it met (persisted); the acquire replaced it by a new one
    assert set(a.leases.leases) == {"acquired", "listed"}
    assert a.leases.get("acquired").buckets == {tb2: 1}
    for name in ("renewed", "released", "dropped"):
        assert not a.zk.exists(zkpaths.lease(name))
    node = zk_lease_node(a, "acquired")
    assert node["expiration_time"] == clock.now + 30_000 and len(node["tables"]) == 1
    assert a.leases.refs.holders(tb0, 1) == {"listed"}
    b = make()  # what was persisted is what a new coordinator loads
    assert b.leases.get("acquired") == a.leases.get("acquired")
    assert b.leases.get("listed").graced  # expired, never dropped: it gets the failover grace
    assert set(b.leases.leases) == {"acquired", "listed"}


def test_a_lease_whose_file_is_missing_or_corrupt_is_left_out_and_kept(env):
    """Reinitialization survives a lease file deleted (e.g. by a forged snapshot's reclaim) or
    corrupt: that lease is not loaded, its node and files are kept, everything else serves."""
    make, storage, _clock, _ = env
    a = make()
    t = make_table(a)
    tb = TableBucket(t.table_id, 0)
    commit(a, t.table_id, 0, 1)
    for lease_id in ("gone", "corrupt", "fine"):
        call(a, ls.Acquire(lease_id, {tb: 1}, 60_000))
    gone_file = zk_lease_node(a, "gone")["tables"][0]["metadata_path"]
    corrupt_file = zk_lease_node(a, "corrupt")["tables"][0]["metadata_path"]
    storage.delete(gone_file)
    storage.inner.delete(corrupt_file)
    storage.put(corrupt_file, b"not json")

    b = make()  # reinitializes (no mirror: LeaseStore.load_all)
    assert sorted(b.lease_store.unreadable) == ["corrupt", "gone"]
    assert [lease.lease_id for lease in call(b, rq.ListLeases())] == ["fine"]
    assert b.leases.refs.holders(tb, 1) == {"fine"}
    assert zk_lease_node(b, "gone") and zk_lease_node(b, "corrupt")  # kept for an operator
    assert storage.exists(corrupt_file)  # not taken for an orphan
    assert call(b, rq.RemoveOrphanLeaseFiles(tuple(lease_files(storage)))) == []
    # acquiring the lease again replaces it: its node is set, the unreadable file goes
    call(b, ls.Acquire("corrupt", {tb: 1}, 60_000))
    assert not storage.exists(corrupt_file)
    assert sorted(b.lease_store.unreadable) == ["gone"]
    assert sorted(lease.lease_id for lease in make().leases.leases.values()) == ["corrupt", "fine"]


def test_a_lease_in_a_format_1_file_loads_and_its_next_change_moves_it_to_a_shared_file(env):
    make, storage, clock, _ = env
    a = make()
    t, tb0, tb1 = table_with_snapshot_1_of_two_buckets(a)
    old = f"{LEASE_FILES}/old/{t.table_id}/{'ab' * 16}.metadata"  # an earlier version's layout: a file per lease
    storage.put(old, json.dumps({"version": 1, "lease_id": "old", "table_id": t.table_id, "buckets": [
        {"partition_id": None, "bucket": 0, "snapshot_id": 1}]}).encode())
    a.zk.create(zkpaths.lease("old"), dumps({"version": 1, "expiration_time": clock.now + 60_000,
                                              "tables": [{"table_id": t.table_id, "metadata_path": old}]}))
    b = make()
    assert b.leases.get("old").buckets == {tb0: 1}
    assert lease_files(storage) == [old]
    call(b, ls.Acquire("old", {tb1: 1}, 60_000))
    (new,) = lease_files(storage)  # the old file went once the pointer moved
    assert new.startswith(f"{LEASE_FILES}/{t.table_id}/")
    assert zk_lease_node(b, "old")["tables"] == [{"table_id": t.table_id, "metadata_path": new}]
    assert make().leases.get("old").buckets == {tb0: 1, tb1: 1}
