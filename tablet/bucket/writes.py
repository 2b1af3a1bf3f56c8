"""The write path of a bucket store: validate, append, fsync unlocked, publish and apply in offset order.

:class:`BucketWrites` is a part of :class:`kvlease.tablet.bucket.store.BucketStore`, which
owns it (see ``tablet/bucket/store.py`` for the write's steps and the store's
invariant). It keeps the writes in flight (appended, not yet published), so
the store and its replication part wait for them (:meth:`BucketWrites.settle`),
and fails the store's files when a write's append, fsync or apply fails
(:meth:`BucketWrites.fail`). Under which role the writes are appended (the
leader epoch stamped on them, whether the replica follows) is a
:class:`~kvlease.tablet.bucket.state.WriteRole` the store shares with its other parts.
"""

from __future__ import annotations

import threading

import pyarrow as pa

from kvlease.common import errors
from kvlease.common.errors import InvalidRequestError, RecordTooLargeError
from kvlease.common.limits import MAX_ENTRY_BYTES
from kvlease.common.row_expiry import stamp_write_time
from kvlease.tablet.bucket import merge_writes, write_checks
from kvlease.tablet.bucket.expiry_deletes import ExpiredOnly
from kvlease.tablet.bucket.state import BucketShared, WriteRole
from kvlease.tablet.log.changelog import Changelog
from kvlease.tablet.log.sequences import Duplicate, OutOfOrder
from kvlease.tablet.store import change_records, record_apply
from kvlease.tablet.store.key_ranges import key_range
from kvlease.tablet.store.kvstore import BucketStoreError, KvStore, PreparedWrite

_EMPTY = pa.array([], pa.binary())
#: What computes a write's change records and RocksDB effects from its keys' before-images.
Fold = merge_writes.MergeWrite | ExpiredOnly


