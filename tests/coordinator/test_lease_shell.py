"""Tier 1: the coordinator's lease shell without ZooKeeper (file storage, a fake fenced writer)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import pytest

from kvlease.common import errors
from kvlease.common.model import Lease, TableBucket
from kvlease.common.statemachine import Instruction, UnhandledError
from kvlease.common.storage import FileStorage, open_storage
from kvlease.common.zk import loads
from kvlease.coordinator.lease_shell import LeaseShell
from kvlease.leases import state as ls
from kvlease.leases.store import LEASE_FILES, LeaseStore
from kvlease.ops.wait import wait_until

pytestmark = pytest.mark.unit

TB = TableBucket(1, 0)


class Catalog:
    def buckets_of(self, tb: TableBucket) -> tuple[str, int]:
        if tb.table_id not in (1, 2) or tb.partition_id is not None:
            raise errors.TableNotExistError(f"table id {tb.table_id} does not exist", table_id=tb.table_id)
        return f"table db.t{tb.table_id}", 2

    def has_snapshot(self, tb: TableBucket, snapshot_id: int) -> bool:
        return snapshot_id == 1


class Writer:
    """Commits every multi-op; ``fail``: the error each one fails with instead."""

    def __init__(self) -> None:
        self.chunks: list[list] = []
        self.fail: Exception | None = None

    def commit_many(self, chunks):
        self.chunks.extend(chunks)
        return [self.fail] * len(chunks)


@pytest.fixture
def shell(tmp_path):
    clock = {"now": 5_000}
    store = LeaseStore(open_storage(f"file://{tmp_path}"))
    shell = LeaseShell(ls.LeaseState(Catalog(), 60_000), store, clock_ms=lambda: clock["now"],
                       on_freed=lambda buckets: shell.freed.append(buckets))
    shell.freed = []
    shell.clock = clock
    shell.writer = Writer()
    yield shell
    store.close()


def submit(shell: LeaseShell, event) -> Future:
    future: Future = Future()
    future.set_running_or_notify_cancel()
    shell.submit(event, future)
    return future


def test_an_instruction_without_an_executor_raises(shell):
    @dataclass(frozen=True)
    class Unknown(Instruction):
        pass

    with pytest.raises(UnhandledError):
        shell.execute([Unknown()])


def test_a_request_is_answered_only_once_its_write_is_persisted_at_the_shells_time(shell):
    acquired = submit(shell, ls.Acquire("L", {TB: 1}, 1_000))  # no now_ms: the shell's clock
    assert not acquired.done() and shell.state.get("L") is None
    shell.clock["now"] = 9_999  # the flush's time does not count
    shell.flush()
    assert acquired.result(timeout=0).expiration_time == 6_000
    assert shell.state.get("L").expiration_time == 6_000
    assert len(shell.writer.chunks) == 1


def test_writes_of_a_batch_share_one_multi_op(shell):
    futures = [submit(shell, ls.Acquire(f"L{i}", {TB: 1}, 1_000)) for i in range(5)]
    shell.flush()
    assert [f.result(timeout=0).acquired for f in futures] == [{TB: 1}] * 5
    assert [len(chunk) for chunk in shell.writer.chunks] == [5]


def test_a_failed_write_answers_the_error_and_changes_nothing(shell):
    shell.writer.fail = errors.StorageError("no")
    acquired = submit(shell, ls.Acquire("L", {TB: 1}, 1_000))
    shell.flush()
    with pytest.raises(errors.StorageError):
        acquired.result(timeout=0)
    assert shell.state.get("L") is None


def test_an_event_for_a_lease_with_a_write_in_flight_is_handed_back_unstamped(shell):
    first = submit(shell, ls.Acquire("L", {TB: 1}, 1_000))
    again = ls.Acquire("L", {TB: 1}, 2_000)
    second = submit(shell, again)
    assert shell.deferred == [(again, second)]  # stamped again when handed in again
    shell.flush()
    assert first.done() and not second.done()
    shell.deferred = []
    shell.clock["now"] = 7_000
    shell.submit(again, second)
    shell.flush()
    assert second.result(timeout=0).expiration_time == 9_000


def test_call_persists_and_returns_the_reply_or_raises_its_error(shell):
    submit(shell, ls.Acquire("L", {TB: 1, TableBucket(1, 1): 1}, 1_000))
    shell.flush()
    assert shell.call(ls.RemoveTable(1)) is None
    assert shell.state.get("L") is None and shell.freed == [{TB, TableBucket(1, 1)}]
    with pytest.raises(errors.LeaseNotFoundError):
        shell.call(ls.Renew("L", 1_000))


def test_fail_all_answers_everything_waiting(shell):
    waiting = submit(shell, ls.Acquire("L", {TB: 1}, 1_000))
    deferred = submit(shell, ls.Drop("L"))
    shell.fail_all(errors.NotCoordinatorError("bye"))
    for future in (waiting, deferred):
        with pytest.raises(errors.NotCoordinatorError):
            future.result(timeout=0)
    assert shell.deferred == []


def test_release_and_drop_are_stamped_with_the_shells_time(shell):
    submit(shell, ls.Acquire("L", {TB: 1}, 1_000))
    submit(shell, ls.Acquire("M", {TB: 1}, 1_000))
    shell.flush()
    shell.clock["now"] = 6_000  # both deadlines (6_000) reached: expired, though no timer ran
    released = submit(shell, ls.Release("L", frozenset({TB})))
    dropped = submit(shell, ls.Drop("M"))
    shell.flush()
    assert released.result(timeout=0) == ls.ReleaseOutcome(released=False, lease_remains=False)
    assert dropped.result(timeout=0) is False
    assert shell.state.leases == {}
    assert shell.freed == [{TB}]


def test_restore_persists_the_grace_before_it_returns(shell):
    loaded = [Lease("gap", 1_000, {TB: 1}), Lease("live", 9_000, {TB: 1})]
    outcome = shell.restore(loaded, 5_000, 300)
    assert outcome == ls.RestoreOutcome(2, ("gap",), ())
    (chunk,) = shell.writer.chunks
    (op,) = chunk
    assert op.path.endswith("/gap") and loads(op.data)["expiration_time"] == 5_300 and loads(op.data)["graced"]
    assert shell.state.get("gap") == Lease("gap", 5_300, {TB: 1}, graced=True)
    assert shell.state.get("live") == loaded[1]
    shell.state.validate()  # restore itself does not (it would cost the failover O(n) again)


def test_a_restore_whose_grace_write_fails_raises(shell):
    shell.writer.fail = errors.StorageError("no")
    with pytest.raises(errors.StorageError):
        shell.restore([Lease("gap", 1_000, {TB: 1})], 5_000, 300)


def _shell_on(storage):
    """A lease shell on ``storage`` with a clock the test moves: (store, clock, shell)."""
    store = LeaseStore(storage)
    clock = {"now": 5_000}
    shell = LeaseShell(ls.LeaseState(Catalog(), 60_000), store, clock_ms=lambda: clock["now"],
                       on_freed=lambda buckets: None)
    shell.writer = Writer()
    return store, clock, shell


def _one_lease_written(shell, storage) -> str:
    """Acquire lease L and persist it; its one lease file."""
    submit(shell, ls.Acquire("L", {TB: 1}, 10_000))
    shell.flush()
    (written,) = storage.list(LEASE_FILES)
    return written


class DeletesFail(FileStorage):
    """File storage whose deletes fail while ``down`` (remote storage unreachable)."""

    down = False

    def delete(self, path: str) -> None:
        if self.down:
            raise errors.StorageError(f"cannot delete {path}: storage is down", path=path)
        super().delete(path)


def test_lease_files_whose_delete_failed_are_deleted_once_storage_is_back(tmp_path):
    storage = DeletesFail(f"file://{tmp_path}", fsync=False)
    store, clock, shell = _shell_on(storage)
    try:
        written = _one_lease_written(shell, storage)
        storage.down = True
        dropped = submit(shell, ls.Drop("L"))
        shell.flush()  # the pointer is gone; its file cannot be deleted
        assert dropped.result(timeout=0) is True and shell.state.get("L") is None
        assert storage.list(LEASE_FILES) == [written] and store.undeleted == {written}
        clock["now"] += 100
        shell.flush()  # still down: tried again (off the loop), kept
        shell.settle_deletes(10)
        assert store.undeleted == {written}
        storage.down = False
        clock["now"] += 100
        shell.flush()  # not again within DELETE_RETRY_MS
        shell.settle_deletes(10)
        assert storage.list(LEASE_FILES) == [written]
        clock["now"] += 1_000
        shell.flush()  # a batch with no lease write at all (e.g. the expiry tick) retries it
        shell.settle_deletes(10)
        assert storage.list(LEASE_FILES) == [] and store.undeleted == set()
    finally:
        shell.close()
        store.close()


class DeletesHang(FileStorage):
    """File storage whose deletes block until ``release`` is set (a remote storage that stopped answering)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hang = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def delete(self, path: str) -> None:
        if self.hang.is_set():
            self.calls += 1
            if not self.release.wait(30):
                raise errors.StorageError(f"cannot delete {path}: timed out", path=path)
            raise errors.StorageError(f"cannot delete {path}: storage is down", path=path)
        super().delete(path)


