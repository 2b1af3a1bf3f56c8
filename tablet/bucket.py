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
decides its value), so :meth:`BucketStore.open` always ends with KV ==
fold(changelog[0, end)) and applied offset == end.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common import config as cfg
from common.errors import InvalidRequestError, InvalidRowError, RecordTooLargeError, show
from common.limits import MAX_ENTRY_BYTES, MAX_ROW_SIZE_BOUND
from common.tables import TableInfo
from common.logentry import SCHEMA, ChangeType, LogEntry
from tablet.changelog import Changelog, SegmentInfo
from tablet.key_ranges import key_range
from common.codec import RowCodec, bucket_array
from common.codec_arrays import value_offsets
from tablet.kvstore import (APPLIED_KEY, META_CF, BucketStoreError, KvSnapshot, KvStore, PreparedWrite,
                            checkpoint_log_offset)

__all__ = ["APPLIED_KEY", "META_CF", "BucketStore", "BucketStoreError", "KvSnapshot", "checkpoint_log_offset"]

log = logging.getLogger(__name__)

_INSERT, _UPDATE_BEFORE, _UPDATE_AFTER, _DELETE = (int(ct) for ct in ChangeType)
_REPLAY_BYTES = 16 << 20  # changelog bytes replayed per WriteBatch at open
_EMPTY = pa.array([], pa.binary())


