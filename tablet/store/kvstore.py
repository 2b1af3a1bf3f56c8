"""The RocksDB half of a bucket: current rows, the applied changelog offset, snapshots.

A bucket's RocksDB (rocksdict, raw mode) holds each live row as ``key ->
value`` (the bytes of :mod:`kvlease.common.codec`) in its ``default`` column family,
and in the ``kvlease-meta`` column family :data:`APPLIED_KEY` -> the offset of
the first changelog record it does not contain (u64 big-endian). Every
:meth:`KvStore.write` sets both in one WriteBatch. A checkpoint's ``default``
column family is therefore exactly the table's rows, nothing to filter.

Writes skip RocksDB's WAL: the changelog is the log, so RocksDB persists only
by flushing memtables. The persisted rows must never be behind the persisted
applied offset (they may be ahead: replay is idempotent, see
``tablet/bucket/store.py``): automatic flushes are atomic across both column
families (``atomic_flush``), a checkpoint flushes both atomically, and a
manual flush covers one column family, so :meth:`KvStore.flush` does rows
first, then the offset, with writes held off.
"""

from __future__ import annotations

import collections
import logging
import os
import weakref
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
from rocksdict import (AccessType, BlockBasedOptions, Checkpoint, DBCompressionType, Options, Rdict, WriteBatch,
                       WriteOptions)

from kvlease.common.errors import KvLeaseError
from kvlease.common.kvsnapshot import scan_read_options
from kvlease.tablet.store import record_apply
from kvlease.tablet.store.key_ranges import KeyRanges
from kvlease.tablet.store.memtable_filter import MemtableFilterPolicy

log = logging.getLogger(__name__)

META_CF = "kvlease-meta"
APPLIED_KEY = b"applied_offset"
#: Below this much free space a RocksDB write fails rather than wait for a write stall (see KvStore._commit).
LOW_SPACE_BYTES = 256 << 20
_CHUNK_ROWS = 1024  # rows read from an iterator per step of KvSnapshot.rows
#: RocksDB's own limit of files it keeps open per bucket (the lowest it accepts: it reserves 10 for its
#: own files, so at most 10 SSTs stay open, in one table-cache shard so the limit is exact).
MAX_OPEN_FILES = 20
#: The most file descriptors one open bucket holds: RocksDB's LOCK, LOG, WAL, MANIFEST and directory
#: handles (6), up to 10 SSTs, the changelog's lock and active segment (2), and 2 for reads in flight.
FDS_PER_OPEN_BUCKET = 20
_MEMTABLE_FILTER = {True: {"memtable_prefix_bloom_size_ratio": "0.1", "memtable_whole_key_filtering": "true"},
                    False: {"memtable_prefix_bloom_size_ratio": "0", "memtable_whole_key_filtering": "false"}}


class BucketStoreError(KvLeaseError):
    """The store cannot serve: closed, failed on a local write (reopen it), or its files disagree."""


class BucketInUseError(BucketStoreError):
    """The bucket's files cannot be replaced now: an operation or a scan's snapshot uses them (it passes:
    try again in a moment). Nothing changed."""


class PreparedWrite(NamedTuple):
    """Puts and deletes ready to commit (:meth:`KvStore.prepare`)."""

    batch: WriteBatch
    key_range: tuple[bytes, bytes] | None  # the lowest and highest key put (None: no put)