def test_a_hanging_remote_storage_does_not_stall_the_loop_while_deletes_are_retried(tmp_path):
    storage = DeletesHang(f"file://{tmp_path}", fsync=False)
    store, clock, shell = _shell_on(storage)
    try:
        written = _one_lease_written(shell, storage)
        storage.release.set()  # the first failure answers at once ...
        storage.hang.set()
        submit(shell, ls.Drop("L"))
        shell.flush()
        assert store.undeleted == {written}
        storage.release.clear()  # ... the retry hangs
        clock["now"] += 1_000
        t0 = time.monotonic()
        shell.flush()  # starts the retry on the worker
        wait_until(lambda: storage.calls == 3, 10, "the retry started")  # drop, its first retry, this one
        for _ in range(5):  # later batches (lease writes, ticks) go on while it hangs
            clock["now"] += 1_000
            renewed = submit(shell, ls.Acquire(f"M{_}", {TB: 1}, 10_000))
            shell.flush()
            assert renewed.result(timeout=0).acquired == {TB: 1}
        assert time.monotonic() - t0 < 5, "a flush waited for the hanging delete"
        assert storage.calls == 3  # one retry in flight at a time: not one per flush
        storage.release.set()
        shell.settle_deletes(30)
        assert store.undeleted == {written}  # it failed: kept for the next attempt
        storage.hang.clear()
        clock["now"] += 1_000
        shell.flush()
        shell.settle_deletes(30)
        assert store.undeleted == set() and written not in storage.list(LEASE_FILES)
    finally:
        storage.release.set()
        shell.close()
        store.close()