class BucketStore:
    """The KV store and changelog of one bucket in ``dir``; see the module docstring.

    Thread-safe: writes, checkpoints and snapshots serialize on
    :attr:`write_lock` (re-entrant, so a caller holding it may call them);
    lookups and log reads run concurrently with them. Create it with
    :meth:`open`.
    """

    def __init__(self, dir: str, table: TableInfo, changelog: Changelog, kv: KvStore,
                 bucket: int | None = None, max_row_bytes: int = MAX_ROW_SIZE_BOUND) -> None:
        self.dir = dir
        self.table = table
        #: The bucket this store holds: every key written or looked up must hash to it (None: not checked).
        self.bucket = bucket
        #: The largest row (encoded key + value) a write may carry (``table.max-row-size``).
        self.max_row_bytes = max_row_bytes
        self.codec = RowCodec(table)
        self._log = changelog
        self._kv = kv
        #: Serializes writes; hold it to take a snapshot and read ``log_end_offset`` together.
        self.write_lock = threading.RLock()
        #: Writes whose changelog entry is written but not yet synced and applied: base offset -> the
        #: lowest and highest key they touch. A write waits for those whose keys may be its own.
        self._in_flight: dict[int, tuple[bytes, bytes]] = {}
        self._settled = threading.Condition(self.write_lock)  # notified as in-flight writes finish
        #: ``(from, to)``: the changelog records replayed into RocksDB at open (``from == to``: none).
        self.replayed = (kv.applied_offset, kv.applied_offset)
        self._failed: BaseException | None = None
        self._closed = False

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def open(cls, dir: str, table: TableInfo, *, segment_bytes: int, fsync: bool = True,
             memtable_bytes: int | None = None, clock_ms: Callable[[], int] | None = None,
             bucket: int | None = None, max_row_bytes: int = MAX_ROW_SIZE_BOUND) -> "BucketStore":
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
        """
        os.makedirs(dir, exist_ok=True)
        changelog = Changelog(os.path.join(dir, "log"), segment_bytes=segment_bytes, fsync=fsync, clock_ms=clock_ms)
        try:
            kv = KvStore(os.path.join(dir, "kv"), memtable_bytes=memtable_bytes,
                         key_width=RowCodec(table).key_width)
        except BaseException:
            changelog.close()
            raise
        store = cls(dir, table, changelog, kv, bucket, max_row_bytes)
        try:
            store._recover()
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def from_config(cls, dir: str, table: TableInfo, config: cfg.Config,
                    clock_ms: Callable[[], int] | None = None, bucket: int | None = None) -> "BucketStore":
        return cls.open(dir, table, segment_bytes=config[cfg.LOG_SEGMENT_BYTES], fsync=config[cfg.LOG_FLUSH_FSYNC],
                        clock_ms=clock_ms, bucket=bucket, max_row_bytes=config[cfg.MAX_ROW_SIZE])

    def close(self) -> None:
        """Close the open snapshots, RocksDB (flushing it) and the changelog. Idempotent."""
        with self.write_lock:
            if self._closed:
                return
            while self._in_flight:
                self._settled.wait()  # writes already in the changelog finish first
            self._closed = True
            try:
                self._kv.close()
            finally:
                self._log.close()

    def __enter__(self) -> "BucketStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recover(self) -> None:
        """Replay the changelog from the applied offset to its end (see the module docstring)."""
        applied = self._kv.applied_offset
        start, end = self._log.start_offset, self._log.end_offset
        if applied > end:
            raise BucketStoreError(f"bucket {self.dir}: RocksDB has applied changelog records up to offset "
                                   f"{applied} but the changelog ends at {end} (changelog lost records "
                                   f"written without fsync?)", dir=self.dir, applied=applied, end_offset=end)
        if applied < start:
            raise BucketStoreError(f"bucket {self.dir}: RocksDB has applied records up to offset {applied} "
                                   f"but the changelog starts at {start}", dir=self.dir, applied=applied,
                                   start_offset=start)
        offset = applied
        while offset < end:
            entries: list[LogEntry] = self._log.read(offset, _REPLAY_BYTES)
            offset = entries[-1].next_offset
            self._kv.apply_records([e.records for e in entries], offset)
        self.replayed = (applied, end)
        if end > applied:
            log.info("bucket %s: replayed changelog records %d..%d into RocksDB", self.dir, applied, end)

    # --- offsets ---------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """The offset the next changelog record gets (== the applied offset between writes)."""
        return self._log.end_offset

    @property
    def applied_offset(self) -> int:
        """The first changelog record not yet in RocksDB."""
        return self._kv.applied_offset

    def list_offsets(self) -> tuple[int, int]:
        """``(earliest, latest)``: the changelog's start offset and end offset."""
        return self._log.start_offset, self._log.end_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first changelog offset appended at or after ``timestamp_ms``
        (:meth:`Changelog.offset_for_timestamp`)."""
        return self._log.offset_for_timestamp(timestamp_ms)

    # --- writes ----------------------------------------------------------------------------

    def write(self, upserts: pa.RecordBatch | None = None, deletes: pa.RecordBatch | None = None) -> tuple[int, int]:
        """Upsert then delete rows; returns the changelog ``(base_offset, next_offset)`` written.

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
        refuses writes: reopen it); BucketStoreError if applying to RocksDB
        failed after the append (the write is in the changelog and is applied
        when the store is reopened), or if the store is closed or failed.
        """
        keys, up_values, key_list = _EMPTY, _EMPTY, []
        if upserts is not None:
            keys, up_values = self.codec.encode_arrays(upserts)
            key_list = keys.to_pylist()
            self._check_bucket(key_list, "upsert")
            self._check_row_sizes(keys, up_values)
        if deletes is not None:
            del_keys = self.codec.encode_key_array(deletes)
            del_list = del_keys.to_pylist()
            self._check_bucket(del_list, "delete")
            if del_list:
                keys = pa.concat_arrays([keys, del_keys]) if key_list else del_keys
                key_list = key_list + del_list
        if not key_list:
            with self.write_lock:
                self._check_writable()
                end = self._log.end_offset
                return end, end
        n_up, prepared = len(up_values), None
        increasing = _increasing(keys)
        bounds = (key_list[0], key_list[-1]) if increasing else key_range(keys)
        if increasing or len(set(key_list)) == len(key_list):
            # Each key's final state is its upsert or its delete whatever it held before: the RocksDB
            # batch is built here, while another write may hold the lock (deleting a missing key is a no-op).
            prepared = self._kv.prepare(key_list[:n_up], up_values.to_pylist(), key_list[n_up:],
                                        bounds if n_up == len(key_list) else None)
        with self.write_lock:
            self._check_writable()
            while any(lo <= bounds[1] and bounds[0] <= hi for lo, hi in self._in_flight.values()):
                self._settled.wait()  # an earlier write not yet applied may hold keys of this one
                self._check_writable()
            olds = self._kv.get_existing(keys, key_list, bounds)
            if prepared is not None:
                records = _records_unique(keys, up_values, olds)
            else:
                records, put_keys, put_values, gone = _changes_in_order(key_list, up_values.to_pylist(),
                                                                        olds.to_pylist())
                prepared = self._kv.prepare(put_keys, put_values, gone)
            if not records.num_rows:
                end = self._log.end_offset
                return end, end
            if records.nbytes > MAX_ENTRY_BYTES:
                raise RecordTooLargeError(
                    f"this write's changelog entry would be {records.nbytes} bytes, over {MAX_ENTRY_BYTES} "
                    f"(one gRPC message; an update holds the row twice): send fewer rows per write",
                    size=records.nbytes)
            try:
                pending = self._log.write([records])
            except BaseException as exc:
                self._fail(exc)
                raise
            (base, nxt), = pending.ranges
            self._in_flight[base] = bounds
        try:
            self._log.sync(pending)  # unlocked: the next write reads and writes meanwhile; one fsync may cover both
        except BaseException as exc:
            with self.write_lock:
                del self._in_flight[base]
                self._fail(exc)
            raise
        with self.write_lock:
            try:
                while self._kv.applied_offset != base and self._failed is None:
                    self._settled.wait()  # applied in changelog order
                if self._failed is not None:
                    raise BucketStoreError(f"bucket {self.dir} failed before changelog records {base}..{nxt} "
                                           f"were applied ({self._failed!r}); reopen it", dir=self.dir)
                try:
                    self._log.publish(pending)
                except BaseException as exc:
                    self._fail(exc)
                    raise
                try:
                    self._apply(prepared, nxt)
                except BaseException as exc:
                    self._fail(exc)
                    raise BucketStoreError(f"bucket {self.dir}: changelog records {base}..{nxt} were appended "
                                           f"but RocksDB failed to apply them ({exc!r}); reopen the bucket to "
                                           f"replay them", dir=self.dir) from exc
            finally:
                del self._in_flight[base]
                self._settled.notify_all()
            return base, nxt

    def _fail(self, exc: BaseException) -> None:
        """The store refuses writes from now on (reopen it); writes waiting their turn give up. Hold the lock."""
        if self._failed is None:
            self._failed = exc
        self._settled.notify_all()

    def _apply(self, prepared: PreparedWrite, next_offset: int) -> None:
        self._kv.commit(prepared, next_offset)

    def _check_bucket(self, keys: list[bytes], what: str) -> None:
        """InvalidRowError naming the first key that does not hash to this store's bucket."""
        if self.bucket is None or not keys or self.table.buckets == 1:
            return  # one bucket: every key is its
        n = self.table.buckets
        buckets = bucket_array(keys, n)
        wrong = np.flatnonzero(buckets != self.bucket)
        if not wrong.size:
            return
        i = int(wrong[0])
        key = self.codec.decode_keys([keys[i]]).to_pylist()[0]
        raise InvalidRowError(f"{what} row {i} (key {show(key)}) belongs to bucket {int(buckets[i])} of table "
                              f"{self.table.table_id}, not to bucket {self.bucket}; {len(wrong)} of {len(keys)} "
                              f"rows are of another bucket (bucket = crc32(encoded key) % {n})",
                              row=i, bucket=int(buckets[i]))

    def _check_row_sizes(self, keys: pa.Array, values: pa.Array) -> None:
        """RecordTooLargeError naming the first row whose encoded key + value exceeds ``max_row_bytes``."""
        if not len(keys):
            return
        sizes = np.diff(value_offsets(keys)).astype(np.int64) + np.diff(value_offsets(values))
        big = np.flatnonzero(sizes > self.max_row_bytes)
        if not big.size:
            return
        i = int(big[0])
        key = self.codec.decode_keys(keys.slice(i, 1)).to_pylist()[0]
        raise RecordTooLargeError(f"upsert row {i} (key {show(key)}) is {int(sizes[i])} bytes, over the limit of "
                                  f"{self.max_row_bytes} bytes (table.max-row-size); {big.size} of {len(keys)} "
                                  f"rows are too large", row=i, size=int(sizes[i]))

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise BucketStoreError(f"bucket {self.dir} failed earlier ({self._failed!r}); reopen it", dir=self.dir)

    def _check_open(self) -> None:
        if self._closed:
            raise BucketStoreError(f"bucket {self.dir} is closed", dir=self.dir)

    # --- reads -----------------------------------------------------------------------------

    def lookup(self, keys: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
        """``(found, rows)``: ``found[i]`` (numpy bool) tells whether key row ``i`` exists;
        ``rows`` holds the full rows of the found keys in input order (``found.sum()`` rows).

        ``keys`` holds the primary-key columns (full rows are accepted).
        Raises InvalidRowError for a bad key batch.
        """
        encoded = self.codec.encode_keys(keys)
        self._check_bucket(encoded, "lookup")
        self._check_open()
        values = pa.array(self._kv.get(encoded), pa.binary())
        found = values.is_valid().to_numpy(zero_copy_only=False)
        return found, self.codec.decode_values(pc.drop_null(values) if values.null_count else values)

    def fetch_log(self, from_offset: int, max_bytes: int) -> tuple[list[bytes], int]:
        """``(entries, end_offset)``: framed changelog entries from ``from_offset`` on (see
        :meth:`Changelog.read_raw`: the first may start before it) and the end offset
        read after them. Raises LogOffsetOutOfRangeError outside the changelog."""
        entries = self._log.read_raw(from_offset, max_bytes)
        return entries, self._log.end_offset

    def read_log(self, from_offset: int, max_bytes: int) -> list[LogEntry]:
        """Decoded changelog entries (:meth:`Changelog.read`)."""
        return self._log.read(from_offset, max_bytes)

    def log_segments(self) -> list[SegmentInfo]:
        """The changelog's segments, oldest first (for time-based retention)."""
        return self._log.segments()

    # --- snapshots -------------------------------------------------------------------------

    def snapshot(self, values_from: bytes | None = None) -> KvSnapshot:
        """A consistent view of the rows and its ``log_offset``, taken together under the write lock
        (``values_from``: see :meth:`KvStore.snapshot`)."""
        with self.write_lock:
            self._check_open()
            return self._kv.snapshot(self._kv.applied_offset, values_from)

    def key_of_value(self, value: bytes) -> bytes:
        """The key a stored value is kept under: the value holds the whole row, primary key included
        (docs/row-encoding.md); InvalidRowError if it is malformed."""
        return self.codec.encode_keys(self.codec.decode_values([value]))[0]

    def iter_rows(self, snapshot: KvSnapshot, from_key: bytes | None = None,
                  upper: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """The ``(key, value)`` pairs of ``snapshot`` with ``from_key <= key < upper`` in key
        order (:meth:`KvSnapshot.rows`); resume after key ``k`` with ``from_key=k + b"\\x00"``."""
        return snapshot.rows(from_key, upper)

    def checkpoint(self, target_dir: str) -> int:
        """Create a RocksDB checkpoint in ``target_dir``; returns its log offset.

        ``target_dir`` must not exist and must be on the same filesystem (SST
        files are hard-linked). The checkpoint holds exactly the changelog
        records below the returned offset: it is taken under the write lock,
        and its own applied offset (:func:`checkpoint_log_offset`) says the
        same. Reading it, then the changelog from the offset, gives every later
        change exactly once. A changelog that does not fsync each write is
        flushed first, so the records the checkpoint holds are on disk.
        """
        if os.path.lexists(target_dir):
            raise InvalidRequestError(f"checkpoint target {target_dir} already exists")
        self._check_open()
        self._kv.flush_rows()  # most of the memtable, outside the lock: less to flush while writes wait
        with self.write_lock:
            self._check_open()
            if not self._log.fsync:
                self._log.flush()
            self._kv.checkpoint(target_dir)
            return self._kv.applied_offset

    # --- retention -------------------------------------------------------------------------

    def truncate_log_before(self, offset: int) -> int:
        """Delete the changelog segments whose records are all below ``offset``.

        Never beyond what RocksDB holds on disk: RocksDB is flushed first and
        the offset is capped at the applied offset flushed. Returns how many
        segments were deleted.
        """
        self._check_open()
        self._kv.flush_rows()  # the bulk, while writes go on
        with self.write_lock:
            self._check_open()
            self._kv.flush()
            durable = self._kv.applied_offset
        return self._log.truncate_before(min(offset, durable))


# --- change records -------------------------------------------------------------------------

def _increasing(keys: pa.Array) -> bool:
    """Whether the keys are strictly increasing (the usual batch): then they are distinct, and the
    first and the last are the lowest and the highest."""
    n = len(keys)
    return n < 2 or pc.all(pc.less(keys.slice(0, n - 1), keys.slice(1))).as_py()


def _records_unique(keys: pa.Array, up_values: pa.Array, olds: pa.Array) -> pa.RecordBatch:
    """The change records of a write whose keys are all distinct, vectorized.

    ``keys`` = upsert keys then delete keys; ``olds`` their current values
    (null where missing).
    """
    n, n_up = len(keys), len(up_values)
    if olds.null_count == n:  # nothing exists yet: all inserts, deletes find nothing
        return pa.RecordBatch.from_arrays(
            [pa.array(np.full(n_up, _INSERT, np.int8)), keys.slice(0, n_up), up_values], schema=SCHEMA)
    exists = olds.is_valid().to_numpy(zero_copy_only=False)
    existed_up = exists[:n_up]
    rows = np.repeat(np.arange(n_up), 1 + existed_up)  # an update emits two records
    first = np.ones(len(rows), bool)
    first[1:] = rows[1:] != rows[:-1]
    update = existed_up[rows]
    up_types = np.where(update, np.where(first, _UPDATE_BEFORE, _UPDATE_AFTER), _INSERT)
    up_sources = np.where(update & first, rows, n + rows)  # index into olds ++ up_values
    deleted = np.flatnonzero(exists[n_up:]) + n_up
    types = np.concatenate([up_types, np.full(len(deleted), _DELETE)]).astype(np.int8)
    key_index = np.concatenate([rows, deleted])
    sources = np.concatenate([up_sources, deleted])
    values = pa.concat_arrays([olds, up_values]).take(pa.array(sources))
    return pa.RecordBatch.from_arrays([pa.array(types), keys.take(pa.array(key_index)), values], schema=SCHEMA)


def _changes_in_order(keys: list[bytes], up_values: list[bytes], olds: list[bytes | None]):
    """Records and KV effects (put keys, put values, deleted keys) of a write naming some key more
    than once: step by step, so each step gets the right before-image."""
    n_up = len(up_values)
    original: dict[bytes, bytes | None] = {}
    for key, old in zip(keys, olds):
        original.setdefault(key, old)
    current = dict(original)
    types: list[int] = []
    out_keys: list[bytes] = []
    out_values: list[bytes] = []
    for i, key in enumerate(keys):
        old = current[key]
        if i < n_up:
            new = up_values[i]
            if old is None:
                types.append(_INSERT)
            else:
                types += (_UPDATE_BEFORE, _UPDATE_AFTER)
                out_keys.append(key)
                out_values.append(old)
            out_keys.append(key)
            out_values.append(new)
            current[key] = new
        elif old is not None:
            types.append(_DELETE)
            out_keys.append(key)
            out_values.append(old)
            current[key] = None
    records = pa.RecordBatch.from_arrays(
        [pa.array(types, pa.int8()), pa.array(out_keys, pa.binary()), pa.array(out_values, pa.binary())],
        schema=SCHEMA)
    put_keys = [k for k, v in current.items() if v is not None]
    put_values = [current[k] for k in put_keys]
    gone = [k for k, v in current.items() if v is None and original[k] is not None]
    return records, put_keys, put_values, gone
