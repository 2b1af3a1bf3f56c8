"""A changelog's segment files: their names, recovery at open, and moving bytes in and out.

Segments are files ``{base_offset:020d}.log`` in the changelog's directory,
holding framed entries (:mod:`kvlease.common.logentry`) back to back; each is indexed
in memory by :class:`~kvlease.tablet.log.index.SegmentIndex`. Recovery at open
(:func:`recover`) indexes them from their headers, cuts a torn tail off the
newest one and raises :class:`~kvlease.common.logentry.CorruptLogError` for anything
else that is damaged. :class:`kvlease.tablet.log.changelog.Changelog` owns the files'
life (locks, offsets, rolls, retention) and calls these.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import re

from kvlease.common.fsync import fsync_path
from kvlease.common.logentry import CorruptLogError, check_frame, valid_frame_after
from kvlease.tablet.log.index import NO_TIMESTAMP, SegmentIndex, time_key

log = logging.getLogger("tablet.log.changelog.segments")  # under the changelog's logger: its recovery warnings

SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
MAX_IOV = 512  # buffers per writev call


def segment_path(dir: str, base_offset: int) -> str:
    return os.path.join(dir, f"{base_offset:020d}.log")


def sync_dir(dir: str) -> None:
    """fsync the directory: a segment created or deleted in it stays so after a crash."""
    fsync_path(dir)


def write_durably(path: str, data: bytes, fsync: bool = True) -> None:
    """Replace the file ``path`` with ``data`` atomically (a tmp file renamed over it) and, with ``fsync``,
    durably: the bytes are synced before the rename and the directory after it, so a crash leaves the old
    file or the new one, never a torn one."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        sync_dir(os.path.dirname(path) or ".")


def create(path: str) -> int:
    """A new, empty segment file opened for appending (FileExistsError if there is one)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)


def write_all(fd: int, iov: list) -> None:
    """Write all of ``iov`` to ``fd`` (at most :data:`MAX_IOV` buffers a call; a short write resumes)."""
    while iov:
        chunk = iov[:MAX_IOV]
        written = os.writev(fd, chunk)
        if written == sum(len(b) for b in chunk):
            iov = iov[MAX_IOV:]
            continue
        rest = []  # a short write: resume at the first byte not written
        for b in chunk:
            if written >= len(b):
                written -= len(b)
            else:
                rest.append(memoryview(b)[written:])
                written = 0
        iov = rest + iov[MAX_IOV:]


def pread_all(fd: int, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    """The bytes at each ``(position, size)`` of ``path`` open as ``fd``, which this closes;
    CorruptLogError on a short read."""
    try:
        out = [os.pread(fd, size, position) for position, size in ranges]
    finally:
        os.close(fd)
    for (position, size), data in zip(ranges, out):
        if len(data) != size:
            raise CorruptLogError(f"changelog {path}: short read of {len(data)}/{size} bytes at {position}")
    return out


def recover(dir: str, verify_all: bool) -> list[SegmentIndex]:
    """Index the segments in ``dir`` (creating the first if there is none), oldest first; cut a torn
    tail off the newest. CorruptLogError for anything else that is damaged, or a gap between segments;
    ``verify_all``: check every entry's checksum, not only the newest segment's."""
    found = sorted((int(m.group(1)), name) for name in os.listdir(dir)
                   if (m := SEGMENT_NAME.match(name)))
    if not found:
        os.close(os.open(segment_path(dir, 0), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        sync_dir(dir)
        return [SegmentIndex(0, segment_path(dir, 0))]
    # An empty newest segment is a roll a crash interrupted: its predecessor is the tail.
    while len(found) > 1 and os.path.getsize(segment_path(dir, found[-1][0])) == 0:
        log.warning("changelog %s: removing empty newest segment %s", dir, found[-1][1])
        os.unlink(segment_path(dir, found.pop()[0]))
    segments: list[SegmentIndex] = []
    for i, (base, _) in enumerate(found):
        if segments and segments[-1].end_offset != base:
            raise CorruptLogError(f"changelog {dir}: segment {found[i - 1][1]} ends at offset "
                                  f"{segments[-1].end_offset} but the next one starts at {base}",
                                  dir=dir)
        tail = i == len(found) - 1
        floor = segments[-1].last_time if segments else NO_TIMESTAMP
        segments.append(scan(dir, base, floor, tail=tail, verify=tail or verify_all))
    return segments


def entry_start(segments: list[SegmentIndex], offset: int) -> int:
    """The base of the first entry whose records reach ``offset`` or beyond (the end if none does)."""
    for seg in segments:
        if seg.end_offset > offset:
            i = bisect.bisect_right(seg.bases, offset) - 1
            return seg.bases[max(i, 0)] if seg.bases else seg.end_offset
    return segments[-1].end_offset


def cut_index(segments: list[SegmentIndex], end: int) -> list[SegmentIndex]:
    """Cut the index at ``end`` (an entry's base): the segments starting at or after it leave
    ``segments`` (the first one stays) and are returned; the one holding ``end`` ends there."""
    doomed = []
    while len(segments) > 1 and segments[-1].base_offset >= end:
        doomed.append(segments.pop())
    segments[-1].cut(end)
    return doomed


def cut_files(doomed: list[SegmentIndex], active: SegmentIndex, fsync: bool) -> None:
    """The files of :func:`cut_index`: unlink ``doomed`` newest first (a crash leaves a contiguous prefix),
    then cut ``active`` to its size, synced when ``fsync``."""
    for seg in doomed:
        os.unlink(seg.path)
    if fsync and doomed:
        sync_dir(os.path.dirname(active.path))
    with open(active.path, "r+b") as fh:
        fh.truncate(active.size)
        if fsync:
            os.fsync(fh.fileno())


def scan(dir: str, base: int, floor: int, *, tail: bool, verify: bool) -> SegmentIndex:
    """Index one segment from its headers (either format version); in the tail segment, cut a
    torn tail away. ``floor``: the time key of the entry before this segment."""
    seg = SegmentIndex(base, segment_path(dir, base), floor)
    size = os.path.getsize(seg.path)
    pos, expected, problem = 0, base, None
    if size:
        with open(seg.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            while pos < size:
                problem, torn, header = check_frame(mm, pos, size, expected, verify)
                if header is not None:
                    seg.add(expected, pos, time_key(header.timestamp_ms, seg.last_time))
                    expected += header.count
                    pos += header.size + header.payload_len
                    continue
                where = f"changelog segment {seg.path}, byte {pos} (offset {expected})"
                if not tail or not torn:
                    raise CorruptLogError(f"{where}: {problem}", path=seg.path, position=pos)
                if valid_frame_after(mm, pos + 1, size, expected):
                    raise CorruptLogError(f"{where}: {problem}, and valid entries follow it, so it "
                                          f"is not a torn write", path=seg.path, position=pos)
                break
    if pos < size:
        log.warning("changelog %s: dropping a torn tail of %d bytes at byte %d (offset %d): %s",
                    seg.path, size - pos, pos, expected, problem)
        with open(seg.path, "r+b") as fh:
            fh.truncate(pos)
            os.fsync(fh.fileno())
    seg.end_offset, seg.size = expected, pos
    return seg