class KvSnapshot:
    """A consistent view of a bucket's rows and the changelog offset it corresponds to.

    ``log_offset`` is the first changelog record the view does not contain
    (docs/architecture.md, "Offsets"). Read it with :meth:`rows` (or
    ``BucketStore.iter_rows``), one reader at a time: a new ``rows`` call
    re-positions it and ends the previous one. :meth:`close` releases it
    (RocksDB keeps the files and memtables it sees until then); closing the
    store closes every open snapshot.

    It holds a RocksDB iterator created under the write lock: a RocksDB
    iterator reads the state as of its creation for its whole life, also after
    seeks. (rocksdict 0.3.29's ``Snapshot.items()`` does not apply its snapshot
    to the iterator and reads the latest state; only its point reads are
    consistent, so it is not used here.)
    """

    def __init__(self, iterator, log_offset: int, values=None) -> None:
        self._iter = iterator
        self._values = values
        self.log_offset = log_offset
        self._generation = 0

    @property
    def closed(self) -> bool:
        return self._iter is None

    def close(self) -> None:
        self._iter = self._values = None  # the last references: RocksDB releases the iterators

    def __enter__(self) -> "KvSnapshot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self, from_key: bytes | None = None, upper: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` with ``from_key <= key < upper`` in key order (None: unbounded).

        To resume after a key ``k``, pass ``from_key=k + b"\\x00"`` (the next
        possible key). Raises BucketStoreError once the snapshot is closed or
        a newer ``rows`` call re-positioned it.
        """
        self._generation += 1
        generation = self._generation
        it = self.seekable()
        it.seek(from_key) if from_key is not None else it.seek_to_first()
        del it  # hold no iterator reference while suspended: close() must be able to free it
        while True:
            if generation != self._generation:
                raise BucketStoreError("snapshot was re-positioned by a newer iter_rows call")
            chunk = _next_rows(self.seekable(), upper, _CHUNK_ROWS)
            yield from chunk
            if len(chunk) < _CHUNK_ROWS:
                return

    def seekable(self):
        """The snapshot's own RocksDB iterator, for a reader that keeps its place across calls.

        It has ``seek``/``seek_to_first``/``valid``/``key``/``value``/``next``
        and reads the snapshot's rows from wherever it was left: one reader at
        a time (a :meth:`rows` call re-positions it). Hold no reference to it
        past a read, so :meth:`close` frees it. Raises BucketStoreError once
        the snapshot is closed.
        """
        if self._iter is None:
            raise BucketStoreError("snapshot is closed")
        return self._iter

    def values(self) -> Iterator[bytes]:
        """The forward-only values iterator taken with this snapshot (``KvStore.snapshot(values_from=)``),
        at the row after the last one it gave (:class:`kvlease.tablet.scan.batch.ValueReader` reads it)."""
        if self._iter is None:
            raise BucketStoreError("snapshot is closed")
        if self._values is None:
            raise BucketStoreError("snapshot was taken without a values iterator")
        return self._values


def _next_rows(it, upper: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    valid, key, value, step, append = it.valid, it.key, it.value, it.next, out.append
    while valid() and len(out) < limit:
        k = key()
        if upper is not None and k >= upper:
            break
        append((k, value()))
        step()
    return out


class KvStore:
    """The RocksDB of one bucket at ``path`` (created if missing); see the module docstring.

    Not locked itself: the bucket store calls :meth:`write`, :meth:`get_existing`,
    :meth:`flush`, :meth:`snapshot` and :meth:`checkpoint` under its write lock;
    :meth:`get` and :meth:`flush_rows` may run concurrently with them.

    It keeps :class:`~kvlease.tablet.store.key_ranges.KeyRanges` covering every row key it
    holds (from its first and last key at open, then every key written), so
    :meth:`get_existing` looks up only keys that may exist, and a
    :class:`~kvlease.tablet.store.memtable_filter.MemtableFilterPolicy` that gives new
    memtables a Bloom filter only while writes do look keys up. ``key_width``:
    the length of every key when the table's primary key is fixed-width.
    """

    def __init__(self, path: str, *, memtable_bytes: int | None = None, key_width: int | None = None) -> None:
        self.path = path
        try:
            self._db = Rdict(path, _options(memtable_bytes), column_families={META_CF: Options(raw_mode=True)})
        except Exception as exc:  # rocksdict raises a bare Exception
            raise BucketStoreError(f"cannot open RocksDB {path}: {exc}", path=path) from exc
        self._meta_handle = self._meta = None
        try:
            write_options = WriteOptions()
            write_options.disable_wal = True  # the changelog is the write-ahead log
            self._db.set_write_options(write_options)
            #: Near a full disk a write fails instead of waiting for a stall to end: a flush that cannot
            #: write its SST stalls writes for as long as RocksDB retries it (for ever on a full disk).
            self._fail_fast = WriteOptions()
            self._fail_fast.disable_wal = True
            self._fail_fast.no_slowdown = True
            self._meta_handle = self._db.get_column_family_handle(META_CF)
            self._meta = self._db.get_column_family(META_CF)
            raw = self._meta.get(APPLIED_KEY)
        except BaseException:
            self._meta_handle = self._meta = None
            self._db.close()
            raise
        #: The first changelog record not in RocksDB (as of the last write, persisted or not).
        self.applied_offset = int.from_bytes(raw, "big") if raw is not None else 0
        self._ranges = KeyRanges(key_width)
        self._filter = MemtableFilterPolicy()
        first_last = self._first_last_keys()
        if first_last is not None:
            self._ranges.add(*first_last)
        self._snapshots: weakref.WeakSet[KvSnapshot] = weakref.WeakSet()
        self._closed = False

    def _first_last_keys(self) -> tuple[bytes, bytes] | None:
        it = self._db.iter()
        it.seek_to_first()
        if not it.valid():
            return None
        first = it.key()
        it.seek_to_last()
        return first, it.key()

    def get(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (None where missing), in one multi-get."""
        return self._db.get(keys) if keys else []

    def get_existing(self, keys: pa.Array, key_list: list[bytes],
                     bounds: tuple[bytes, bytes] | None = None) -> pa.Array:
        """The values of ``keys`` (a binary array; ``key_list``: the same keys as bytes; ``bounds``:
        their lowest and highest if known) as a binary array, null where missing. Only keys inside
        the key ranges are looked up (one multi-get)."""
        maybe = self._ranges.maybe_stored(keys, bounds)
        if maybe is None:
            self._observe_lookups(len(key_list), 0)
            return pa.nulls(len(key_list), pa.binary())
        if maybe.all():
            self._observe_lookups(len(key_list), len(key_list))
            return pa.array(self._db.get(key_list), pa.binary())
        where = np.flatnonzero(maybe)
        self._observe_lookups(len(key_list), len(where))
        found = pa.array(self._db.get([key_list[i] for i in where.tolist()]), pa.binary())
        position = np.cumsum(maybe) - 1  # row i of the answer is found[position[i]] where maybe[i]
        return found.take(pa.array(position, mask=~maybe))

    @property
    def memtable_filter(self) -> bool:
        """Whether memtables created from now on have a Bloom filter."""
        return self._filter.enabled

    def _observe_lookups(self, rows: int, looked_up: int) -> None:
        wanted = self._filter.observe(rows, looked_up)
        if wanted is None:
            return
        try:
            self._db.set_options(_MEMTABLE_FILTER[wanted])
            if wanted:  # lookups are slow until then: start a new memtable now (the flush runs in the background)
                self._db.flush(False)
        except Exception as exc:  # rocksdict raises a bare Exception; only speed depends on it
            log.warning("%s: cannot turn the memtable Bloom filter %s: %s", self.path, "on" if wanted else "off", exc)
            return
        self._filter.enabled = wanted
        log.info("%s: memtable Bloom filter %s for new memtables", self.path, "on" if wanted else "off")

    def write(self, put_keys: list[bytes], put_values: list[bytes], delete_keys: list[bytes],
              next_offset: int) -> None:
        """Put and delete rows and set the applied offset to ``next_offset``, atomically."""
        self.commit(self.prepare(put_keys, put_values, delete_keys), next_offset)

    @staticmethod
    def prepare(put_keys: list[bytes], put_values: list[bytes], delete_keys: list[bytes],
                put_range: tuple[bytes, bytes] | None = None) -> PreparedWrite:
        """The puts and deletes as one WriteBatch, not applied: any thread may build it, also while
        another write commits (it reads nothing of the store). Apply it with :meth:`commit`.
        ``put_range``: the lowest and highest of ``put_keys`` if the caller knows them."""
        batch = WriteBatch(raw_mode=True)
        collections.deque(map(batch.put, put_keys, put_values), maxlen=0)  # the loop runs in C
        if delete_keys:
            collections.deque(map(batch.delete, delete_keys), maxlen=0)
        if put_keys and put_range is None:
            put_range = min(put_keys), max(put_keys)
        return PreparedWrite(batch, put_range if put_keys else None)

    def commit(self, prepared: PreparedWrite, next_offset: int) -> None:
        """Apply a prepared write and set the applied offset to ``next_offset``, atomically (once)."""
        if prepared.key_range is not None:
            self._ranges.add(*prepared.key_range)
        self._commit(prepared.batch, next_offset)

    def apply_records(self, records: list[pa.RecordBatch], next_offset: int) -> None:
        """Apply changelog records (+I/+U put, -D delete, -U nothing) and set the applied offset, in one
        WriteBatch (``tablet/store/record_apply.py``: a large step in key order)."""
        for entry in records:
            self._ranges.add_keys(entry.column(1))
        try:
            batch = record_apply.write_batch(records)
        except record_apply.RecordWithoutValue as exc:
            raise BucketStoreError(f"{self.path}: {exc}", path=self.path) from None
        self._commit(batch, next_offset)

    def _commit(self, batch: WriteBatch, next_offset: int) -> None:
        batch.put(APPLIED_KEY, next_offset.to_bytes(8, "big"), self._meta_handle)
        if self._low_space():
            self._db.write(batch, write_opt=self._fail_fast)  # a stall now would never end: fail instead
        else:
            self._db.write(batch)
        self.applied_offset = next_offset

    def _low_space(self) -> bool:
        """Whether the disk holding RocksDB has less than :data:`LOW_SPACE_BYTES` free."""
        try:
            stat = os.statvfs(self.path)
        except OSError:
            return True
        return stat.f_bavail * stat.f_frsize < LOW_SPACE_BYTES

    def flush_rows(self) -> None:
        """Flush the rows' memtable (any time: persisted rows may run ahead of the offset)."""
        self._db.flush()

    def flush(self) -> None:
        """Persist everything: rows, then the applied offset. No write may run meanwhile."""
        self._db.flush()
        self._meta.flush()

    def snapshot(self, log_offset: int, values_from: bytes | None = None) -> KvSnapshot:
        """A consistent view of the rows as of now, labelled ``log_offset``; with ``values_from``
        also a forward-only values iterator from that key on (:meth:`KvSnapshot.values`): both
        iterators are made here, with no write between them, so they read the same state."""
        read = scan_read_options()
        values = None if values_from is None else self._db.values(from_key=values_from, read_opt=read)
        snapshot = KvSnapshot(self._db.iter(read), log_offset, values)
        self._snapshots.add(snapshot)
        return snapshot

    def open_snapshots(self) -> int:
        """How many snapshots taken here are still open (each pins this store open)."""
        return sum(not snapshot.closed for snapshot in list(self._snapshots))

    def checkpoint(self, target_dir: str) -> None:
        """A RocksDB checkpoint (both column families flushed atomically, SST files hard-linked)."""
        try:
            Checkpoint(self._db).create_checkpoint(target_dir)
        except Exception as exc:
            raise BucketStoreError(f"{self.path}: checkpoint to {target_dir} failed: {exc}",
                                   path=self.path) from exc

    def close(self) -> None:
        """Close the open snapshots, flush (:meth:`flush`), close RocksDB (releasing its lock)."""
        if self._closed:
            return
        self._closed = True
        for snapshot in list(self._snapshots):
            snapshot.close()
        try:
            self.flush()
        finally:
            self._meta_handle = self._meta = None  # they keep RocksDB open too
            self._db.close()


