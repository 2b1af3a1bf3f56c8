"""Remote storage: the same contract for ``file://`` and ``s3://`` (moto over HTTP, or MinIO)."""

from __future__ import annotations

import pickle

import pytest

from kvlease.common import storage as st
from kvlease.common.storage import file as st_file
from kvlease.common.config import Config, ConfigError
from kvlease.common.errors import StorageError
from kvlease.common.storage import FileStorage, S3Storage, StorageExists, StorageNotFound, open_storage


@pytest.fixture(params=[pytest.param("file", marks=pytest.mark.unit),
                        pytest.param("s3", marks=pytest.mark.s3)])
def storage(request, tmp_path) -> st.RemoteStorage:
    if request.param == "file":
        config = Config({"remote.file.fsync": False}, env={})
        return open_storage(f"file://{tmp_path}/remote", config)
    config = request.getfixturevalue("s3_config")  # only the s3 case starts the endpoint
    return open_storage(config["remote.data.dir"], config)


def test_open_storage_picks_the_implementation_by_scheme(tmp_path, s3_config):
    assert isinstance(open_storage(f"file://{tmp_path}"), FileStorage)
    assert isinstance(open_storage(str(tmp_path)), FileStorage)  # a bare path is a local directory
    s3 = open_storage(s3_config["remote.data.dir"], s3_config)
    assert isinstance(s3, S3Storage) and s3.endpoint == s3_config["remote.s3.endpoint"]


@pytest.mark.unit
@pytest.mark.parametrize("uri", ["hdfs://namenode/x", "gs://bucket/p", "http://example.com/x"])
def test_an_unsupported_scheme_is_an_error(uri):
    with pytest.raises(ConfigError, match="unsupported remote storage URI"):
        open_storage(uri)


def test_write_new_then_read(storage):
    storage.write_new("kv/1/0/shared/a.sst", b"sst-a")
    assert storage.read("kv/1/0/shared/a.sst") == b"sst-a"
    assert storage.exists("kv/1/0/shared/a.sst")


def test_write_new_on_an_existing_path_raises_and_keeps_the_old_bytes(storage):
    storage.write_new("lease/x.metadata", b"first")
    with pytest.raises(StorageExists):
        storage.write_new("lease/x.metadata", b"second")
    assert storage.read("lease/x.metadata") == b"first"


def test_read_of_a_missing_object_raises_not_found(storage):
    with pytest.raises(StorageNotFound) as info:
        storage.read("no/such/object")
    assert isinstance(info.value, StorageError)  # callers may catch the broader class
    assert info.value.details["path"] == "no/such/object"
    assert not storage.exists("no/such/object")


def test_put_creates_and_replaces(storage):
    storage.put("a/b", b"1")
    storage.put("a/b", b"22")
    assert storage.read("a/b") == b"22"


def test_empty_objects_round_trip(storage):
    storage.write_new("empty", b"")
    assert storage.read("empty") == b""
    assert storage.exists("empty")


def test_delete_is_idempotent(storage):
    storage.put("x/y/z", b"data")
    storage.delete("x/y/z")
    assert not storage.exists("x/y/z")
    storage.delete("x/y/z")  # already gone: not an error
    storage.delete("never/existed")
    assert storage.list("") == []


def test_delete_many(storage):
    paths = [f"kv/7/0/shared/{i}.sst" for i in range(5)]
    for path in paths:
        storage.write_new(path, b"x")
    storage.delete_many(paths[:3] + ["kv/7/0/shared/missing.sst"])
    assert storage.list("kv/7") == sorted(paths[3:])


def test_list_is_recursive_sorted_and_respects_the_prefix(storage):
    for path in ["kv/1/0/snap-2/_METADATA", "kv/1/0/shared/b.sst", "kv/1/0/shared/a.sst",
                 "kv/10/0/shared/c.sst", "lease/kv-snapshot/l1/1/u.metadata"]:
        storage.write_new(path, b".")
    assert storage.list("kv/1") == ["kv/1/0/shared/a.sst", "kv/1/0/shared/b.sst", "kv/1/0/snap-2/_METADATA"]
    assert storage.list("kv/1/") == storage.list("kv/1")
    assert storage.list("kv") == storage.list("kv/1") + ["kv/10/0/shared/c.sst"]
    assert storage.list("lease") == ["lease/kv-snapshot/l1/1/u.metadata"]
    assert storage.list("") == sorted(storage.list("kv") + storage.list("lease"))
    assert storage.list("nothing/here") == []


