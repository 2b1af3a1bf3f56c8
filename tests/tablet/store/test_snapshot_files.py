"""A snapshot is committed only with all its files on remote storage, and the next one repairs what went missing.

Real coordinator and tablet server (in this process, :class:`tests.support.local_cluster.LocalCluster`) on a real
ZooKeeper, real RocksDB, gRPC on loopback; remote storage ``file://`` (and ``s3://`` on the local moto
endpoint). Files are deleted from remote storage behind the cluster's back: between two snapshots, and
during one (after its upload, before its commit: the tablet server's commit call is wrapped to delete first).
"""

from __future__ import annotations


import pyarrow as pa
import pytest

from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.codec import RowCodec
from kvlease.common.kvsnapshot import download, open_read_only, read_manifest
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.storage import RemoteStorage
from kvlease.common.tables import Column
from tests.support.local_cluster import LocalCluster
from tests.support.snapshot_manifests import storage_of

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def cluster(request, make_config, tmp_path):
    make = make_config
    if request.param == "s3":
        s3 = request.getfixturevalue("s3_overrides")
        make = lambda overrides=None, /, **more: make_config({**s3, **(overrides or {})}, **more)  # noqa: E731
    c = LocalCluster(make, tmp_path, tablets=1)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def storage(cluster) -> RemoteStorage:
    return storage_of(cluster.make_config())


def rows(ids, version: int) -> list[dict]:
    return [{"id": i, "v": f"v{version}-{i}-" + "x" * 40} for i in ids]


def latest(cluster, table_id: int, bucket: int = 0) -> SnapshotHandle | None:
    info = cluster.admin.get_latest_kv_snapshots(table_id).get(TableBucket(table_id, bucket))
    return info.handle if info else None


def assert_complete(storage: RemoteStorage, handle: SnapshotHandle) -> None:
    """Every file the manifest names exists on remote storage with its size."""
    manifest = read_manifest(storage, handle.metadata_path)
    listed = {}
    for prefix in sorted({f.path.rsplit("/", 1)[0] for f in manifest.files}):
        listed.update(storage.list_sizes(prefix))
    assert {f.path: listed.get(f.path) for f in manifest.files} == {f.path: f.size for f in manifest.files}


def snapshot_rows(storage: RemoteStorage, handle: SnapshotHandle, table, tmp_path) -> list[dict]:
    """The rows of the snapshot as a reader gets them: downloaded, opened read-only, values decoded."""
    target = tmp_path / f"read-{handle.bucket.bucket}-{handle.snapshot_id}"
    download(storage, handle, str(target))
    db = open_read_only(str(target))
    try:
        values = list(db.values())
    finally:
        db.close()
    return sorted(RowCodec(table).decode_values(pa.array(values, pa.binary())).to_pylist(), key=lambda r: r["id"])


def delete_table_files(storage: RemoteStorage, table_id: int) -> list[str]:
    gone = storage.list(f"kv/{table_id}")
    storage.delete_many(gone)
    assert storage.list(f"kv/{table_id}") == []
    return gone


def wrap_commit(monkeypatch, cluster, before_commit) -> None:
    """The tablet server's commits call ``before_commit(handle)`` first (after the upload)."""
    admin = cluster.tablets[1].replicas.admin
    real = admin.commit_kv_snapshot

    def commit(handle: SnapshotHandle, **fencing) -> None:
        before_commit(handle)
        real(handle, **fencing)
    monkeypatch.setattr(admin, "commit_kv_snapshot", commit)


def test_files_deleted_between_snapshots_are_uploaded_again_by_the_next(cluster, storage, tmp_path):
    table = cluster.create_table("db.t", COLUMNS, ["id"], 1)
    with TableClient(cluster.admin, "db.t") as client:
        client.upsert(rows(range(2000), 1))
        (first,) = client.trigger_snapshot(wait=True)
        gone = delete_table_files(storage, table.table_id)  # every file of snapshot 1, its shared SSTs too
        assert any("/shared/" in path for path in gone)
        client.upsert(rows(range(1000, 3000), 2))
        (second,) = client.trigger_snapshot(wait=True)
    assert second.snapshot_id > first.snapshot_id
    handle = latest(cluster, table.table_id)
    assert handle.snapshot_id == second.snapshot_id
    assert_complete(storage, handle)
    expected = rows(range(1000), 1) + rows(range(1000, 3000), 2)
    assert snapshot_rows(storage, handle, table, tmp_path) == expected


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_a_commit_whose_file_went_missing_during_the_snapshot_is_refused_naming_it(
        cluster, storage, tmp_path, monkeypatch, damage):
    table = cluster.create_table("db.t", COLUMNS, ["id"], 1)
    damaged: list[str] = []

    def damage_one_sst(handle: SnapshotHandle) -> None:
        if damaged:
            return
        path = next(f.path for f in handle.files if "/shared/" in f.path)
        if damage == "missing":
            storage.delete(path)
        else:
            storage.put(path, storage.read(path)[:-1])
        damaged.append(path)

    with TableClient(cluster.admin, "db.t") as client:
        client.upsert(rows(range(2000), 1))
        wrap_commit(monkeypatch, cluster, damage_one_sst)
        with pytest.raises(errors.InvalidSnapshotError) as info:
            client.trigger_snapshot(wait=True)
        (path,) = damaged
        assert path in info.value.message
        assert ("does not exist" if damage == "missing" else "has") in info.value.message
        assert latest(cluster, table.table_id) is None  # nothing was committed
        (committed,) = client.trigger_snapshot(wait=True)  # the next snapshot: the file is uploaded again
    handle = latest(cluster, table.table_id)
    assert handle.snapshot_id == committed.snapshot_id
    assert_complete(storage, handle)
    assert snapshot_rows(storage, handle, table, tmp_path) == rows(range(2000), 1)


def test_a_trigger_replaces_a_latest_snapshot_whose_files_are_gone_even_without_new_writes(cluster, storage, tmp_path):
    table = cluster.create_table("db.t", COLUMNS, ["id"], 1)
    with TableClient(cluster.admin, "db.t") as client:
        client.upsert(rows(range(2000), 1))
        (first,) = client.trigger_snapshot(wait=True)
        assert client.trigger_snapshot(wait=True) == []  # nothing changed, the snapshot is whole: kept
        delete_table_files(storage, table.table_id)
        (second,) = client.trigger_snapshot(wait=True)  # nothing changed, but the snapshot is broken
    assert second.snapshot_id > first.snapshot_id and second.log_offset == first.log_offset
    handle = latest(cluster, table.table_id)
    assert handle.snapshot_id == second.snapshot_id
    assert_complete(storage, handle)
    assert snapshot_rows(storage, handle, table, tmp_path) == rows(range(2000), 1)