class BucketWrites:
    """Writes of a :class:`~kvlease.tablet.bucket.store.BucketStore` (a part it owns; see the module docstring): they
    serialize on ``write_lock``, the store's, which this part's condition of settled writes shares."""

    def __init__(self, bucket: BucketShared) -> None:
        self.bucket = bucket
        #: Writes whose changelog entry is written but not yet synced and applied: base offset -> the
        #: lowest and highest key they touch. A write waits for those whose keys may be its own.
        self._in_flight: dict[int, tuple[bytes, bytes]] = {}
        self._settled = threading.Condition(bucket.write_lock)  # notified as in-flight writes finish

    def settle(self) -> None:
        """Wait until no write is between its append and its publication. Hold the lock."""
        while self._in_flight:
            self._settled.wait()

    def fail(self, exc: BaseException) -> None:
        """The store refuses writes until reopened; writes waiting their turn give up. Hold the lock."""
        self.bucket.files.fail(exc)
        self.bucket.writers.reset()  # entries not synced may be gone: built again from the changelog
        self.bucket.buffer.invalidate()
        self._settled.notify_all()

    def write(self, upserts: pa.RecordBatch | None = None, deletes: pa.RecordBatch | None = None, *,
              writer: tuple[int, int] | None = None, retracts: pa.RecordBatch | None = None, partial: bool = False,
              only_if: ExpiredOnly | None = None) -> tuple[int, int]:
        """Upsert then delete rows; returns the changelog ``(base_offset, next_offset)`` written.

        ``only_if`` (deletes only): a :class:`kvlease.tablet.bucket.expiry_deletes.ExpiredOnly`, which keeps
        the deletes of the keys whose current value (read under the write lock) is still expired and marks
        their records (row TTL: a write that refreshed a row meanwhile keeps it). A write-time TTL table's
        upserts get the leader's clock in their ``_write_time`` column (common/row_ttl.py).

        ``writer``: ``(writer id, sequence)`` of an idempotent batch (:mod:`kvlease.tablet.log.writer_sequences`;
        a resent one is answered with its offsets once published; a no-op records no sequence).

        ``upserts`` are full rows (missing non-key columns are null),
        ``deletes`` the primary-key columns of the rows to delete (other
        columns are ignored). The upserts apply in row order, then the
        deletes; a key written twice ends with its last write and gets the
        change records of each step. A write that changes nothing (no rows,
        only deletes of missing keys) appends nothing and returns ``(end,
        end)``. A rejected batch (InvalidRowError: also a key of another
        bucket; RecordTooLargeError: a row over ``max_row_bytes``, or a write
        whose changelog entry would not fit one gRPC message) changes nothing.

        A table with a merge engine, a partial update (``partial``: the upserts' columns are the ones
        written) and ``retracts`` (aggregation) go through :mod:`kvlease.tablet.bucket.merge_writes`
        (upserts, then retracts, then deletes; docs/merge-engines.md); an expiry delete (``only_if``) does not.

        Raises ChangelogError if the changelog append failed (the store then
        refuses writes until its files are reopened, after a backoff);
        BucketStoreError if applying to RocksDB failed after the append (the
        write is in the changelog and is applied when the files are reopened),
        or if the store is closed or failed.
        """
        codec, bucket = self.bucket.spec.codec, self.bucket.spec.bucket
        keys, up_values, key_list = _EMPTY, _EMPTY, []
        if upserts is not None and codec.table.row_ttl is not None:
            upserts = stamp_write_time(codec.table.row_ttl, codec.schema, upserts, self.bucket.files.settings.now_ms())
        if only_if is None and (codec.table.merge_engine is not None or partial or retracts is not None):
            return self._write_merged(upserts, deletes, retracts, partial, writer)
        if upserts is not None:
            keys, up_values = codec.encode_arrays(upserts)
            key_list = keys.to_pylist()
            write_checks.check_bucket(codec, bucket, key_list, "upsert")
            write_checks.check_row_sizes(codec, self.bucket.spec.max_row_bytes, keys, up_values)
        if deletes is not None:
            del_keys = codec.encode_key_array(deletes)
            del_list = del_keys.to_pylist()
            write_checks.check_bucket(codec, bucket, del_list, "delete")
            if del_list:
                keys = pa.concat_arrays([keys, del_keys]) if key_list else del_keys
                key_list = key_list + del_list
        return self._write_keys(keys, up_values, key_list, writer, only_if)

    def _write_merged(self, upserts: pa.RecordBatch | None, deletes: pa.RecordBatch | None,
                      retracts: pa.RecordBatch | None, partial: bool, writer: tuple[int, int] | None) -> tuple[int, int]:
        """:meth:`write` through the table's merge engine or as a partial update (see its docstring)."""
        codec, bucket = self.bucket.spec.codec, self.bucket.spec.bucket
        merge, keys, key_list = merge_writes.prepare(codec, upserts, retracts, deletes, partial,
                                                     max_row_bytes=self.bucket.spec.max_row_bytes, now_ms=self.bucket.files.settings.now_ms())
        write_checks.check_bucket(codec, bucket, key_list, "write")
        return self._write_keys(keys, _EMPTY, key_list, writer, merge)

    def _write_keys(self, keys: pa.Array, up_values: pa.Array, key_list: list[bytes], writer: tuple[int, int] | None,
                    fold: Fold | None) -> tuple[int, int]:
        """The checked write of ``keys`` (upserts' values first): nothing to write answers the log end."""
        with self.bucket.files.use() as (changelog, kv):
            if not key_list:
                with self.bucket.write_lock:
                    self.bucket.files.check_writable()
                    end = changelog.end_offset
                    return end, end
            return self._write(changelog, kv, keys, up_values, key_list, writer, fold)

    def _write(self, changelog: Changelog, kv: KvStore, keys: pa.Array, up_values: pa.Array,
               key_list: list[bytes], writer: tuple[int, int] | None, fold: Fold | None = None) -> tuple[int, int]:
        """``fold``: the write's rows come from the before-images (engine, partial update, expiry delete)."""
        n_up, prepared, changes = len(up_values), None, None
        increasing = change_records.increasing(keys)
        bounds = (key_list[0], key_list[-1]) if increasing else key_range(keys)
        if fold is None and (increasing or len(set(key_list)) == len(key_list)):
            # Each key's final state is its upsert or its delete whatever it held before: the RocksDB
            # batch is built here, while another write may hold the lock (deleting a missing key is a no-op).
            up_list = up_values.to_pylist()
            prepared = _prepare_distinct(keys, key_list, up_list, increasing, bounds)
            if self.bucket.spec.replicated:
                changes = dict(zip(key_list[:n_up], up_list))
                changes.update(dict.fromkeys(key_list[n_up:]))
        with self.bucket.write_lock:
            self._check_leading()
            epoch = self.bucket.role.leader_epoch  # the leadership this write is appended under, or none
            while any(lo <= bounds[1] and bounds[0] <= hi for lo, hi in self._in_flight.values()):
                self._settled.wait()  # an earlier write not yet published may hold keys of this one
                self.bucket.files.check_writable()
            # after the waits: a resend of this batch may have been appended while they released the lock
            if writer is not None and (done := self._resent(changelog, writer)) is not None:
                return done
            records, prepared, changes = self._records(changelog, kv, keys, up_values, key_list, bounds,
                                                       prepared, changes, fold)
            if not records.num_rows:
                end = changelog.end_offset
                return end, end
            _check_size(records)
            self._check_leading(epoch)  # the waits above released the lock: a push may have come meanwhile
            new_epoch = epoch >= 0 and epoch != self.bucket.epoch_file.cache.latest_epoch
            if new_epoch and self.bucket.epoch_file.stale(epoch):
                self.bucket.epoch_file.note(epoch, changelog.end_offset)  # raises FencedLeaderEpochError
            try:
                pending = changelog.write([records], leader_epoch=epoch, writer=writer)
                (base, nxt), = pending.ranges
                if new_epoch:
                    self.bucket.epoch_file.note(epoch, base)  # before the entry is durable: a crash leaves an epoch past end
            except BaseException as exc:
                self.fail(exc)
                raise
            if writer is not None:
                self.bucket.writers.record(*writer, base, nxt, pending.timestamp)
            self._in_flight[base] = bounds
        try:
            changelog.sync(pending)  # unlocked: the next write reads and writes meanwhile; one fsync may cover both
        except BaseException as exc:
            with self.bucket.write_lock:
                del self._in_flight[base]
                self.fail(exc)
            raise
        with self.bucket.write_lock:
            try:
                self._publish(changelog, kv, pending, prepared, base, nxt, changes)
            finally:
                del self._in_flight[base]
                self._settled.notify_all()
            return base, nxt

    def _check_leading(self, admitted: int | None = None) -> None:
        """Under the write lock: the files take writes (else their failure) and this replica leads (else
        NotLeaderError: a write that passed its leadership's check before a push made it a follower).
        ``admitted``: the leader epoch the write was let in under, checked again just before it is appended
        (it may have waited for an earlier write with the lock released): a write that waited through a push
        is refused too, whatever the replica is now, rather than stamped with an epoch it was not admitted by
        (a deposed leader's entry under its successor's epoch hides from every divergence check)."""
        self.bucket.files.check_writable()
        role, bucket = self.bucket.role, self.bucket.spec.bucket
        if role.following:
            raise errors.NotLeaderError(f"bucket {bucket} ({self.bucket.spec.dir}) follows its leader now (leader epoch "
                                        f"{role.leader_epoch}): this write was not appended", bucket=bucket)
        if admitted is not None and role.leader_epoch != admitted:
            raise errors.NotLeaderError(f"bucket {bucket} ({self.bucket.spec.dir}) changed leadership (leader epoch "
                                        f"{admitted} -> {role.leader_epoch}) while this write waited: it was not "
                                        f"appended", bucket=bucket)

    def _records(self, changelog: Changelog, kv: KvStore, keys: pa.Array, up_values: pa.Array,
                 key_list: list[bytes], bounds: tuple[bytes, bytes], prepared: PreparedWrite | None,
                 changes: dict | None, fold: Fold | None = None) -> tuple[pa.RecordBatch, PreparedWrite, dict | None]:
        """The write's change records, its RocksDB batch and (replicated) the state it leaves each key in;
        before-images from RocksDB and, replicated, through the pre-write buffer. Hold the lock."""
        olds = kv.get_existing(keys, key_list, bounds)
        if self.bucket.spec.replicated:
            self.bucket.buffer.ready(changelog, kv.applied_offset)
            olds = self.bucket.buffer.before_images(key_list, olds)
        if prepared is not None:
            return change_records.records_unique(keys, up_values, olds), prepared, changes
        if fold is not None:  # the write's rows from the before-images
            records, put_keys, put_values, gone = fold.changes(key_list, keys, olds)
        else:
            records, put_keys, put_values, gone = change_records.changes_in_order(
                key_list, up_values.to_pylist(), olds.to_pylist())
        if self.bucket.spec.replicated:
            changes = dict(zip(put_keys, put_values))
            changes.update(dict.fromkeys(gone))
        return records, kv.prepare(put_keys, put_values, gone), changes

    def _publish(self, changelog: Changelog, kv: KvStore, pending, prepared: PreparedWrite, base: int,
                 nxt: int, changes: dict | None) -> None:
        """Publish a synced entry and apply it to RocksDB (replicated: buffer it), in changelog order.
        Hold the lock."""
        replicated = self.bucket.spec.replicated
        while (changelog.end_offset if replicated else kv.applied_offset) != base and self.bucket.files.failure is None:
            self._settled.wait()  # published in changelog order
        if self.bucket.files.failure is not None:
            raise BucketStoreError(f"bucket {self.bucket.spec.dir} failed before changelog records {base}..{nxt} "
                                   f"were applied ({self.bucket.files.failure!r}); it is reopened after a backoff",
                                   dir=self.bucket.spec.dir)
        try:
            changelog.publish(pending)
        except BaseException as exc:
            self.fail(exc)
            raise
        if replicated:
            self.bucket.buffer.add(base, nxt, prepared, changes)
            return
        try:
            self._apply(kv, prepared, nxt)
        except BaseException as exc:
            self.fail(exc)
            raise BucketStoreError(f"bucket {self.bucket.spec.dir}: changelog records {base}..{nxt} were appended "
                                   f"but RocksDB failed to apply them ({exc!r}); the bucket is reopened "
                                   f"to replay them", dir=self.bucket.spec.dir) from exc

    def _resent(self, changelog: Changelog, writer: tuple[int, int]) -> tuple[int, int] | None:
        """The offsets of ``writer``'s batch if it was appended before (waiting until they are published),
        None if it is the next one. Raises OutOfOrderSequenceError otherwise. Hold the lock."""
        try:
            outcome = self.bucket.writers.check(changelog, *writer)
        except ValueError as exc:
            raise InvalidRequestError(f"idempotent write: {exc}") from None
        if isinstance(outcome, Duplicate):
            while changelog.end_offset <= outcome.last_offset and self.bucket.files.failure is None:
                self._settled.wait()  # the original is not published yet: answer once it is
            self.bucket.files.check_writable()
            return outcome.base_offset, outcome.last_offset + 1
        if isinstance(outcome, OutOfOrder):
            raise errors.OutOfOrderSequenceError(
                f"writer {writer[0]}: batch {writer[1]} is out of order for bucket {self.bucket.spec.dir} (expected "
                f"batch {outcome.expected}); nothing was appended: take a new writer id", expected=outcome.expected)
        return None

    def _apply(self, kv: KvStore, prepared: PreparedWrite, next_offset: int) -> None:
        kv.commit(prepared, next_offset)