def test_list_sizes_gives_every_object_under_the_prefix_with_its_size(storage):
    objects = {"kv/1/0/snap-2/_METADATA": b"meta", "kv/1/0/shared/a.sst": b"a" * 1000, "kv/1/0/shared/b.sst": b"",
               "kv/10/0/shared/c.sst": b"cc", "lease/kv-snapshot/1/u.metadata": b"u"}
    for path, data in objects.items():
        storage.write_new(path, data)
    assert storage.list_sizes("kv/1/0/shared") == {"kv/1/0/shared/a.sst": 1000, "kv/1/0/shared/b.sst": 0}
    assert storage.list_sizes("kv/1") == {p: len(d) for p, d in objects.items() if p.startswith("kv/1/")}
    assert storage.list_sizes("kv/1/") == storage.list_sizes("kv/1")  # "kv/10" is not under "kv/1"
    assert storage.list_sizes("") == {p: len(d) for p, d in objects.items()}
    assert storage.list_sizes("nothing/here") == {}
    storage.put("kv/1/0/shared/a.sst", b"short")  # a replaced object: its size now
    storage.delete("kv/1/0/shared/b.sst")
    assert storage.list_sizes("kv/1/0/shared") == {"kv/1/0/shared/a.sst": 5}
    assert sorted(storage.list_sizes("kv")) == storage.list("kv")  # the same objects as list()


def test_leading_slash_means_the_same_key(storage):
    storage.write_new("/abs/key", b"v")
    assert storage.read("abs/key") == b"v"


@pytest.mark.parametrize("path", ["../escape", "a/../../b", "a/./b", "./a", "", "/", "a/.."])
def test_bad_paths_are_rejected(storage, path):
    for op in (storage.read, storage.exists, storage.delete, lambda p: storage.write_new(p, b"x"),
               lambda p: storage.put(p, b"x")):
        with pytest.raises(ValueError, match="bad storage path"):
            op(path)


def test_pickle_round_trip_works_on_the_same_data(storage):
    storage.write_new("before", b"1")  # for S3 this creates and caches the client
    clone = pickle.loads(pickle.dumps(storage))
    assert type(clone) is type(storage) and clone.uri == storage.uri
    if isinstance(clone, S3Storage):
        assert storage._client is not None and clone._client is None  # the cached client was dropped
    assert clone.read("before") == b"1"
    clone.write_new("after", b"2")
    assert storage.read("after") == b"2"
    assert clone.list("") == storage.list("") == ["after", "before"]


def test_storage_errors_survive_pickling(storage):
    with pytest.raises(StorageNotFound) as info:
        storage.read("missing")
    clone = pickle.loads(pickle.dumps(info.value))
    assert type(clone) is StorageNotFound
    assert clone.message == info.value.message and clone.details == {"path": "missing"}


def test_upload_and_download_files_round_trip(storage, tmp_path):
    local = tmp_path / "local.sst"
    local.write_bytes(b"x" * 1000 + b"\x00end")
    storage.upload_file("kv/1/0/shared/up.sst", str(local))
    assert storage.read("kv/1/0/shared/up.sst") == local.read_bytes()
    storage.download_file("kv/1/0/shared/up.sst", str(tmp_path / "back.sst"))
    assert (tmp_path / "back.sst").read_bytes() == local.read_bytes()
    with pytest.raises(StorageNotFound):
        storage.download_file("kv/1/0/shared/missing.sst", str(tmp_path / "missing.sst"))


def test_parallel_io_says_whether_calls_gain_from_a_pool(storage):
    assert storage.parallel_io is isinstance(storage, S3Storage)


@pytest.mark.unit
def test_file_storage_leaves_no_temp_files_and_prunes_empty_dirs(tmp_path):
    storage = FileStorage(f"file://{tmp_path}/r", fsync=True)
    storage.write_new("a/b/c", b"x")
    with pytest.raises(StorageExists):
        storage.write_new("a/b/c", b"y")
    assert [p.name for p in (tmp_path / "r" / "a" / "b").iterdir()] == ["c"]
    storage.delete("a/b/c")
    assert list((tmp_path / "r").iterdir()) == []


@pytest.mark.unit
def test_file_storage_list_sizes_leaves_out_writes_in_progress(tmp_path):
    storage = FileStorage(f"file://{tmp_path}", fsync=False)
    storage.write_new("kv/1/0/shared/a.sst", b"abc")
    (tmp_path / "kv" / "1" / "0" / "shared" / "b.sst.tmp-1-2").write_bytes(b"partly written")
    assert storage.list_sizes("kv/1") == {"kv/1/0/shared/a.sst": 3}


