"""One bucket's storage: a RocksDB of the current rows and the changelog of every change.

``{dir}/kv`` is the bucket's RocksDB (:class:`~kvlease.tablet.store.kvstore.KvStore`: rows,
and the *applied offset*, the first changelog record it does not contain);
``{dir}/log`` is its :class:`~kvlease.tablet.log.changelog.Changelog`. See
``docs/bucket-store.md``.

A write: validate and encode the batch (and, when its keys are distinct,
build its RocksDB WriteBatch) unlocked; under the bucket's write lock read the
current values of the touched keys that may exist (``tablet/store/key_ranges.py``)
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
decides its value), so opening the files (``tablet/bucket/files.py``) always
ends with KV == fold(changelog[0, end)) and applied offset == end.

**Replicated** (``replicated=True``, docs/bucket-store.md, "Replication"):
a write is appended, synced and published but not applied; it waits in the
pre-write buffer (``tablet/store/prewrite_buffer.py``; later writes read their
before-images through it) until the high watermark passes it
(``tablet/bucket/replication.py``: the high watermark, a follower's appends
and truncation, leader epochs). RocksDB then holds the fold of ``[0, a)``
with ``a <= HW``, and an open replays only up to the high watermark known
(a new store object: none beyond ``a``). Reads (``tablet/bucket/reads.py``)
see committed data only. Not replicated, the high watermark is the log end.

A store's files are opened on first use and, under a server's budget of open
buckets, parked while idle and reopened on demand; a store whose local write
failed (a full disk) reopens them by itself after a backoff
(``tablet/bucket/files.py``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from kvlease.common import config as cfg
from kvlease.common.codec import RowCodec
from kvlease.common.limits import MAX_ROW_SIZE_BOUND
from kvlease.common.logentry import LogEntry
from kvlease.common.parts import documented_by
from kvlease.common.tables import TableInfo
from kvlease.tablet.bucket.files import Backoff, BucketFiles, FileSettings
from kvlease.tablet.bucket.open_buckets import OpenBuckets
from kvlease.tablet.bucket.prefix_reads import PrefixRows, prefix_rows
from kvlease.tablet.bucket.reads import BucketReads
from kvlease.tablet.bucket.replication import BucketReplication
from kvlease.tablet.bucket.state import BucketShared, BucketSpec, WriteRole
from kvlease.tablet.bucket.writes import BucketWrites
from kvlease.tablet.log.changelog import Changelog, SegmentInfo
from kvlease.tablet.log.epoch_file import EpochFile
from kvlease.tablet.log.epochs import EpochCache, EpochEnd, Truncation
from kvlease.tablet.log.writer_sequences import DEFAULT_WRITER_EXPIRATION_MS, WriterSequences, load_seed
from kvlease.tablet.store.kvstore import (APPLIED_KEY, META_CF, BucketStoreError, KvSnapshot, KvStore,
                                          checkpoint_log_offset)
from kvlease.tablet.store.prewrite_buffer import PrewriteBuffer

__all__ = ["APPLIED_KEY", "META_CF", "BucketStore", "BucketStoreError", "KvSnapshot", "checkpoint_log_offset"]


class BucketStore:
    """The KV store and changelog of one bucket in ``dir``; see the module docstring.

    Thread-safe: writes, checkpoints and snapshots serialize on
    :attr:`write_lock` (re-entrant, so a caller holding it may call them);
    lookups and log reads run concurrently with them. Create it with
    :meth:`open`. Its files (:attr:`files`, ``tablet/bucket/files.py``) are
    open only while needed when it shares an
    :class:`~kvlease.tablet.bucket.open_buckets.OpenBuckets` budget with other buckets: every
    method opens them again if they were parked, and a failed store reopens
    them by itself after a backoff.

    It owns three parts and calls them from methods of the same names: :attr:`writes`
    (:class:`~kvlease.tablet.bucket.writes.BucketWrites`), :attr:`reads` (:class:`~kvlease.tablet.bucket.reads.BucketReads`)
    and :attr:`replication` (:class:`~kvlease.tablet.bucket.replication.BucketReplication`). Each holds the one
    :class:`~kvlease.tablet.bucket.state.BucketShared` of what they share: which bucket it is, the files, the write
    lock, the role (:attr:`role`), the writers' sequences, the pre-write buffer and the leader-epoch cache
    (:attr:`epoch_file`).
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
        self.files = files
        #: Serializes writes; hold it to take a snapshot and read ``log_end_offset`` together.
        self.write_lock = threading.RLock()
        #: The leader epoch its writes are stamped with and whether it follows (:attr:`leader_epoch`).
        self.role = WriteRole()
        #: Idempotent writers' batches in the changelog (``writer.id.expiration``: from_config sets it).
        self.writers = WriterSequences(DEFAULT_WRITER_EXPIRATION_MS, files.settings.now_ms)
        #: Replicated: the published entries above the applied offset, as this leader wrote them.
        self.buffer = PrewriteBuffer()
        #: The leader-epoch cache and its checkpoint, loaded when the files open.
        self.epoch_file = EpochFile(dir, files.settings.fsync, lambda: files.changelog.end_offset)
        spec = BucketSpec(dir, bucket, RowCodec(table), max_row_bytes, replicated)
        self._shared = shared = BucketShared(spec, files, self.write_lock, self.role, self.writers, self.buffer,
                                             self.epoch_file)
        self.writes = BucketWrites(shared)
        self.replication = BucketReplication(shared, self.writes.settle, self.writes.fail)
        self.reads = BucketReads(shared, lambda: self.replication.high_watermark)
        if replicated:
            files.replay_limit = 0  # a new store replays nothing beyond what RocksDB has applied
        files.on_open = self._opened

    def take_table(self, table: TableInfo) -> None:
        """Write and read with ``table``'s later schema from now on (docs/schemas.md, "Schema evolution"): rows
        written from here carry its schema id; rows of earlier schemas are read through it."""
        codec = RowCodec(table)
        with self.write_lock:
            self.table = table
            self._shared.spec.codec = codec

    @property
    def codec(self) -> RowCodec:
        """The codec its writes and reads use (the table's latest schema it holds)."""
        return self._shared.spec.codec

    def _opened(self, changelog: Changelog, kv: KvStore) -> None:
        """The files were (re)opened (``BucketFiles.on_open``): no operation runs on them yet."""
        self.epoch_file.opened(changelog)
        self.writers.seed = load_seed(self.dir)
        self.replication.opened(kv.applied_offset)
        self.buffer.invalidate()

    @property
    def leader_epoch(self) -> int:
        """The epoch of this bucket's leadership that its writes are appended under (stamped on each
        changelog entry; -1: not known, e.g. a store opened outside a tablet server)."""
        return self.role.leader_epoch

    @leader_epoch.setter
    def leader_epoch(self, epoch: int) -> None:
        self.role.leader_epoch = epoch

    @property
    def following(self) -> bool:
        """Replicated: this replica follows (:meth:`become_follower`); its writes are refused."""
        return self.role.following

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
        (``tablet/bucket/files.py``), ``on_failure()`` is told of each failure.
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
            self.writes.settle()  # writes already in the changelog finish first
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

    # --- writes (tablet/bucket/writes.py) ---------------------------------------------------------

    @documented_by(BucketWrites.write)
    def write(self, upserts: pa.RecordBatch | None = None, deletes: pa.RecordBatch | None = None, *,
              writer: tuple[int, int] | None = None, retracts: pa.RecordBatch | None = None,
              partial: bool = False) -> tuple[int, int]:
        return self.writes.write(upserts, deletes, writer=writer, retracts=retracts, partial=partial)

    # --- reads (tablet/bucket/reads.py) -----------------------------------------------------------

    @documented_by(BucketReads.list_offsets)
    def list_offsets(self) -> tuple[int, int]:
        return self.reads.list_offsets()

    @documented_by(BucketReads.end_epoch)
    def end_epoch(self) -> tuple[int, int, int | None]:
        return self.reads.end_epoch()

    @documented_by(BucketReads.epochs_at)
    def epochs_at(self, offsets: Sequence[int]) -> list[int | None]:
        return self.reads.epochs_at(offsets)

    @documented_by(BucketReads.offset_for_timestamp)
    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        return self.reads.offset_for_timestamp(timestamp_ms)

    @documented_by(BucketReads.lookup)
    def lookup(self, keys: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
        return self.reads.lookup(keys)

    @documented_by(BucketReads.lookup_values)
    def lookup_values(self, encoded: list[bytes]) -> tuple[np.ndarray | list[bool], pa.Array | list[bytes], int]:
        return self.reads.lookup_values(encoded)

    def prefix_lookup(self, prefixes: pa.RecordBatch, start_after: bytes = b"", max_bytes: int = 0) -> PrefixRows:
        """Every row whose key starts with one of ``prefixes`` (bucket-key columns): see
        :func:`kvlease.tablet.bucket.prefix_reads.prefix_rows`."""
        return prefix_rows(self._shared, prefixes, start_after, max_bytes, self.reads.check_current)

    @documented_by(BucketReads.fetch_log)
    def fetch_log(self, from_offset: int, max_bytes: int, committed: bool = True,
                  last_fetched_epoch: int | None = None) -> tuple[list[bytes], int]:
        return self.reads.fetch_log(from_offset, max_bytes, committed, last_fetched_epoch)

    @documented_by(BucketReads.read_log)
    def read_log(self, from_offset: int, max_bytes: int) -> list[LogEntry]:
        return self.reads.read_log(from_offset, max_bytes)

    @documented_by(BucketReads.log_segments)
    def log_segments(self) -> list[SegmentInfo]:
        return self.reads.log_segments()

    @documented_by(BucketReads.snapshot)
    def snapshot(self, values_from: bytes | None = None) -> KvSnapshot:
        return self.reads.snapshot(values_from)

    @documented_by(BucketReads.key_of_value)
    def key_of_value(self, value: bytes) -> bytes:
        return self.reads.key_of_value(value)

    @documented_by(BucketReads.iter_rows)
    def iter_rows(self, snapshot: KvSnapshot, from_key: bytes | None = None,
                  upper: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        return self.reads.iter_rows(snapshot, from_key, upper)

    @documented_by(BucketReads.checkpoint)
    def checkpoint(self, target_dir: str) -> int:
        return self.reads.checkpoint(target_dir)

    @documented_by(BucketReads.leader_checkpoint)
    def leader_checkpoint(self, target_dir: str) -> tuple[int, int]:
        return self.reads.leader_checkpoint(target_dir)

    @documented_by(BucketReads.truncate_log_before)
    def truncate_log_before(self, offset: int) -> int:
        return self.reads.truncate_log_before(offset)

    # --- replication (tablet/bucket/replication.py) -----------------------------------------------

    @property
    @documented_by(BucketReplication.high_watermark.fget)
    def high_watermark(self) -> int:
        return self.replication.high_watermark

    @documented_by(BucketReplication.advance_high_watermark)
    def advance_high_watermark(self, hw: int) -> int:
        return self.replication.advance_high_watermark(hw)

    @documented_by(BucketReplication.append_replicated)
    def append_replicated(self, entries: list[bytes]) -> int:
        return self.replication.append_replicated(entries)

    @documented_by(BucketReplication.truncate_to)
    def truncate_to(self, offset: int) -> int:
        return self.replication.truncate_to(offset)

    @documented_by(BucketReplication.install_snapshot)
    def install_snapshot(self, checkpoint_dir: str, log_offset: int,
                         writers: tuple[tuple[int, ...], ...] = (), synced: bool = False) -> None:
        self.replication.install_snapshot(checkpoint_dir, log_offset, writers, synced)

    @documented_by(BucketReplication.rebase_kv)
    def rebase_kv(self, checkpoint_dir: str, log_offset: int) -> None:
        self.replication.rebase_kv(checkpoint_dir, log_offset)

    @documented_by(BucketReplication.discard_files)
    def discard_files(self, why: str) -> None:
        self.replication.discard_files(why)

    @documented_by(BucketReplication.become_leader)
    def become_leader(self, epoch: int) -> None:
        self.replication.become_leader(epoch)

    @documented_by(BucketReplication.become_follower)
    def become_follower(self, epoch: int) -> None:
        self.replication.become_follower(epoch)

    @property
    @documented_by(BucketReplication.last_epoch.fget)
    def last_epoch(self) -> int:
        return self.replication.last_epoch

    @property
    @documented_by(BucketReplication.epochs.fget)
    def epochs(self) -> EpochCache:
        return self.replication.epochs

    @documented_by(BucketReplication.end_offset_for)
    def end_offset_for(self, epoch: int) -> EpochEnd:
        return self.replication.end_offset_for(epoch)

    @documented_by(BucketReplication.truncation_for)
    def truncation_for(self, answer: EpochEnd) -> Truncation:
        return self.replication.truncation_for(answer)