def test_a_batch_writes_one_synced_file_per_table_and_a_failed_file_fails_only_its_writes(tmp_path, monkeypatch):
    from kvlease.common.storage import file as st
    from kvlease.leases import store as store_module
    from kvlease.leases.store import read_table_file

    storage = FileStorage(f"file://{tmp_path}", fsync=True)
    store = LeaseStore(storage)
    synced = []
    real_syncfs = st._syncfs
    monkeypatch.setattr(st, "_syncfs", lambda path: (synced.append(path), real_syncfs(path)))
    taken = f"{LEASE_FILES}/2/taken.metadata"
    storage.write_new(taken, b"already there")
    real_name = store_module.metadata_file
    monkeypatch.setattr(store_module, "metadata_file",
                        lambda table_id: taken if table_id == 2 else real_name(table_id))
    shell = LeaseShell(ls.LeaseState(Catalog(), 60_000), store, clock_ms=lambda: 5_000, on_freed=lambda _b: None)
    shell.writer = Writer()
    other = TableBucket(2, 1)
    try:
        futures = {"A": submit(shell, ls.Acquire("A", {TB: 1}, 1_000)),
                   "B": submit(shell, ls.Acquire("B", {TB: 1, other: 1}, 1_000)),  # needs table 2's file
                   "C": submit(shell, ls.Acquire("C", {TableBucket(1, 1): 1}, 1_000))}
        shell.flush()
        assert synced == [storage.root]  # one sync for the batch's files
        with pytest.raises(errors.StorageError):
            futures["B"].result(timeout=0)
        assert futures["A"].result(timeout=0).acquired == {TB: 1}
        assert futures["C"].result(timeout=0).acquired == {TableBucket(1, 1): 1}
        assert shell.state.get("B") is None and [len(chunk) for chunk in shell.writer.chunks] == [2]
        files = storage.list(LEASE_FILES)
        (shared,) = [p for p in files if p != taken]  # A's and C's entries share table 1's file
        assert len(files) == 2 and shared.startswith(f"{LEASE_FILES}/1/")
        for i, name in enumerate(("A", "C")):
            node = loads(shell.writer.chunks[0][i].data)
            assert node["tables"] == [{"table_id": 1, "metadata_path": shared}]
        content = read_table_file(storage, shared)
        # B's entry is there too (the file was written before B failed): no node points at it for B
        assert content == {"A": {TB: 1}, "B": {TB: 1}, "C": {TableBucket(1, 1): 1}}
    finally:
        store.close()


