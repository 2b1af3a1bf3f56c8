"""The drills' own reader of persisted leases (ops/drills/lease_layout.py, kept apart from the coordinator's
code on purpose) agrees with leases/store.py on real leases in a real ZooKeeper and file storage: several
tables and a partition, shared batch files, owners, a failover grace, a renewal, a release, format-1 files."""

from __future__ import annotations

import json

import pytest

from kvlease.common import zkpaths
from kvlease.common.model import Lease, TableBucket
from kvlease.common.storage import open_storage
from kvlease.common.zk import dumps, make_client
from kvlease.leases.state import PersistLease
from kvlease.leases.store import LeaseStore
from kvlease.ops.drills.lease_layout import LEASE_FILES, lease_nodes, persisted_views, pointers, view_of

DEADLINE = 1_900_000_000_000


def _persist(zk, store: LeaseStore, writes: list[PersistLease]) -> None:
    """One batch the way the coordinator's loop writes it: the files, one multi-op, then committed."""
    prepared = store.prepare(writes)
    assert not [p for p in prepared if isinstance(p, Exception)]
    txn = zk.transaction()
    for p in prepared:
        if p.op.kind == "create":
            txn.create(p.op.path, p.op.data)
        elif p.op.kind == "set":
            txn.set_data(p.op.path, p.op.data)
        else:
            txn.delete(p.op.path)
    assert not [r for r in txn.commit() if isinstance(r, Exception)]
    for p in prepared:
        store.committed(p)
    store.settle()


def _write(n: int, before: Lease | None, after: Lease | None, tables: set[int]) -> PersistLease:
    return PersistLease((1, n), "acquire" if before is None else "renew", before, after, frozenset(tables))


@pytest.fixture
def persisted(make_config):
    """A ZooKeeper client and storage holding leases written by LeaseStore (and one format-1 lease by hand)."""
    config = make_config()
    storage = open_storage(config["remote.data.dir"], config)
    zk = make_client(config)
    store = LeaseStore(storage)
    try:
        zk.ensure_path(zkpaths.LEASES)
        plain = Lease("plain", DEADLINE, {TableBucket(1, 0): 3, TableBucket(1, 1): 4, TableBucket(2, 0): 7})
        owned = Lease("owned", DEADLINE + 1, {TableBucket(1, 1): 4, TableBucket(5, 2, 11): 9}, owner="reader-7")
        graced = Lease("graced", DEADLINE + 2, {TableBucket(2, 3): 8}, graced=True)
        gone = Lease("gone", DEADLINE, {TableBucket(1, 0): 3})
        _persist(zk, store, [_write(0, None, plain, {1, 2}), _write(1, None, owned, {1, 5}),
                             _write(2, None, graced, {2}), _write(3, None, gone, {1})])
        renewed = Lease("plain", DEADLINE + 60_000, {**plain.buckets, TableBucket(2, 0): 8})
        _persist(zk, store, [_write(4, plain, renewed, {2}), _write(5, gone, None, {1})])
        old_path = f"{LEASE_FILES}/3/format-one.metadata"
        storage.write_new(old_path, json.dumps({"version": 1, "lease_id": "old", "table_id": 3, "buckets": [
            {"partition_id": None, "bucket": 0, "snapshot_id": 2}, {"bucket": 1, "snapshot_id": 5}]}).encode())
        zk.create(zkpaths.lease("old"), dumps({"version": 1, "expiration_time": DEADLINE + 3,
                                                "tables": [{"table_id": 3, "metadata_path": old_path}]}))
        yield zk, storage
    finally:
        store.close()
        zk.stop()
        zk.close()


@pytest.mark.zk
def test_the_drills_reader_sees_every_lease_as_the_coordinators_store_loads_it(persisted):
    zk, storage = persisted
    store = LeaseStore(storage)
    try:
        loaded = {lease.lease_id: lease for lease in store.load_all(zk)}
    finally:
        store.close()
    nodes = lease_nodes(zk)
    views = persisted_views(nodes, storage.read)

    assert set(loaded) == set(views) == {"plain", "owned", "graced", "old"}  # the released one is gone for both
    assert {name: view_of(lease) for name, lease in loaded.items()} == views
    assert views["plain"] == (DEADLINE + 60_000, {TableBucket(1, 0): 3, TableBucket(1, 1): 4, TableBucket(2, 0): 8})
    assert views["owned"][1] == {TableBucket(1, 1): 4, TableBucket(5, 2, 11): 9}
    assert views["old"] == (DEADLINE + 3, {TableBucket(3, 0): 2, TableBucket(3, 1): 5})
    assert loaded["owned"].owner == "reader-7" and loaded["graced"].graced  # fields the drills' view leaves out
    assert len(set(pointers(nodes)["plain"])) == 2  # its two tables' files, one rewritten by the renewal
    assert lease_nodes(zk, prefix="o").keys() == {"owned", "old"}
