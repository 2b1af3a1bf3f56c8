"""One bucket's storage: a RocksDB of the current rows and the changelog of every change.

``{dir}/kv`` is the bucket's RocksDB (:class:`~tablet.kvstore.KvStore`: rows,
and the *applied offset*, the first changelog record it does not contain);
``{dir}/log`` is its :class:`~tablet.changelog.Changelog`. See
``docs/bucket-store.md``.

A write: validate and encode the batch (and, when its keys are distinct,
build its RocksDB WriteBatch) unlocked; under the bucket's write lock read the
current values of the touched keys that may exist (``tablet/key_ranges.py``)
in one multi-get, build the change records (+I, -U/+U, -D with
before-images) and write them to the changelog as one entry; fsync it
*unlocked* (the next write proceeds meanwhile, one fsync may cover several);
then, under the lock again and in offset order, publish the entry and apply
it to RocksDB in one WriteBatch that also sets the applied offset. A write
whose keys may overlap an in-flight one's waits for it first. Nothing is
visible to readers or acknowledged before its entry is durable. RocksDB
writes skip its WAL: the changelog is the log.

Invariant: the persisted KV rows are the fold of the changelog's records
``[0, a')`` for some ``a' >= a``, where ``a`` is the persisted applied offset,
and ``start <= a <= end`` of the changelog. Replaying ``[a, end)`` (put for
+I/+U, delete for -D) is idempotent on such a state (the last record of a key
decides its value), so opening the files (``tablet/bucket_files.py``) always
ends with KV == fold(changelog[0, end)) and applied offset == end.

**Replicated** (``replicated=True``, docs/bucket-store.md, "Replication"):
a write is appended, synced and published but not applied; it waits in the
pre-write buffer (``tablet/prewrite_buffer.py``; later writes read their
before-images through it) until the high watermark passes it
(``tablet/bucket_replication.py``: the high watermark, a follower's appends
and truncation, leader epochs). RocksDB then holds the fold of ``[0, a)``
with ``a <= HW``, and an open replays only up to the high watermark known
(a new store object: none beyond ``a``). Reads (``tablet/bucket_reads.py``)
see committed data only. Not replicated, the high watermark is the log end.

A store's files are opened on first use and, under a server's budget of open
buckets, parked while idle and reopened on demand; a store whose local write
failed (a full disk) reopens them by itself after a backoff
(``tablet/bucket_files.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Iterator

import pyarrow as pa

from common import config as cfg
from common import errors
from common.errors import InvalidRequestError, RecordTooLargeError
from common.limits import MAX_ENTRY_BYTES, MAX_ROW_SIZE_BOUND
from common.tables import TableInfo
from tablet import change_records, epoch_file, write_checks
from tablet.bucket_files import Backoff, BucketFiles, FileSettings
from tablet.bucket_reads import BucketReads
from tablet.bucket_replication import BucketReplication
from tablet.changelog import Changelog
from tablet.prewrite_buffer import PrewriteBuffer
from tablet.replication.epochs import EpochCache
from tablet.key_ranges import key_range
from tablet.open_buckets import OpenBuckets
from tablet.replication.sequences import Duplicate, OutOfOrder
from tablet.writer_sequences import DEFAULT_WRITER_EXPIRATION_MS, WriterSequences, load_seed
from common.codec import RowCodec
from tablet.kvstore import (APPLIED_KEY, META_CF, BucketStoreError, KvSnapshot, KvStore, PreparedWrite,
                            checkpoint_log_offset)

__all__ = ["APPLIED_KEY", "META_CF", "BucketStore", "BucketStoreError", "KvSnapshot", "checkpoint_log_offset"]

log = logging.getLogger(__name__)

_EMPTY = pa.array([], pa.binary())


def _wall_ms() -> int:
    return int(time.time() * 1000)


class BucketStore(BucketReads, BucketReplication):
    """The KV store and changelog of one bucket in ``dir``; see the module docstring.

    Thread-safe: writes, checkpoints and snapshots serialize on
    :attr:`write_lock` (re-entrant, so a caller holding it may call them);
    lookups and log reads run concurrently with them. Create it with
    :meth:`open`. Its files (:attr:`files`, ``tablet/bucket_files.py``) are
    open only while needed when it shares an
    :class:`~tablet.open_buckets.OpenBuckets` budget with other buckets: every
    method opens them again if they were parked, and a failed store reopens
    them by itself after a backoff.
    """

    def __init__(self, dir: str, table: TableInfo, files: BucketFiles, bucket: int | None = None,
                 max_row_bytes: int = MAX_ROW_SIZE_BOUND, replicated: bool = False) -> None:
        self.dir = dir
        #: Whether writes wait for the high watermark before RocksDB applies them (see the module docstring).
        self.replicated = replicated
        self.table = table
        #: The bucket this store holds: every key written or looked up must hash to it (None: not checked).
        self.bucket = bucket
        #: The largest row (encoded key + value) a write may carry (``table.max-row-size``).
        self.max_row_bytes = max_row_bytes
        self.codec = RowCodec(table)
        self.files = files
        #: Serializes writes; hold it to take a snapshot and read ``log_end_offset`` together.
        self.write_lock = threading.RLock()
        #: Writes whose changelog entry is written but not yet synced and applied: base offset -> the
        #: lowest and highest key they touch. A write waits for those whose keys may be its own.
        self._in_flight: dict[int, tuple[bytes, bytes]] = {}
        self._settled = threading.Condition(self.write_lock)  # notified as in-flight writes finish
        #: The epoch of this bucket's leadership that its writes are appended under (stamped on each
        #: changelog entry; -1: not known, e.g. a store opened outside a tablet server).
        self.leader_epoch = -1
        #: Replicated: this replica follows (``become_follower``) and appends only what its leader sent. A
        #: write that passed its leadership's check before the role changed is refused under the write lock
        #: (it would be stamped with the new leader's epoch, so no divergence check could find it).
        self.following = False
        #: Idempotent writers' batches in the changelog (``writer.id.expiration``: from_config sets it).
        self.writers = WriterSequences(DEFAULT_WRITER_EXPIRATION_MS, files.settings.clock_ms or _wall_ms)
        #: Replicated: the published entries above the applied offset, as this leader wrote them.
        self.buffer = PrewriteBuffer()
        self._hw = 0  # replicated: the high watermark known (at least the applied offset once open)
        self._epochs = EpochCache()  # the leader-epoch cache, loaded when the files open
        if replicated:
            files.replay_limit = 0  # a new store replays nothing beyond what RocksDB has applied
        files.on_open = self._opened

    def _opened(self, changelog: Changelog, kv: KvStore) -> None:
        """The files were (re)opened (``BucketFiles.on_open``): no operation runs on them yet."""
        self._epochs = epoch_file.load(self.dir, changelog, self.files.settings.fsync)
        self.writers.seed = load_seed(self.dir)
        self._hw = max(self._hw, kv.applied_offset)
        self.buffer.invalidate()

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def open(cls, dir: str, table: TableInfo, *, segment_bytes: int, fsync: bool = True,
             memtable_bytes: int | None = None, clock_ms: Callable[[], int] | None = None,
             bucket: int | None = None, max_row_bytes: int = MAX_ROW_SIZE_BOUND,
             budget: OpenBuckets | None = None, backoff: Backoff = Backoff(),
             monotonic: Callable[[], float] = time.monotonic, lazy: bool = False,
             on_failure: Callable[[], None] | None = None, replicated: bool = False) -> "BucketStore":
        """Open (creating if missing) the bucket in ``dir`` and replay the changelog into RocksDB.

        ``segment_bytes`` and ``fsync`` configure the changelog
        (``log.segment.bytes``, ``log.flush.fsync``), ``clock_ms`` its append
        times (ms since the epoch; default the wall clock). ``memtable_bytes`` sets
        RocksDB's write buffer size (default 64 MiB): after a crash, open
        replays at most about that much changelog. Raises ChangelogError if
        the bucket is open elsewhere (the changelog's lock), CorruptLogError
        for a damaged changelog, BucketStoreError if RocksDB cannot open or
        its applied offset lies outside the changelog. ``bucket``: the bucket of
        ``table`` it holds; writes and lookups of keys of another bucket are then
        refused (InvalidRowError). ``max_row_bytes``: a row whose encoded key +
        value is bigger is refused (RecordTooLargeError, ``table.max-row-size``).

        ``budget``: the server's open buckets, which may park this one's files
        while idle; ``backoff`` and ``monotonic``: when a failed store reopens
        (``tablet/bucket_files.py``), ``on_failure()`` is told of each failure.
        ``lazy``: open nothing now (the first use does, and raises what opening
        raises). ``replicated``: see the module docstring (False: replication factor 1).
        """
        settings = FileSettings(segment_bytes, fsync, memtable_bytes, RowCodec(table).key_width, clock_ms)
        files = BucketFiles(dir, settings, budget=budget, backoff=backoff, monotonic=monotonic, on_failure=on_failure)
        store = cls(dir, table, files, bucket, max_row_bytes, replicated)
        if not lazy:
            with files.use():
                pass
        return store

    @classmethod
    def from_config(cls, dir: str, table: TableInfo, config: cfg.Config,
                    clock_ms: Callable[[], int] | None = None, bucket: int | None = None,
                    budget: OpenBuckets | None = None, lazy: bool = False,
                    on_failure: Callable[[], None] | None = None, replicated: bool = False) -> "BucketStore":
        backoff = Backoff(config[cfg.BUCKET_REOPEN_BACKOFF] / 1000.0, config[cfg.BUCKET_REOPEN_BACKOFF_MAX] / 1000.0)
        store = cls.open(dir, table, segment_bytes=config[cfg.LOG_SEGMENT_BYTES], fsync=config[cfg.LOG_FLUSH_FSYNC],
                         clock_ms=clock_ms, bucket=bucket, max_row_bytes=config[cfg.MAX_ROW_SIZE], budget=budget,
                         backoff=backoff, lazy=lazy, on_failure=on_failure, replicated=replicated)
        store.writers.expiration_ms = config[cfg.WRITER_ID_EXPIRATION]
        return store

    def writer_batches(self, offset: int) -> list[tuple[int, ...]]:
        """The idempotent writers' batches ending below ``offset`` (a snapshot's log offset), for its manifest."""
        with self.files.use() as (changelog, _kv), self.write_lock:
            return self.writers.batches_below(changelog, offset)

    def close(self) -> None:
        """Close the open snapshots, RocksDB (flushing it) and the changelog. Idempotent."""
        with self.write_lock:
            while self._in_flight:
                self._settled.wait()  # writes already in the changelog finish first
            self.files.close()

    def __enter__(self) -> "BucketStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        """Whether its files are open now (not parked, not closed)."""
        return self.files.is_open

    @property
    def replayed(self) -> tuple[int, int]:
        """``(from, to)``: the changelog records replayed into RocksDB at the last open (``from == to``: none)."""
        return self.files.replayed

    @property
    def _kv(self) -> KvStore | None:  # the open RocksDB, for tests
        return self.files.kv

    @property
    def _log(self) -> Changelog | None:  # the open changelog, for tests
        return self.files.changelog

    # --- offsets ---------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """The offset the next changelog record gets (== the applied offset between writes when not
        replicated)."""
        return self.files.offsets()[1]

    @property
    def applied_offset(self) -> int:
        """The first changelog record not yet in RocksDB."""
        return self.files.offsets()[2]

    # --- writes ----------------------------------------------------------------------------

    def write(self, upserts: pa.RecordBatch | None = None, deletes: pa.RecordBatch | None = None, *,
              writer: tuple[int, int] | None = None) -> tuple[int, int]:
        """Upsert then delete rows; returns the changelog ``(base_offset, next_offset)`` written.

        ``writer``: ``(writer id, sequence)`` of an idempotent batch (:mod:`tablet.writer_sequences`;
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

        Raises ChangelogError if the changelog append failed (the store then
        refuses writes until its files are reopened, after a backoff);
        BucketStoreError if applying to RocksDB failed after the append (the
        write is in the changelog and is applied when the files are reopened),
        or if the store is closed or failed.
        """
        keys, up_values, key_list = _EMPTY, _EMPTY, []
        if upserts is not None:
            keys, up_values = self.codec.encode_arrays(upserts)
            key_list = keys.to_pylist()
            write_checks.check_bucket(self.codec, self.bucket, key_list, "upsert")
            write_checks.check_row_sizes(self.codec, self.max_row_bytes, keys, up_values)
        if deletes is not None:
            del_keys = self.codec.encode_key_array(deletes)
            del_list = del_keys.to_pylist()
            write_checks.check_bucket(self.codec, self.bucket, del_list, "delete")
            if del_list:
                keys = pa.concat_arrays([keys, del_keys]) if key_list else del_keys
                key_list = key_list + del_list
        with self.files.use() as (changelog, kv):
            if not key_list:
                with self.write_lock:
                    self.files.check_writable()
                    end = changelog.end_offset
                    return end, end
            return self._write(changelog, kv, keys, up_values, key_list, writer)

    def _write(self, changelog: Changelog, kv: KvStore, keys: pa.Array, up_values: pa.Array,
               key_list: list[bytes], writer: tuple[int, int] | None) -> tuple[int, int]:
        n_up, prepared, changes = len(up_values), None, None
        increasing = change_records.increasing(keys)
        bounds = (key_list[0], key_list[-1]) if increasing else key_range(keys)
        if increasing or len(set(key_list)) == len(key_list):
            # Each key's final state is its upsert or its delete whatever it held before: the RocksDB
            # batch is built here, while another write may hold the lock (deleting a missing key is a no-op).
            up_list = up_values.to_pylist()
            prepared = kv.prepare(key_list[:n_up], up_list, key_list[n_up:], bounds if n_up == len(key_list) else None)
            if self.replicated:
                changes = dict(zip(key_list[:n_up], up_list))
                changes.update(dict.fromkeys(key_list[n_up:]))
        with self.write_lock:
            self._check_leading()
            if writer is not None and (done := self._resent(changelog, writer)) is not None:
                return done
            while any(lo <= bounds[1] and bounds[0] <= hi for lo, hi in self._in_flight.values()):
                self._settled.wait()  # an earlier write not yet published may hold keys of this one
                self.files.check_writable()
            records, prepared, changes = self._records(changelog, kv, keys, up_values, key_list, bounds,
                                                       prepared, changes)
            if not records.num_rows:
                end = changelog.end_offset
                return end, end
            if records.nbytes > MAX_ENTRY_BYTES:
                raise RecordTooLargeError(
                    f"this write's changelog entry would be {records.nbytes} bytes, over {MAX_ENTRY_BYTES} "
                    f"(one gRPC message; an update holds the row twice): send fewer rows per write",
                    size=records.nbytes)
            epoch = self.leader_epoch
            new_epoch = epoch >= 0 and epoch != self._epochs.latest_epoch
            if new_epoch and self._stale_epoch(epoch):
                self._note_epoch(epoch, changelog.end_offset)  # raises FencedLeaderEpochError
            try:
                pending = changelog.write([records], leader_epoch=epoch, writer=writer)
                (base, nxt), = pending.ranges
                if new_epoch:
                    self._note_epoch(epoch, base)  # before the entry is durable: a crash leaves an epoch past the end
            except BaseException as exc:
                self._fail(exc)
                raise
            if writer is not None:
                self.writers.record(*writer, base, nxt, pending.timestamp)
            self._in_flight[base] = bounds
        try:
            changelog.sync(pending)  # unlocked: the next write reads and writes meanwhile; one fsync may cover both
        except BaseException as exc:
            with self.write_lock:
                del self._in_flight[base]
                self._fail(exc)
            raise
        with self.write_lock:
            try:
                self._publish(changelog, kv, pending, prepared, base, nxt, changes)
            finally:
                del self._in_flight[base]
                self._settled.notify_all()
            return base, nxt

    def _check_leading(self) -> None:
        """Under the write lock: the files take writes (else their failure) and this replica leads (else
        NotLeaderError: a write that passed its leadership's check before a push made it a follower)."""
        self.files.check_writable()
        if self.following:
            raise errors.NotLeaderError(f"bucket {self.bucket} ({self.dir}) follows its leader now (leader epoch "
                                        f"{self.leader_epoch}): this write was not appended", bucket=self.bucket)

    def _records(self, changelog: Changelog, kv: KvStore, keys: pa.Array, up_values: pa.Array,
                 key_list: list[bytes], bounds: tuple[bytes, bytes], prepared: PreparedWrite | None,
                 changes: dict | None) -> tuple[pa.RecordBatch, PreparedWrite, dict | None]:
        """The write's change records, its RocksDB batch and (replicated) the state it leaves each key in;
        before-images from RocksDB and, replicated, through the pre-write buffer. Hold the lock."""
        olds = kv.get_existing(keys, key_list, bounds)
        if self.replicated:
            self._buffer_ready(changelog, kv)
            olds = self.buffer.before_images(key_list, olds)
        if prepared is not None:
            return change_records.records_unique(keys, up_values, olds), prepared, changes
        records, put_keys, put_values, gone = change_records.changes_in_order(
            key_list, up_values.to_pylist(), olds.to_pylist())
        if self.replicated:
            changes = dict(zip(put_keys, put_values))
            changes.update(dict.fromkeys(gone))
        return records, kv.prepare(put_keys, put_values, gone), changes

    def _publish(self, changelog: Changelog, kv: KvStore, pending, prepared: PreparedWrite, base: int,
                 nxt: int, changes: dict | None) -> None:
        """Publish a synced entry and apply it to RocksDB (replicated: buffer it), in changelog order.
        Hold the lock."""
        while (changelog.end_offset if self.replicated else kv.applied_offset) != base and self.files.failure is None:
            self._settled.wait()  # published in changelog order
        if self.files.failure is not None:
            raise BucketStoreError(f"bucket {self.dir} failed before changelog records {base}..{nxt} "
                                   f"were applied ({self.files.failure!r}); it is reopened after a backoff",
                                   dir=self.dir)
        try:
            changelog.publish(pending)
        except BaseException as exc:
            self._fail(exc)
            raise
        if self.replicated:
            self.buffer.add(base, nxt, prepared, changes)
            return
        try:
            self._apply(kv, prepared, nxt)
        except BaseException as exc:
            self._fail(exc)
            raise BucketStoreError(f"bucket {self.dir}: changelog records {base}..{nxt} were appended "
                                   f"but RocksDB failed to apply them ({exc!r}); the bucket is reopened "
                                   f"to replay them", dir=self.dir) from exc

    def _resent(self, changelog: Changelog, writer: tuple[int, int]) -> tuple[int, int] | None:
        """The offsets of ``writer``'s batch if it was appended before (waiting until they are published),
        None if it is the next one. Raises OutOfOrderSequenceError otherwise. Hold the lock."""
        try:
            outcome = self.writers.check(changelog, *writer)
        except ValueError as exc:
            raise InvalidRequestError(f"idempotent write: {exc}") from None
        if isinstance(outcome, Duplicate):
            while changelog.end_offset <= outcome.last_offset and self.files.failure is None:
                self._settled.wait()  # the original is not published yet: answer once it is
            self.files.check_writable()
            return outcome.base_offset, outcome.last_offset + 1
        if isinstance(outcome, OutOfOrder):
            raise errors.OutOfOrderSequenceError(
                f"writer {writer[0]}: batch {writer[1]} is out of order for bucket {self.dir} (expected "
                f"batch {outcome.expected}); nothing was appended: take a new writer id", expected=outcome.expected)
        return None

    def _fail(self, exc: BaseException) -> None:
        """The store refuses writes until reopened; writes waiting their turn give up. Hold the lock."""
        self.files.fail(exc)
        self.writers.reset()  # entries not synced may be gone: built again from the changelog
        self.buffer.invalidate()
        self._settled.notify_all()

    def _apply(self, kv: KvStore, prepared: PreparedWrite, next_offset: int) -> None:
        kv.commit(prepared, next_offset)