@pytest.mark.unit
def test_s3_storage_parses_bucket_and_prefix():
    storage = S3Storage("s3://bucket/some/prefix/")
    assert (storage.bucket, storage.prefix) == ("bucket", "some/prefix")
    assert storage._key("kv/1") == "some/prefix/kv/1"
    bare = S3Storage("s3://bucket")
    assert (bare.bucket, bare.prefix, bare._key("kv/1")) == ("bucket", "", "kv/1")


def test_s3_storage_without_a_prefix(s3_endpoint, s3_bucket):
    config = Config({**s3_endpoint.overrides(s3_bucket, prefix="")}, env={})
    storage = open_storage(config["remote.data.dir"], config)
    storage.write_new("k/v", b"1")
    assert storage.list("") == ["k/v"] and storage.read("k/v") == b"1"


@pytest.mark.unit
def test_s3_storages_of_a_process_read_the_s3_model_files_once(monkeypatch):
    """Each storage's client has a session of its own, but the S3 service model (JSON files botocore reads)
    is read once per process: a client per Spark task cost ~70 ms of reading them again."""
    import botocore.loaders

    reads = []
    load_file = botocore.loaders.JSONFileLoader.load_file
    monkeypatch.setattr(botocore.loaders.JSONFileLoader, "load_file",
                        lambda self, path, *args: reads.append(path) or load_file(self, path, *args))
    storages = [S3Storage("s3://bucket/p", endpoint="http://127.0.0.1:1", access_key="a", secret_key="b")
                for _ in range(3)]
    first = storages[0].client
    after_first = len(reads)
    assert all(s.client is not first for s in storages[1:])  # a client (and session) each
    assert len(reads) == after_first, reads[after_first:]

def test_docker_minio_round_trip(docker_s3):
    bucket = docker_s3.create_bucket()
    config = Config(docker_s3.overrides(bucket), env={})
    storage = open_storage(config["remote.data.dir"], config)
    storage.write_new("kv/1/0/shared/a.sst", b"sst")
    with pytest.raises(StorageExists):
        storage.write_new("kv/1/0/shared/a.sst", b"again")
    assert pickle.loads(pickle.dumps(storage)).read("kv/1/0/shared/a.sst") == b"sst"
    storage.delete("kv/1/0/shared/a.sst")
    assert storage.list("") == []


def test_write_new_many_writes_each_and_answers_each_failure(storage):
    storage.write_new("lease/b.metadata", b"old")
    outcomes = storage.write_new_many([("lease/a.metadata", b"a"), ("lease/b.metadata", b"new"),
                                       ("lease/c/d.metadata", b"d")])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], StorageExists)
    assert [storage.read(p) for p in ("lease/a.metadata", "lease/b.metadata", "lease/c/d.metadata")] == \
        [b"a", b"old", b"d"]


@pytest.mark.unit
def test_file_storage_makes_a_batch_durable_with_one_sync_instead_of_an_fsync_each(tmp_path, monkeypatch):
    storage = FileStorage(f"file://{tmp_path}", fsync=True)
    assert st_file._syncfs is not None  # Linux: the real syncfs(2)
    synced, fsynced = [], []
    real_syncfs, real_fsync = st_file._syncfs, st_file.os.fsync
    monkeypatch.setattr(st_file, "_syncfs", lambda path: (synced.append(path), real_syncfs(path)))
    monkeypatch.setattr(st_file.os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd)))
    items = [(f"lease/kv-snapshot/L{i}/1/f.metadata", b"x" * i) for i in range(5)]
    assert storage.write_new_many(items) == [None] * 5
    assert synced == [storage.root] and fsynced == []
    assert [storage.read(p) for p, _ in items] == [d for _, d in items]
    assert storage.list("") == sorted(p for p, _ in items)  # no temp file left
    storage.write_new("one/alone", b"1")  # a single file is fsync'd as before
    assert len(fsynced) == 1 and synced == [storage.root]


@pytest.mark.unit
def test_file_storage_batch_whose_sync_fails_fails_every_item_and_leaves_nothing(tmp_path, monkeypatch):
    storage = FileStorage(f"file://{tmp_path}", fsync=True)

    def broken(_path):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(st_file, "_syncfs", broken)
    outcomes = storage.write_new_many([("a/1", b"1"), ("b/2", b"2")])
    assert all(isinstance(o, StorageError) and "cannot sync" in str(o) for o in outcomes)
    assert storage.list("") == []