def checkpoint_log_offset(checkpoint_dir: str) -> int:
    """The applied offset stored in a checkpoint made by ``BucketStore.checkpoint``."""
    db = Rdict(checkpoint_dir, Options(raw_mode=True), access_type=AccessType.read_only(),
               column_families={META_CF: Options(raw_mode=True)})
    try:
        raw = db.get_column_family(META_CF).get(APPLIED_KEY)
    finally:
        db.close()
    return int.from_bytes(raw, "big") if raw is not None else 0


def _options(memtable_bytes: int | None) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_atomic_flush(True)  # see the module docstring
    # Few open files per bucket: a tablet server holds thousands of buckets (docs/bucket-store.md).
    options.set_max_open_files(MAX_OPEN_FILES)
    options.set_table_cache_num_shard_bits(0)
    # Bloom filters in SST files: the multi-get of a write mostly looks for keys that do not exist
    # yet (inserts), and a filter answers those without a search. Memtables get one only while
    # writes look keys up (KvStore._observe_lookups): it starts off, see tablet/store/memtable_filter.py.
    table_options = BlockBasedOptions()
    table_options.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table_options)
    # Level 0 (memtable flushes, compacted into level 1 soon after) uncompressed, the other levels LZ4:
    # a write's flush was ~10% of a write-heavy tablet server's CPU in Snappy, mostly for data that
    # lives in level 0 for seconds (RocksDB's tuning guide does the same for write-heavy loads).
    options.set_compression_per_level([DBCompressionType.none()] + [DBCompressionType.lz4()] * 6)
    if memtable_bytes is not None:
        options.set_write_buffer_size(memtable_bytes)
    return options
