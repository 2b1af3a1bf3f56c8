"""A replicated bucket store's side of replication: the high watermark, a follower's log, leader epochs.

:class:`BucketReplication` is a part of :class:`tablet.bucket.BucketStore`
(see ``tablet/bucket.py`` and ``docs/bucket-store.md``, "Replication"). The
store of a replicated bucket (``replicated=True``) appends and publishes its
leader's writes without applying them to RocksDB: they wait in the pre-write
buffer (``tablet/prewrite_buffer.py``) until :meth:`~BucketReplication.advance_high_watermark`
passes them. A follower appends its leader's entries byte for byte
(:meth:`~BucketReplication.append_replicated`), applies them the same way,
and cuts its log back where it diverges from a new leader's
(:meth:`~BucketReplication.truncate_to`, the offset found with the leader
epochs: :meth:`~BucketReplication.end_offset_for` on the leader,
:meth:`~BucketReplication.truncation_for` on the follower). RocksDB never
holds a record above the high watermark, so nothing a reader saw is taken
back.

The leader-epoch cache (``tablet/epoch_file.py``) is kept in both modes: a
new epoch is assigned when its first entry is appended (or when the replica
becomes leader, at its log end), dropped by truncation, moved by retention,
and checkpointed on every change.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from common.checksum import crc32
from common.errors import FencedLeaderEpochError, InvalidRequestError, InvalidSnapshotError
from common.logentry import CorruptLogError, FrameHeader, read_header
from tablet import bucket_damage, epoch_file, snapshot_install
from tablet.bucket_files import BucketFiles
from tablet.changelog import Changelog
from tablet.kvstore import BucketStoreError, KvStore, checkpoint_log_offset
from tablet.prewrite_buffer import PrewriteBuffer, entry_changes, prepared_of
from tablet.replication.epochs import EpochCache, EpochEnd, Truncation
from tablet.writer_sequences import WriterSequences

_READ_BYTES = 4 << 20  # changelog bytes decoded per step when applying or rebuilding the buffer


def checked_header(frame: Any) -> FrameHeader:
    """The header of a framed entry whose size and CRC are right (CorruptLogError otherwise)."""
    view = memoryview(frame)
    header = read_header(view, 0, len(view))
    if len(view) != header.size + header.payload_len or not header.count:
        raise CorruptLogError(f"replicated entry at offset {header.base_offset}: {len(view)} bytes with "
                              f"{header.count} records, its header says {header.size + header.payload_len} bytes")
    if crc32(view[header.size:], crc32(view[:header.size - 4])) != header.crc:
        raise CorruptLogError(f"replicated entry at offset {header.base_offset}: CRC mismatch")
    return header


class BucketReplication:
    """Replication methods of a :class:`~tablet.bucket.BucketStore` (a part of it; see the module docstring)."""

    dir: str
    files: BucketFiles
    write_lock: threading.RLock
    _settled: threading.Condition
    _in_flight: dict
    replicated: bool
    leader_epoch: int
    writers: WriterSequences
    buffer: PrewriteBuffer
    _hw: int
    _epochs: EpochCache
    _fail: Callable[[BaseException], None]  # BucketStore's: refuse writes until the files are reopened

    # --- the high watermark ----------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """The committed end of the log: every record below it is on every in-sync replica. RocksDB holds
        the entries ending at or below it. Not replicated: the log end."""
        _start, end, applied = self.files.offsets()
        return max(self._hw, applied) if self.replicated else end

    def advance_high_watermark(self, hw: int) -> int:
        """HW := max(HW, min(``hw``, log end)); apply every entry ending at or below it to RocksDB in offset
        order (the buffer's prepared batches where it holds them, else decoded from the changelog). Never
        moves back; returns the high watermark. Not replicated: the log end, nothing done."""
        with self.files.use() as (changelog, kv), self.write_lock:
            if not self.replicated:
                return changelog.end_offset
            target = max(self._hw, kv.applied_offset, min(hw, changelog.end_offset))
            self._hw = self.files.replay_limit = target  # a reopen replays up to it
            try:
                self._apply_up_to(changelog, kv, target)
            except BaseException as exc:
                self._fail(exc)
                raise BucketStoreError(f"bucket {self.dir}: applying the changelog up to the high watermark "
                                       f"{target} failed ({exc!r}); the bucket is reopened to replay it",
                                       dir=self.dir) from exc
            return target

    def _apply_up_to(self, changelog: Changelog, kv: KvStore, target: int) -> None:
        buffer = self.buffer
        while kv.applied_offset < target:
            entry = buffer.first()
            if entry is not None and buffer.start == kv.applied_offset == entry.base:
                if entry.next > target:
                    return
                kv.commit(entry.prepared, entry.next)
                buffer.pop()
                continue
            entries = [e for e in changelog.read(kv.applied_offset, _READ_BYTES) if e.next_offset <= target]
            if not entries:
                return
            kv.apply_records([e.records for e in entries], entries[-1].next_offset)
            buffer.invalidate()  # it did not hold these: rebuilt before the next write reads through it

    def _buffer_ready(self, changelog: Changelog, kv: KvStore) -> None:
        """Rebuild the pre-write buffer from the changelog unless it holds exactly ``[applied, end)``."""
        applied, end = kv.applied_offset, changelog.end_offset
        if self.buffer.covers(applied, end):
            return
        self.buffer.reset(applied)
        offset = applied
        while offset < end:
            for entry in changelog.read(offset, _READ_BYTES):
                changes = entry_changes(entry)
                self.buffer.add(entry.base_offset, entry.next_offset, prepared_of(changes), changes)
                offset = entry.next_offset

    def _settle(self) -> None:
        """Wait until no write is between its append and its publication. Hold the lock."""
        while self._in_flight:
            self._settled.wait()

    # --- a follower's log -------------------------------------------------------------------

    def append_replicated(self, entries: list[bytes]) -> int:
        """Append the leader's framed entries (as :meth:`fetch_log` returns them) byte for byte, fsync and
        publish them (RocksDB gets them from :meth:`advance_high_watermark`); returns the new log end.

        The first must start at this log's end and each at the end of the one before (InvalidRequestError
        naming both offsets); a bad size or CRC raises CorruptLogError. Nothing is appended then. The
        idempotent writers' batches they carry are known afterwards. Only a replicated store follows.
        """
        headers = [checked_header(frame) for frame in entries]
        with self.files.use() as (changelog, _kv), self.write_lock:
            self._require_replicated("append_replicated")
            self.files.check_writable()
            self._settle()
            expected = changelog.end_offset
            for header in headers:
                if header.base_offset != expected:
                    raise InvalidRequestError(f"bucket {self.dir}: a replicated entry starts at offset "
                                              f"{header.base_offset} but this log ends at {expected}",
                                              offset=header.base_offset, end_offset=expected)
                expected += header.count
            for header in headers:
                if header.leader_epoch >= 0:
                    self._note_epoch(header.leader_epoch, header.base_offset)
            try:
                pending = changelog.write_raw(entries, headers)
                changelog.sync(pending)
                changelog.publish(pending)
            except BaseException as exc:
                self._fail(exc)
                raise
            for h in headers:
                if h.writer_id >= 0:
                    self.writers.record(h.writer_id, h.sequence, h.base_offset, h.base_offset + h.count,
                                        h.timestamp_ms or 0)
            return changelog.end_offset

    def truncate_to(self, offset: int) -> int:
        """Remove every entry whose records reach ``offset`` or beyond (one holding ``offset`` goes whole);
        returns the new log end. Durable. Refused (InvalidRequestError) if RocksDB holds any of them (below
        the applied offset: committed). Drops their buffered state and epochs; the writer sequences are
        built again from the changelog."""
        with self.files.use() as (changelog, kv), self.write_lock:
            self.files.check_writable()
            self._settle()
            if offset >= changelog.end_offset:
                return changelog.end_offset
            if offset < kv.applied_offset:
                raise InvalidRequestError(f"bucket {self.dir}: cannot truncate the changelog to offset {offset}: "
                                          f"the records below {kv.applied_offset} are committed and applied",
                                          offset=offset, applied_offset=kv.applied_offset)
            try:
                end = changelog.truncate_from(offset)
            except BaseException as exc:
                self._fail(exc)
                raise
            self._hw = min(self._hw, end)
            if self.replicated:
                self.files.replay_limit = self._hw
            self.writers.reset()
            self.buffer.invalidate()
            self._epochs.truncate_from(end)
            self._save_epochs()
            return end

    def install_snapshot(self, checkpoint_dir: str, log_offset: int,
                         writers: tuple[tuple[int, ...], ...] = ()) -> None:
        """Replace this replica's RocksDB by the snapshot checkpoint in ``checkpoint_dir`` (moved away)
        and its changelog by an empty one starting at ``log_offset``, the snapshot's; the epoch cache
        starts empty, the writers' sequences from ``writers`` (the manifest's batches). Durable and crash-safe (``tablet/snapshot_install.py``).
        InvalidSnapshotError if the checkpoint's applied offset is not ``log_offset``; BucketStoreError if
        the files are in use now (a scan's snapshot): nothing changed then. Only a replicated store."""
        self._require_replicated("install_snapshot")
        try:
            found = checkpoint_log_offset(checkpoint_dir)
        except Exception as exc:  # rocksdict raises a bare Exception
            raise InvalidSnapshotError(f"bucket {self.dir}: {checkpoint_dir} is not a RocksDB checkpoint: "
                                       f"{exc}") from exc
        if found != log_offset:
            raise InvalidSnapshotError(f"bucket {self.dir}: the checkpoint holds the records below offset "
                                       f"{found}, the snapshot says {log_offset}", log_offset=log_offset)
        with self.write_lock:
            self._settle()
            fsync = self.files.settings.fsync
            self.files.replace(lambda: snapshot_install.install(self.dir, checkpoint_dir, log_offset, fsync,
                                                                writers))
            self._hw = log_offset
            self.files.replay_limit = log_offset
            self._epochs = EpochCache()
            self.writers.reset()
            self.buffer.invalidate()
        with self.files.use():
            pass  # opened now: a bad install shows here, not at the next fetch

    def discard_files(self, why: str) -> None:
        """Move this replica's files aside (``tablet/bucket_damage.py``) and start empty at offset 0, to be
        rebuilt (``why`` is logged). BucketStoreError if the files are in use now: nothing changed then."""
        self._require_replicated("discard_files")
        with self.write_lock:
            self._settle()
            self.files.replace(lambda: bucket_damage.move_aside(self.dir, why))
            self._hw = 0
            self.files.replay_limit = 0
            self._epochs = EpochCache()
            self.writers.reset()
            self.writers.seed = ()
            self.buffer.invalidate()

    def _require_replicated(self, what: str) -> None:
        if not self.replicated:
            raise InvalidRequestError(f"bucket {self.dir} is not replicated: {what} is for replicas of a "
                                      f"replicated bucket")

    # --- roles and leader epochs ----------------------------------------------------------------

    def become_leader(self, epoch: int) -> None:
        """Lead under ``epoch``: stamp it on the writes from now on, assign it at the log end in the epoch
        cache, and rebuild the pre-write buffer from the entries between the applied offset and the log
        end. FencedLeaderEpochError if the log already holds a newer epoch."""
        with self.files.use() as (changelog, kv), self.write_lock:
            self._settle()
            self._note_epoch(epoch, changelog.end_offset)
            self.leader_epoch = epoch
            self.following = False
            if self.replicated:
                self._buffer_ready(changelog, kv)

    def become_follower(self, epoch: int) -> None:
        """Follow the leader of ``epoch``: the pre-write buffer is dropped (its entries stay in the log, to
        be applied by :meth:`advance_high_watermark` or cut by :meth:`truncate_to`)."""
        with self.write_lock:
            self._settle()
            self.leader_epoch = epoch
            self.following = True
            self.buffer.invalidate()

    @property
    def last_epoch(self) -> int:
        """The leader epoch of the log's last entry (-1: no entry, or written without an epoch)."""
        with self.files.use() as (changelog, _kv), self.write_lock:
            end = changelog.end_offset
            epoch = self._epochs.epoch_at(end - 1) if end > 0 else None
            return -1 if epoch is None else epoch

    @property
    def epochs(self) -> EpochCache:
        """A copy of the leader-epoch cache."""
        with self.files.use(), self.write_lock:
            return EpochCache((e.epoch, e.start_offset) for e in self._epochs.entries)

    def end_offset_for(self, epoch: int) -> EpochEnd:
        """The leader's answer to a follower whose latest epoch is ``epoch`` (:meth:`EpochCache.end_offset_for`)."""
        with self.files.use() as (changelog, _kv), self.write_lock:
            return self._epochs.end_offset_for(epoch, changelog.end_offset)

    def truncation_for(self, answer: EpochEnd) -> Truncation:
        """The follower's step on its leader's ``answer`` (:meth:`EpochCache.truncation_for`); the caller
        then calls :meth:`truncate_to` with its offset, and asks again unless it is ``done``."""
        with self.files.use() as (changelog, _kv), self.write_lock:
            return self._epochs.truncation_for(answer, changelog.end_offset)

    def _stale_epoch(self, epoch: int) -> bool:
        """Whether the log holds entries of an epoch newer than ``epoch``. Hold the lock."""
        latest = self._epochs.latest_epoch
        if latest is None or epoch >= latest:
            return False
        older = EpochCache((e.epoch, e.start_offset) for e in self._epochs.entries)
        older.truncate_from(self.files.changelog.end_offset)  # epochs assigned at the end hold no entry
        return older.latest_epoch is not None and epoch < older.latest_epoch

    def _note_epoch(self, epoch: int, start: int) -> None:
        """An entry of ``epoch`` is appended at ``start``, the log end (or the replica leads from there):
        assign the epoch there unless it is the latest; epochs assigned at or after ``start`` hold no entry
        and are superseded. FencedLeaderEpochError if an older epoch than the log's. Hold the lock."""
        cache = self._epochs
        if epoch == cache.latest_epoch:
            return
        if self._stale_epoch(epoch):
            raise FencedLeaderEpochError(f"bucket {self.dir}: leader epoch {epoch} is older than the log's "
                                         f"latest, {cache.latest_epoch}", leader_epoch=cache.latest_epoch)
        cache.truncate_from(start)
        if epoch != cache.latest_epoch:
            cache.assign(epoch, start)
        self._save_epochs()

    def _save_epochs(self) -> None:
        epoch_file.save(self.dir, self._epochs, self.files.settings.fsync)

    def _retained(self, start: int) -> None:
        """Retention moved the log's start to ``start``. Hold the lock."""
        self._epochs.truncate_before(start)
        self._save_epochs()
