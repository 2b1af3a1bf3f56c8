"""A replicated bucket store's side of replication: the high watermark, a follower's log, leader epochs.

:class:`BucketReplication` is a part :class:`kvlease.tablet.bucket.store.BucketStore` owns
(see ``tablet/bucket/store.py`` and ``docs/bucket-store.md``, "Replication"); the
store's methods of the same names call it. The
store of a replicated bucket (``replicated=True``) appends and publishes its
leader's writes without applying them to RocksDB: they wait in the pre-write
buffer (``tablet/store/prewrite_buffer.py``) until :meth:`~BucketReplication.advance_high_watermark`
passes them. A follower appends its leader's entries byte for byte
(:meth:`~BucketReplication.append_replicated`), applies them the same way,
and cuts its log back where it diverges from a new leader's
(:meth:`~BucketReplication.truncate_to`, the offset found with the leader
epochs: :meth:`~BucketReplication.end_offset_for` on the leader,
:meth:`~BucketReplication.truncation_for` on the follower). RocksDB never
holds a record above the high watermark, so nothing a reader saw is taken
back.

The leader-epoch cache (``tablet/log/epoch_file.py``: :class:`~kvlease.tablet.log.epoch_file.EpochFile`,
which the store shares with its parts) is kept in both modes: a
new epoch is assigned when its first entry is appended (or when the replica
becomes leader, at its log end), dropped by truncation, moved by retention,
and checkpointed on every change.
"""

from __future__ import annotations


import threading
from typing import Any, Callable

