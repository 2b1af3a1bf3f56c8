"""A bucket's changelog: numbered change records in framed entries, one per write batch, in segment files.

Records are numbered 0, 1, 2, … (docs/architecture.md, "Offsets"). Each append writes ONE entry holding a whole
batch and its append time, so building, writing and reading cost nothing per record in Python. The entry
format is ``common/logentry.py`` (clients decode it too); entries live in segment files
``{base_offset:020d}.log`` (``tablet/log/segment_files.py``: names, recovery, bytes in and out), indexed in
memory by ``tablet/log/index.py``. Append times never decrease: an entry gets ``max(previous entry's, clock)``.
A follower appends its leader's entries byte for byte (:meth:`Changelog.write_raw`) and may cut its tail
(:meth:`Changelog.truncate_from`).

Concurrency: one writer at a time (``append*``, ``write*`` and ``truncate_*`` take a lock); an append is
write -> sync -> publish (``append_batches`` does all three), and the sync runs outside the lock, so
several written appends may wait on one fsync. Readers run concurrently and only see published entries:
fully written (and fsynced, when ``fsync``). Recovery at open drops a torn tail of the last segment and
raises :class:`CorruptLogError` for anything else that is damaged.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

import pyarrow as pa

from kvlease.common import config as cfg
from kvlease.common.errors import InvalidRequestError
from kvlease.common.logentry import (HEADER_SIZE, NO_ID, ChangelogError, CorruptLogError, FrameHeader, LogEntry,
                                     conform, decode_entry, encode_payload, frame_header, record_batch)
from kvlease.tablet.log import segment_files
from kvlease.tablet.log.index import (PendingAppend, SegmentIndex, SegmentInfo, first_offset_at_or_after, runs_from,
                                      time_key)

log = logging.getLogger(__name__)

_SPLIT_READ_BYTES = 32 << 10  # read_raw: entries this big on average get a pread each (no copy)


class LogOffsetOutOfRangeError(InvalidRequestError):
    """The offset is below ``start_offset`` or above ``end_offset`` (both in ``details``)."""


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Changelog:
    """The changelog of one bucket in ``dir`` (created if missing); see the module docstring."""

    def __init__(self, dir: str, *, segment_bytes: int, fsync: bool = True, verify_all: bool = False,
                 clock_ms: Callable[[], int] | None = None) -> None:
        """``clock_ms``: the append time source, ms since the epoch (default: the wall clock)."""
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        self.dir = dir
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.clock_ms = clock_ms or _wall_clock_ms
        self._write_lock = threading.Lock()
        self._index_lock = threading.Lock()
        self._failed: BaseException | None = None
        self._closed = False
        os.makedirs(dir, exist_ok=True)
        self._lock_fd = os.open(os.path.join(dir, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise ChangelogError(f"changelog {dir} is open in another Changelog instance", dir=dir) from None
        try:
            self._segments = segment_files.recover(dir, verify_all)
            self._segment_bases = [s.base_offset for s in self._segments]
            active = self._segments[-1]
            self._fd = os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except BaseException:
            os.close(self._lock_fd)
            raise
        # Writer-side state, ahead of the published index while appends are written but not published.
        self._active = active
        self._write_size = active.size
        self._write_offset = active.end_offset
        self._write_time = active.last_time  # the newest entry's time key: appends never go below it
        self._sync_lock = threading.Lock()  # one fsync at a time: the callers it covers need none
        self._synced_offset = active.end_offset  # every record below it is durable (or was found on disk)

    decode_entry = staticmethod(decode_entry)  # for entries shipped by read_raw

    @classmethod
    def from_config(cls, dir: str, config: cfg.Config, clock_ms: Callable[[], int] | None = None) -> "Changelog":
        return cls(dir, segment_bytes=config[cfg.LOG_SEGMENT_BYTES], fsync=config[cfg.LOG_FLUSH_FSYNC],
                   clock_ms=clock_ms)

    # --- offsets -------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        with self._index_lock:
            return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """The offset the next appended record gets."""
        with self._index_lock:
            return self._segments[-1].end_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose entry was appended at or after ``timestamp_ms`` (ms since the epoch).

        ``start_offset`` if every kept entry is that new, ``end_offset`` if none is; entries without a
        timestamp (format version 1) count as older than any. A binary search of the in-memory index: no
        file is read. Raises InvalidRequestError for a negative timestamp."""
        if timestamp_ms < 0:
            raise InvalidRequestError(f"timestamp must be ms since the epoch (>= 0), got {timestamp_ms}",
                                      timestamp=timestamp_ms)
        with self._index_lock:
            self._check_open()
            return first_offset_at_or_after(self._segments, timestamp_ms)

    # --- writing ---------------------------------------------------------------------------

    def append(self, change_types: Any, keys: Any, values: Any) -> tuple[int, int]:
        """Append one batch (arrays or lists); returns ``(base_offset, next_offset)``."""
        return self.append_batches([record_batch(change_types, keys, values)])[0]

    def append_batch(self, batch: pa.RecordBatch) -> tuple[int, int]:
        return self.append_batches([batch])[0]

    def append_batches(self, batches: Sequence[pa.RecordBatch]) -> list[tuple[int, int]]:
        """Append each batch as one entry, with one fsync for all of them (group commit).

        Returns ``(base_offset, next_offset)`` per batch; an empty batch writes nothing and gets ``(n, n)``.
        Readers see the entries only once written (and fsynced). Raises InvalidRequestError for a batch that
        does not fit :data:`SCHEMA`; ChangelogError when the disk write fails (the changelog then refuses
        appends until reopened, and whether the entries survive a reopen is unknown). The same as
        :meth:`write`, :meth:`sync`, :meth:`publish`.
        """
        pending = self.write(batches)
        self.sync(pending)
        self.publish(pending)
        return pending.ranges

    def write(self, batches: Sequence[pa.RecordBatch], *, leader_epoch: int = NO_ID,
              writer: tuple[int, int] | None = None) -> "PendingAppend":
        """The first step of an append: write the entries (stamped with ``leader_epoch``, the epoch of the leader
        appending them, and with ``writer``'s ``(writer id, sequence)`` when it is an idempotent writer's batch:
        one batch then) to the file (offsets are taken), not yet durable nor visible. Then :meth:`sync` (any
        thread; several writes may wait on one fsync), then :meth:`publish` in the order of the writes. Raises
        like :meth:`append_batches`; a failure fails every write not yet published."""
        if writer is not None and len(batches) != 1:
            raise ValueError(f"an idempotent writer's append is one batch, not {len(batches)}")
        writer_id, sequence = writer if writer is not None else (NO_ID, NO_ID)
        encoded = [(b.num_rows, encode_payload(conform(b)) if b.num_rows else None) for b in batches]
        for _, payload in encoded:
            if payload is not None and len(payload) > 0xFFFFFFFF:
                raise InvalidRequestError(f"changelog batch of {len(payload)} bytes exceeds 4 GiB")
        with self._write_lock:
            self._check_writable()
            pending = PendingAppend(timestamp=max(self._write_time, int(self.clock_ms()), 0))  # one time per group
            iov: list = []
            try:
                for count, payload in encoded:
                    base = self._write_offset
                    pending.ranges.append((base, base + count))
                    if count:
                        iov = self._place(pending, iov, count, HEADER_SIZE + len(payload), pending.timestamp)
                        iov += [frame_header(base, count, payload, pending.timestamp, leader_epoch=leader_epoch,
                                             writer_id=writer_id, sequence=sequence), payload]
                self._write(iov, sync=False)
            except BaseException as exc:  # the file may now hold part of this append
                self._write_failed(exc)
            return self._written(pending)

    def write_raw(self, frames: Sequence[Any], headers: Sequence[FrameHeader]) -> "PendingAppend":
        """:meth:`write` for another replica's framed entries (``headers``: theirs, checked by the caller), byte
        for byte. Each must start where the one before ends, the first at the end (else InvalidRequestError)."""
        with self._write_lock:
            self._check_writable()
            expected = self._write_offset
            for header in headers:
                if header.base_offset != expected:
                    raise InvalidRequestError(f"changelog {self.dir}: a replicated entry starts at offset "
                                              f"{header.base_offset}, the log ends at {expected}",
                                              offset=header.base_offset, end_offset=expected)
                expected += header.count
            pending, iov = PendingAppend(timestamp=self._write_time), []
            try:
                for frame, header in zip(frames, headers):
                    pending.timestamp = time_key(header.timestamp_ms, pending.timestamp)
                    pending.ranges.append((header.base_offset, header.base_offset + header.count))
                    iov = self._place(pending, iov, header.count, len(frame), pending.timestamp)
                    iov.append(frame)
                self._write(iov, sync=False)
            except BaseException as exc:
                self._write_failed(exc)
            return self._written(pending)

    def _place(self, pending: "PendingAppend", iov: list, count: int, size: int, time: int) -> list:
        """Take the offsets and bytes of an entry (rolling first if it does not fit): returns the buffers to write."""
        base = self._write_offset
        if self._write_size and self._write_size + size > self.segment_bytes:
            self._write(iov)
            iov = []
            pending.rolled.append((self._active, self._write_size, base))
            self._roll(base, time)
            pending.new_segments.append(self._active)
        pending.entries.append((self._active, base, self._write_size, time))
        self._write_size += size
        self._write_offset += count
        return iov

    def _write_failed(self, exc: BaseException) -> None:
        self._failed = exc
        self._undo_unpublished()
        if isinstance(exc, OSError):
            raise ChangelogError(f"changelog {self.dir}: write failed: {exc}", dir=self.dir) from exc
        raise exc

    def _written(self, pending: "PendingAppend") -> "PendingAppend":
        pending.active, pending.size, pending.end = self._active, self._write_size, self._write_offset
        if pending.entries:
            self._write_time = pending.timestamp
        return pending

    def sync(self, pending: "PendingAppend") -> None:
        """Make a written append durable (fdatasync when ``fsync``): one fsync covers every append
        written before it, so concurrent callers share it. Raises ChangelogError if it failed."""
        if not self.fsync:
            return
        with self._sync_lock:
            if self._synced_offset >= pending.end:
                return  # another caller's fsync covered it
            with self._write_lock:
                self._check_writable()
                target, fd = self._write_offset, os.dup(self._fd)  # a roll may close self._fd meanwhile
            try:
                os.fdatasync(fd)
            except OSError as exc:
                self._failed = exc
                raise ChangelogError(f"changelog {self.dir}: fsync failed: {exc}", dir=self.dir) from exc
            finally:
                os.close(fd)
            self._synced_offset = target

    def publish(self, pending: "PendingAppend") -> None:
        """Show a synced append to readers; appends are published in the order they were written.
        Raises ChangelogError if the changelog failed since (the append is then lost or unknown)."""
        if not pending.entries:
            return  # wrote nothing
        with self._index_lock:
            if self._failed is not None:
                raise ChangelogError(f"changelog {self.dir} failed before this append was published "
                                     f"({self._failed})", dir=self.dir)
            for segment, base, position, time in pending.entries:
                segment.add(base, position, time)
            for segment, size, end in pending.rolled:
                segment.size, segment.end_offset = size, end
            for segment in pending.new_segments:
                self._segments.append(segment)
                self._segment_bases.append(segment.base_offset)
            pending.active.size = pending.size
            pending.active.end_offset = pending.end

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise ChangelogError(f"changelog {self.dir} failed earlier ({self._failed}); reopen it")

    def _write(self, iov: list, sync: bool = True) -> None:
        """Write all of ``iov`` to the active segment, then fsync if configured and ``sync``."""
        segment_files.write_all(self._fd, iov)
        if self.fsync and sync:
            os.fdatasync(self._fd)  # before a roll: what the old segment holds is durable

    def _roll(self, base_offset: int, floor: int) -> None:
        """Start a new active segment at ``base_offset`` (the old one is written and synced)."""
        segment = SegmentIndex(base_offset, self._path(base_offset), floor)
        fd = segment_files.create(segment.path)
        os.close(self._fd)
        self._fd, self._active, self._write_size = fd, segment, 0
        if self.fsync:
            self._sync_dir()

    def _undo_unpublished(self) -> None:
        """After a failed write: cut the active file back to what readers know (best effort); the
        appends written but not published fail at :meth:`publish`."""
        with self._index_lock:
            published = self._active.size if self._active is self._segments[-1] else 0
        try:
            os.ftruncate(self._fd, published)
        except OSError:
            pass

    def flush(self) -> None:
        """fsync the active segment (for ``fsync=False`` logs at a checkpoint or shutdown)."""
        with self._write_lock:
            self._check_open()
            os.fdatasync(self._fd)

    # --- reading -----------------------------------------------------------------------------

    def read(self, from_offset: int, max_bytes: int) -> list[LogEntry]:
        """Entries from ``from_offset`` on, the first one sliced to start exactly there.

        Whole entries are added while their framed sizes fit in ``max_bytes``; the first one always comes,
        whatever its size. ``from_offset == end_offset`` gives ``[]``; outside ``[start_offset, end_offset]``
        raises :class:`LogOffsetOutOfRangeError`; a damaged entry raises CorruptLogError. The batches share
        one read buffer per segment (no copy per entry).
        """
        entries: list[LogEntry] = []
        for path, run in self._runs(from_offset, max_bytes):
            start = run[0][0]
            data = memoryview(self._pread(path, [(start, run[-1][0] + run[-1][1] - start)], from_offset)[0])
            for position, size, base, count in run:
                entry = decode_entry(data[position - start:position - start + size],
                                     from_offset=None if entries else from_offset)
                if entry.next_offset != base + count:
                    raise CorruptLogError(f"changelog {path}: entry at byte {position} holds offsets up "
                                          f"to {entry.next_offset}, the index says {base + count}")
                entries.append(entry)
        return entries

    def read_raw(self, from_offset: int, max_bytes: int) -> list[bytes]:
        """Like :meth:`read` but each entry's framed bytes, whole and not checked.

        The first one may start before ``from_offset``: the receiver decodes it
        with ``decode_entry(data, from_offset=from_offset)``.
        """
        out: list[bytes] = []
        for path, run in self._runs(from_offset, max_bytes):
            start, total = run[0][0], run[-1][0] + run[-1][1] - run[0][0]
            if total >= _SPLIT_READ_BYTES * len(run):  # big entries: read each into its own bytes
                out += self._pread(path, [(position, size) for position, size, _, _ in run], from_offset)
                continue
            data = self._pread(path, [(start, total)], from_offset)[0]
            out += [data[position - start:position - start + size] for position, size, _, _ in run]
        return out

    def _runs(self, from_offset: int, max_bytes: int) -> list[tuple[str, list[tuple[int, int, int, int]]]]:
        """The entries to read as (segment path, [(position, size, base_offset, count)]) per segment."""
        if max_bytes <= 0:
            raise InvalidRequestError(f"max_bytes must be positive, got {max_bytes}")
        with self._index_lock:
            self._check_open()
            start, end = self._segments[0].base_offset, self._segments[-1].end_offset
            if not start <= from_offset <= end:
                raise LogOffsetOutOfRangeError(
                    f"offset {from_offset} is outside the changelog [{start}, {end}]",
                    offset=from_offset, start_offset=start, end_offset=end)
            s = bisect.bisect_right(self._segment_bases, from_offset) - 1
            return runs_from(self._segments[s:], from_offset, max_bytes) if from_offset < end else []

    def _pread(self, path: str, ranges: list[tuple[int, int]], from_offset: int) -> list[bytes]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # truncate_before removed it since _locate
            start = self.start_offset
            raise LogOffsetOutOfRangeError(f"offset {from_offset} was removed from the changelog "
                                           f"(start is now {start})", offset=from_offset,
                                           start_offset=start, end_offset=self.end_offset) from None
        return segment_files.pread_all(fd, path, ranges)

    # --- retention -------------------------------------------------------------------------------

    def segments(self) -> list[SegmentInfo]:
        """The segments oldest first; the last one is the active segment."""
        with self._index_lock:  # listed segments are never unlinked while the lock is held
            self._check_open()
            return [SegmentInfo(s.base_offset, s.end_offset, s.size, os.stat(s.path).st_mtime, s.path)
                    for s in self._segments]

    def truncate_before(self, offset: int) -> int:
        """Delete the oldest whole segments whose records are all below ``offset`` (never the active
        segment); returns how many segments were deleted."""
        with self._write_lock:
            with self._index_lock:
                self._check_open()
                doomed = []
                while len(self._segments) > 1 and self._segments[0].end_offset <= offset:
                    doomed.append(self._segments.pop(0))
                    self._segment_bases.pop(0)
            for seg in doomed:
                os.unlink(seg.path)
            if doomed:
                log.info("changelog %s: deleted %d segments below offset %d", self.dir, len(doomed),
                         doomed[-1].end_offset)
                if self.fsync:
                    self._sync_dir()
            return len(doomed)

    def truncate_from(self, offset: int) -> int:
        """Remove the entries whose records reach ``offset`` or beyond (one holding ``offset`` goes whole): returns
        the new end, the first such entry's base. Durable when ``fsync``: newest segments are unlinked first, then
        the file holding the new end is cut and synced. No append may be written and not yet published."""
        with self._write_lock:
            with self._index_lock:
                self._check_writable()
                end = segment_files.entry_start(self._segments, offset)
                doomed = segment_files.cut_index(self._segments, end)
                del self._segment_bases[len(self._segments):]
                active = self._segments[-1]
            if end == self._write_offset and not doomed:
                return end
            try:  # the active segment's fd appends (O_APPEND) at the new end; a new active one needs its own
                segment_files.cut_files(doomed, active, self.fsync)
                if doomed:
                    fd, self._fd = self._fd, os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                    os.close(fd)
            except OSError as exc:
                self._failed = exc
                raise ChangelogError(f"changelog {self.dir}: truncation failed: {exc}", dir=self.dir) from exc
            self._active, self._write_size, self._write_offset = active, active.size, end
            self._write_time = active.last_time
            self._synced_offset = min(self._synced_offset, end)
            log.info("changelog %s: truncated to offset %d", self.dir, end)
            return end

    # --- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        with self._write_lock:
            if self._closed:
                return
            with self._index_lock:
                self._closed = True
            try:
                if self._failed is None:
                    os.fdatasync(self._fd)
            finally:
                os.close(self._fd)
                os.close(self._lock_fd)  # releases the flock

    def __enter__(self) -> "Changelog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ChangelogError(f"changelog {self.dir} is closed")

    def _path(self, base_offset: int) -> str:
        return segment_files.segment_path(self.dir, base_offset)

    def _sync_dir(self) -> None:
        segment_files.sync_dir(self.dir)