def test_a_shared_lease_file_is_deleted_only_when_its_last_lease_moved_off_it(tmp_path):
    storage = FileStorage(f"file://{tmp_path}", fsync=False)
    store, clock, shell = _shell_on(storage)
    try:
        for name in ("A", "B", "C"):
            submit(shell, ls.Acquire(name, {TB: 1}, 10_000))
        shell.flush()
        (first,) = storage.list(LEASE_FILES)
        submit(shell, ls.Release("A", frozenset({TB})))  # A goes: the file still holds B and C
        submit(shell, ls.Acquire("B", {TableBucket(1, 1): 1}, 10_000))  # B's table 1 moves to a new file
        shell.flush()
        files = storage.list(LEASE_FILES)
        assert first in files and len(files) == 2
        assert shell.state.get("C").buckets == {TB: 1}
        submit(shell, ls.Drop("C"))  # the last lease on the first file
        shell.flush()
        (second,) = storage.list(LEASE_FILES)
        assert second != first and shell.state.get("B").buckets == {TB: 1, TableBucket(1, 1): 1}
        submit(shell, ls.Drop("B"))
        shell.flush()
        assert storage.list(LEASE_FILES) == []
    finally:
        shell.close()
        store.close()


def test_a_batch_file_no_write_took_is_deleted_and_one_with_an_unknown_outcome_is_kept(tmp_path):
    storage = FileStorage(f"file://{tmp_path}", fsync=False)
    store, clock, shell = _shell_on(storage)
    try:
        shell.writer.fail = errors.InvalidRequestError("rejected")  # ZooKeeper refuses every write of the batch
        refused = [submit(shell, ls.Acquire(name, {TB: 1}, 10_000)) for name in ("A", "B")]
        shell.flush()
        assert all(f.exception(timeout=0) is not None for f in refused)
        assert storage.list(LEASE_FILES) == []  # written, taken by none: deleted
        shell.writer.fail = None
        shell.writer.commit_many = lambda chunks: (_ for _ in ()).throw(errors.OutcomeUnknownError("lost"))
        unknown = submit(shell, ls.Acquire("C", {TB: 1}, 10_000))
        with pytest.raises(errors.OutcomeUnknownError):
            shell.flush()
        assert unknown.exception(timeout=0) is not None
        assert len(storage.list(LEASE_FILES)) == 1  # a node may point at it: kept for reinitialization
    finally:
        shell.close()
        store.close()


class RefusingWriter(Writer):
    """ZooKeeper refuses every multi-op holding a write to ``refused`` (a lease node path suffix)."""

    def __init__(self, refused: str) -> None:
        super().__init__()
        self.refused = refused

    def commit_many(self, chunks):
        self.chunks.extend(chunks)
        return [errors.InvalidRequestError("rejected") if any(op.path.endswith(self.refused) for op in chunk)
                else None for chunk in chunks]


def test_a_batch_file_shared_by_a_committed_and_a_refused_write_is_kept_for_the_committed_one(tmp_path):
    storage = FileStorage(f"file://{tmp_path}", fsync=False)
    store, clock, shell = _shell_on(storage)
    try:
        shell.writer = RefusingWriter("/B")
        done, refused = (submit(shell, ls.Acquire(name, {TB: 1}, 10_000)) for name in ("A", "B"))
        shell.flush()
        assert done.result(timeout=0).acquired == {TB: 1}
        assert isinstance(refused.exception(timeout=0), errors.InvalidRequestError)
        (shared,) = storage.list(LEASE_FILES)  # one file for the batch; A points at it
        assert store.unreferenced([shared]) == []
        submit(shell, ls.Release("A", frozenset({TB})))
        shell.flush()
        assert storage.list(LEASE_FILES) == []  # its last lease moved off it
    finally:
        shell.close()
        store.close()