from kvlease.common.checksum import crc32
from kvlease.common.errors import InvalidRequestError, InvalidSnapshotError
from kvlease.common.logentry import CorruptLogError, FrameHeader, read_header
from kvlease.tablet.bucket import damage as bucket_damage
from kvlease.tablet.bucket.state import BucketShared
from kvlease.tablet.log.changelog import Changelog
from kvlease.tablet.log.epoch_file import EpochFile
from kvlease.tablet.log.epochs import EpochCache, EpochEnd, Truncation
from kvlease.tablet.store import kv_rebase, snapshot_install
from kvlease.tablet.store.kvstore import BucketStoreError, KvStore, checkpoint_log_offset
from kvlease.tablet.store.prewrite_buffer import READ_BYTES


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
    """Replication of a :class:`~kvlease.tablet.bucket.store.BucketStore` (a part it owns; see the module docstring): it
    keeps the high watermark known.

    ``dir``: the bucket's (named in errors; its files are replaced there); ``replicated``: see
    :attr:`replicated`; ``files``, ``write_lock``, ``role``, ``writers``, ``buffer`` (the pre-write buffer)
    and ``epoch_file`` (the leader-epoch cache): the store's, shared with its other parts; ``settle()``
    waits (under the lock) until no write is between its append and its publication, ``fail(exc)`` makes
    the store refuse writes until its files are reopened (both the writes part's)."""

    def __init__(self, bucket: BucketShared, settle: Callable[[], None],
                 fail: Callable[[BaseException], None]) -> None:
        self.bucket = bucket
        self._settle = settle
        self._fail = fail
        self._hw = 0  # replicated: the high watermark known (at least the applied offset once open)

    def opened(self, applied: int) -> None:
        """The files were (re)opened with RocksDB at ``applied``: the high watermark is at least that."""
        self._hw = max(self._hw, applied)

    # --- the high watermark ----------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """The committed end of the log: every record below it is on every in-sync replica. RocksDB holds
        the entries ending at or below it. Not replicated: the log end."""
        _start, end, applied = self.bucket.files.offsets()
        return max(self._hw, applied) if self.bucket.spec.replicated else end

    def advance_high_watermark(self, hw: int) -> int:
        """HW := max(HW, min(``hw``, log end)); apply every entry ending at or below it to RocksDB in offset
        order (the buffer's prepared batches where it holds them, else decoded from the changelog). Never
        moves back; returns the high watermark. Not replicated: the log end, nothing done. A HW that does not
        move opens nothing: a parked follower told its leader's unchanged HW stays parked (every entry the HW
        passed was applied before it was parked, or is replayed when it opens: :attr:`BucketFiles.replay_limit`)."""
        with self.bucket.write_lock:
            known = self.bucket.files.known_offsets()  # from memory while parked; None: opened below
            if known is not None and self.bucket.files.failure is None:  # failed: the apply is tried again
                _start, end, applied = known
                if not self.bucket.spec.replicated:
                    return end
                if min(hw, end) <= max(self._hw, applied):
                    return max(self._hw, applied)
        opened = False
        try:
            with self.bucket.files.use() as (changelog, kv), self.bucket.write_lock:
                opened = True
                return self._advance(changelog, kv, hw)
        except BucketStoreError:
            if not opened:  # the files cannot open now: a reopen replays up to the HW all the same
                self._remember(hw)
            raise

    def _advance(self, changelog: Changelog, kv: KvStore, hw: int) -> int:
        if not self.bucket.spec.replicated:
            return changelog.end_offset
        target = max(self._hw, kv.applied_offset, min(hw, changelog.end_offset))
        self._hw = self.bucket.files.replay_limit = target  # a reopen replays up to it
        try:
            self._apply_up_to(changelog, kv, target)
        except BaseException as exc:
            self._fail(exc)
            raise BucketStoreError(f"bucket {self.bucket.spec.dir}: applying the changelog up to the high watermark "
                                   f"{target} failed ({exc!r}); the bucket is reopened to replay it",
                                   dir=self.bucket.spec.dir) from exc
        return target

    def _remember(self, hw: int) -> None:
        """The files cannot open (a full disk, say) while the high watermark moves to ``hw``: the entries it
        commits were acknowledged, so the reopen replays up to it (the callers' ``hw`` is at most the log end
        they know: every entry below it is published and durable). Without it a reopen stopped at the old
        high watermark, and with no later move RocksDB never got the last acknowledged writes."""
        if self.bucket.spec.replicated:
            with self.bucket.write_lock:
                self._hw = max(self._hw, hw)
                self.bucket.files.replay_limit = max(self.bucket.files.replay_limit or 0, self._hw)

    def _apply_up_to(self, changelog: Changelog, kv: KvStore, target: int) -> None:
        buffer = self.bucket.buffer
        while kv.applied_offset < target:
            entry = buffer.first()
            if entry is not None and buffer.start == kv.applied_offset == entry.base:
                if entry.next > target:
                    return
                kv.commit(entry.prepared, entry.next)
                buffer.pop()
                continue
            entries = [e for e in changelog.read(kv.applied_offset, READ_BYTES) if e.next_offset <= target]
            if not entries:
                return
            kv.apply_records([e.records for e in entries], entries[-1].next_offset)
            buffer.invalidate()  # it did not hold these: rebuilt before the next write reads through it

    # --- a follower's log -------------------------------------------------------------------

    def append_replicated(self, entries: list[bytes]) -> int:
        """Append the leader's framed entries (as :meth:`fetch_log` returns them) byte for byte, fsync and
        publish them (RocksDB gets them from :meth:`advance_high_watermark`); returns the new log end.

        The first must start at this log's end and each at the end of the one before (InvalidRequestError
        naming both offsets); a bad size or CRC raises CorruptLogError. Nothing is appended then. The
        idempotent writers' batches they carry are known afterwards. Only a replicated store follows.
        """
        headers = [checked_header(frame) for frame in entries]
        with self.bucket.files.use() as (changelog, _kv), self.bucket.write_lock:
            self._require_replicated("append_replicated")
            self.bucket.files.check_writable()
            self._settle()
            expected = changelog.end_offset
            for header in headers:
                if header.base_offset != expected:
                    raise InvalidRequestError(f"bucket {self.bucket.spec.dir}: a replicated entry starts at offset "
                                              f"{header.base_offset} but this log ends at {expected}",
                                              offset=header.base_offset, end_offset=expected)
                expected += header.count
            for header in headers:
                if header.leader_epoch >= 0:
                    self.bucket.epoch_file.note(header.leader_epoch, header.base_offset)
            try:
                pending = changelog.write_raw(entries, headers)
                changelog.sync(pending)
                changelog.publish(pending)
            except BaseException as exc:
                self._fail(exc)
                raise
            for h in headers:
                if h.writer_id >= 0:
                    self.bucket.writers.record(h.writer_id, h.sequence, h.base_offset, h.base_offset + h.count,
                                        h.timestamp_ms or 0)
            return changelog.end_offset

    def truncate_to(self, offset: int) -> int:
        """Remove every entry whose records reach ``offset`` or beyond (one holding ``offset`` goes whole);
        returns the new log end. Durable. Refused (InvalidRequestError) if RocksDB holds any of them (below
        the applied offset: committed). Drops their buffered state and epochs; the writer sequences are
        built again from the changelog."""
        with self.bucket.files.use() as (changelog, kv), self.bucket.write_lock:
            self.bucket.files.check_writable()
            self._settle()
            if offset >= changelog.end_offset:
                return changelog.end_offset
            if offset < kv.applied_offset:
                raise InvalidRequestError(f"bucket {self.bucket.spec.dir}: cannot truncate the changelog to offset {offset}: "
                                          f"the records below {kv.applied_offset} are committed and applied",
                                          offset=offset, applied_offset=kv.applied_offset)
            try:
                end = changelog.truncate_from(offset)
            except BaseException as exc:
                self._fail(exc)
                raise
            self._hw = min(self._hw, end)
            if self.bucket.spec.replicated:
                self.bucket.files.replay_limit = self._hw
            self.bucket.writers.reset()
            self.bucket.buffer.invalidate()
            self.bucket.epoch_file.truncated(end)
            return end

    def install_snapshot(self, checkpoint_dir: str, log_offset: int,
                         writers: tuple[tuple[int, ...], ...] = (), synced: bool = False) -> None:
        """Replace this replica's RocksDB by the snapshot checkpoint in ``checkpoint_dir`` (moved away)
        and its changelog by an empty one starting at ``log_offset``, the snapshot's; the epoch cache
        starts empty, the writers' sequences from ``writers`` (the manifest's batches). Durable and crash-safe
        (``tablet/store/snapshot_install.py``; ``synced``: the checkpoint's files are fsynced already).
        InvalidSnapshotError if the checkpoint's applied offset is not ``log_offset``; BucketStoreError if
        the files are in use now (a scan's snapshot): nothing changed then. Only a replicated store."""
        self._require_replicated("install_snapshot")
        self._check_checkpoint(checkpoint_dir, log_offset)
        with self.bucket.write_lock:
            self._settle()
            fsync = self.bucket.files.settings.fsync
            self.bucket.files.replace(lambda: snapshot_install.install(self.bucket.spec.dir, checkpoint_dir, log_offset, fsync,
                                                                writers, synced))
            self._hw = log_offset
            self.bucket.files.replay_limit = log_offset
            self.bucket.epoch_file.clear()
            self.bucket.writers.reset()
            self.bucket.buffer.invalidate()
        with self.bucket.files.use():
            pass  # opened now: a bad install shows here, not at the next fetch

    def _check_checkpoint(self, checkpoint_dir: str, log_offset: int) -> None:
        """InvalidSnapshotError unless ``checkpoint_dir`` is a RocksDB checkpoint applied up to ``log_offset``."""
        try:
            found = checkpoint_log_offset(checkpoint_dir)
        except Exception as exc:  # rocksdict raises a bare Exception
            raise InvalidSnapshotError(f"bucket {self.bucket.spec.dir}: {checkpoint_dir} is not a RocksDB checkpoint: "
                                       f"{exc}") from exc
        if found != log_offset:
            raise InvalidSnapshotError(f"bucket {self.bucket.spec.dir}: the checkpoint holds the records below offset "
                                       f"{found}, the snapshot says {log_offset}", log_offset=log_offset)

    def rebase_kv(self, checkpoint_dir: str, log_offset: int) -> None:
        """Replace this follower's RocksDB by the snapshot checkpoint in ``checkpoint_dir`` (moved away) whose
        applied offset is ``log_offset``, keeping its changelog, epochs, writers and high watermark; the files
        reopen at once and replay the changelog from ``log_offset`` up to the high watermark, so RocksDB holds
        the same rows as before, in the snapshot's SST files plus new ones (``tablet/store/kv_rebase.py``).
        InvalidSnapshotError if the checkpoint's applied offset is not ``log_offset``, or if the changelog does
        not reach from ``log_offset`` to the applied offset (nothing changed then); BucketStoreError if the files
        are in use now (BucketInUseError: try again). Only a replicated store; the caller makes sure this replica
        follows (``tablet/replication/rebase.py``: under its fetch lock)."""
        self._require_replicated("rebase_kv")
        self._check_checkpoint(checkpoint_dir, log_offset)
        with self.bucket.files.use() as (changelog, kv):
            start, applied = changelog.start_offset, kv.applied_offset
        with self.bucket.write_lock:
            if not start <= log_offset <= applied:
                raise InvalidSnapshotError(f"bucket {self.bucket.spec.dir}: a snapshot at offset {log_offset} cannot "
                                           f"re-base RocksDB (applied up to {applied}, the changelog starts at {start})",
                                           log_offset=log_offset)
            self._settle()
            fsync = self.bucket.files.settings.fsync
            self.bucket.files.replay_limit = max(self.bucket.files.replay_limit or 0, applied)
            self.bucket.files.replace(lambda: self._swap_kv(checkpoint_dir, log_offset, fsync))
            self.bucket.buffer.invalidate()
        with self.bucket.files.use():
            pass  # reopened now, the changelog replayed: a bad snapshot shows here, not at the next fetch

    def _swap_kv(self, checkpoint_dir: str, log_offset: int, fsync: bool) -> None:
        """:meth:`rebase_kv`'s swap, the files closed: the changelog must still start at or below ``log_offset``
        (its retention may have run since it was looked at), else nothing changes."""
        start = kv_rebase.log_start(self.bucket.spec.dir)
        if start is None or start > log_offset:
            raise InvalidSnapshotError(f"bucket {self.bucket.spec.dir}: its changelog starts at {start}, above the "
                                       f"snapshot's offset {log_offset}: RocksDB is not re-based", log_offset=log_offset)
        kv_rebase.rebase(self.bucket.spec.dir, checkpoint_dir, log_offset, fsync)

    def discard_files(self, why: str) -> None:
        """Move this replica's files aside (``tablet/bucket/damage.py``) and start empty at offset 0, to be
        rebuilt (``why`` is logged). BucketStoreError if the files are in use now: nothing changed then."""
        self._require_replicated("discard_files")
        with self.bucket.write_lock:
            self._settle()
            self.bucket.files.replace(lambda: bucket_damage.move_aside(self.bucket.spec.dir, why))
            self._hw = 0
            self.bucket.files.replay_limit = 0
            self.bucket.epoch_file.clear()
            self.bucket.writers.reset()
            self.bucket.writers.seed = ()
            self.bucket.buffer.invalidate()

    def _require_replicated(self, what: str) -> None:
        if not self.bucket.spec.replicated:
            raise InvalidRequestError(f"bucket {self.bucket.spec.dir} is not replicated: {what} is for replicas of a "
                                      f"replicated bucket")

    # --- roles and leader epochs ----------------------------------------------------------------

    def become_leader(self, epoch: int) -> None:
        """Lead under ``epoch``: stamp it on the writes from now on, assign it at the log end in the epoch
        cache, and rebuild the pre-write buffer from the entries between the applied offset and the log
        end. FencedLeaderEpochError if the log already holds a newer epoch."""
        with self.bucket.files.use() as (changelog, kv), self.bucket.write_lock:
            self._settle()
            self.bucket.epoch_file.note(epoch, changelog.end_offset)
            self.bucket.role.leader_epoch = epoch
            self.bucket.role.following = False
            if self.bucket.spec.replicated:
                self.bucket.buffer.ready(changelog, kv.applied_offset)

    def become_follower(self, epoch: int) -> None:
        """Follow the leader of ``epoch``: the pre-write buffer is dropped (its entries stay in the log, to
        be applied by :meth:`advance_high_watermark` or cut by :meth:`truncate_to`)."""
        with self.bucket.write_lock:
            self._settle()
            self.bucket.role.leader_epoch = epoch
            self.bucket.role.following = True
            self.bucket.buffer.invalidate()

    def _open_unless_known(self) -> None:
        """Open a bucket whose offsets are not in memory (never opened since the start, or failed) before the
        write lock is taken (an open replays the changelog); a parked one opens nothing. Under the lock,
        ``files.offsets()`` then answers from memory: every change of the log or of the epoch cache takes
        the lock with the files open, so the end and the cache (kept while parked, the same as the checkpoint
        a reopen loads) agree."""
        if self.bucket.files.known_offsets() is None:
            with self.bucket.files.use():
                pass

    @property
    def last_epoch(self) -> int:
        """The leader epoch of the log's last entry (-1: no entry, or written without an epoch). A parked
        bucket answers from memory (what a follower's fetch round asks of every bucket it follows)."""
        self._open_unless_known()
        with self.bucket.write_lock:
            end = self.bucket.files.offsets()[1]
            epoch = self.bucket.epoch_file.cache.epoch_at(end - 1) if end > 0 else None
            return -1 if epoch is None else epoch

    @property
    def epochs(self) -> EpochCache:
        """A copy of the leader-epoch cache."""
        with self.bucket.files.use(), self.bucket.write_lock:
            return self.bucket.epoch_file.copy()

    def end_offset_for(self, epoch: int) -> EpochEnd:
        """The leader's answer to a follower whose latest epoch is ``epoch`` (:meth:`EpochCache.end_offset_for`);
        a parked bucket answers from memory (every follower's fetch asks it of every bucket)."""
        self._open_unless_known()
        with self.bucket.write_lock:
            return self.bucket.epoch_file.cache.end_offset_for(epoch, self.bucket.files.offsets()[1])

    def truncation_for(self, answer: EpochEnd) -> Truncation:
        """The follower's step on its leader's ``answer`` (:meth:`EpochCache.truncation_for`); the caller
        then calls :meth:`truncate_to` with its offset, and asks again unless it is ``done``."""
        with self.bucket.files.use() as (changelog, _kv), self.bucket.write_lock:
            return self.bucket.epoch_file.cache.truncation_for(answer, changelog.end_offset)