@pytest.mark.unit
def test_file_storage_write_under_a_file_is_a_storage_error(tmp_path):
    storage = FileStorage(f"file://{tmp_path}", fsync=False)
    storage.put("a/b", b"a file where a directory would go")
    with pytest.raises(StorageError):
        storage.write_new("a/b/c/d", b"x")
    storage.write_new("a/c/d/e", b"y")  # new directories under an existing one
    assert storage.list("a") == ["a/b", "a/c/d/e"]


@pytest.mark.unit
def test_file_storage_batch_creates_in_place_and_a_failed_item_leaves_nothing_of_itself(tmp_path, monkeypatch):
    storage = FileStorage(f"file://{tmp_path}", fsync=True)
    storage.write_new("t/taken", b"old")
    storage.put("file", b"a file where a directory would go")
    real_write = st_file.os.write

    def write(fd, data):  # the write of the item holding b"bad" fails (a full disk)
        if bytes(data) == b"bad":
            raise OSError(28, "No space left on device")
        return real_write(fd, data)
    monkeypatch.setattr(st_file.os, "write", write)
    outcomes = storage.write_new_many([("t/a", b"a"), ("t/taken", b"new"), ("file/x", b"x"), ("t/b", b"bad"),
                                       ("u/v/c", b"c")])
    assert outcomes[0] is None and outcomes[4] is None
    assert isinstance(outcomes[1], StorageExists)
    assert isinstance(outcomes[2], StorageError) and isinstance(outcomes[3], StorageError)
    assert "No space left" in str(outcomes[3])
    assert storage.list("") == ["file", "t/a", "t/taken", "u/v/c"]
    assert [storage.read(p) for p in ("t/a", "t/taken", "u/v/c")] == [b"a", b"old", b"c"]


@pytest.mark.unit
def test_file_storage_copies_files_without_reading_them_into_memory_and_says_what_failed(tmp_path, monkeypatch):
    """upload_file and download_file are kernel copies (an SST of gigabytes is never one bytes object):
    ``read`` is not used; a missing local source or target directory is a StorageError naming it."""
    storage = FileStorage(f"file://{tmp_path}/r", fsync=True)
    monkeypatch.setattr(FileStorage, "read", lambda self, path: pytest.fail("read whole into memory"))
    local = tmp_path / "big.sst"
    local.write_bytes(bytes(range(256)) * 4096)
    storage.upload_file("kv/1/0/shared/big.sst", str(local))
    storage.download_file("kv/1/0/shared/big.sst", str(tmp_path / "back.sst"))
    assert (tmp_path / "back.sst").read_bytes() == local.read_bytes()
    assert [p.name for p in (tmp_path / "r" / "kv" / "1" / "0" / "shared").iterdir()] == ["big.sst"]  # no temp
    with pytest.raises(StorageError, match="cannot write .*/missing.sst"):
        storage.upload_file("kv/1/0/shared/missing.sst", str(tmp_path / "nope.sst"))
    assert not storage.exists("kv/1/0/shared/missing.sst")
    with pytest.raises(StorageError, match="no-such-dir.*does not exist"):
        storage.download_file("kv/1/0/shared/big.sst", str(tmp_path / "no-such-dir" / "x.sst"))
    with pytest.raises(StorageNotFound):
        storage.download_file("kv/1/0/shared/gone.sst", str(tmp_path / "gone.sst"))


def test_list_stats_gives_each_objects_size_and_age_and_list_dirs_the_directories_below(storage):
    import time

    before_ms = int(time.time() * 1000) - 2000  # S3's LastModified has whole seconds; clocks may differ a little
    storage.put("kv/1/0/shared/a.sst", b"aaa")
    storage.put("kv/1/0/snap-2/_METADATA", b"{}")
    storage.put("kv/12/3/snap-4/e1-0a1b2c3d/CURRENT", b"")
    storage.put("kv/notes.txt", b"x")
    after_ms = int(time.time() * 1000) + 2000
    stats = storage.list_stats("kv/1")
    assert {path: size for path, (size, _ms) in stats.items()} == {"kv/1/0/shared/a.sst": 3,
                                                                   "kv/1/0/snap-2/_METADATA": 2}
    assert all(before_ms <= ms <= after_ms for _size, ms in stats.values()), stats
    assert storage.list_dirs("kv") == ["1", "12"]  # the object beside them is no directory
    assert storage.list_dirs("kv/12/3") == ["snap-4"]
    assert storage.list_dirs("kv/nothing") == [] and storage.list_stats("kv/nothing") == {}