def _prepare_distinct(keys: pa.Array, key_list: list[bytes], up_list: list[bytes], increasing: bool,
                      bounds: tuple[bytes, bytes]) -> PreparedWrite:
    """The RocksDB write of distinct keys (the upserts', values ``up_list``, then the deletes'): a large one in
    key order, which RocksDB's memtable takes faster (docs/bucket-store.md, "Throughput"); the changelog
    keeps the client's order."""
    n_up = len(up_list)
    put_keys, put_values = key_list[:n_up], up_list
    put_range = bounds if n_up == len(key_list) else None  # the puts' lowest and highest key, if known here
    if not increasing and n_up >= record_apply.SORTED_MIN:
        order = record_apply.key_order(keys.slice(0, n_up)).tolist()
        put_keys, put_values = [put_keys[i] for i in order], [up_list[i] for i in order]
        put_range = put_keys[0], put_keys[-1]
    return KvStore.prepare(put_keys, put_values, key_list[n_up:], put_range)


def _check_size(records: pa.RecordBatch) -> None:
    """RecordTooLargeError if a write's changelog entry would not fit one gRPC message."""
    if records.nbytes > MAX_ENTRY_BYTES:
        raise RecordTooLargeError(
            f"this write's changelog entry would be {records.nbytes} bytes, over {MAX_ENTRY_BYTES} "
            f"(one gRPC message; an update holds the row twice): send fewer rows per write", size=records.nbytes)
