"""A replica's leader-epoch cache on disk: ``{bucket dir}/leader-epochs.json``.

The cache (:class:`~kvlease.tablet.log.epochs.EpochCache`) says under which
leader epoch each stretch of the changelog was written. The bucket store
keeps it in memory and writes this checkpoint whenever it changes (a new
epoch appended or assigned, a truncation), atomically: a temporary file,
fsynced, renamed over the old one, and the directory fsynced.

:func:`load` reads it when the bucket's files open and reconciles it with the
changelog: epochs starting past the log's end are dropped (a crash lost the
entries they were assigned for) and the oldest epoch starts no earlier than
the log (retention). A missing or damaged checkpoint is rebuilt by walking
the changelog's entry headers (every entry carries its leader epoch) and
written again, so the walk happens once.

:class:`EpochFile` is a bucket store's holder of its cache: it loads it,
assigns and drops epochs, and saves the checkpoint on every change (the
store's parts call it under the store's write lock).
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from kvlease.common.errors import FencedLeaderEpochError
from kvlease.common.logentry import read_header
from kvlease.tablet.log.changelog import Changelog
from kvlease.tablet.log.epochs import EpochCache
from kvlease.tablet.log.segment_files import write_durably

log = logging.getLogger(__name__)

FILE_NAME = "leader-epochs.json"
_READ_BYTES = 4 << 20  # changelog bytes read per step of a rebuild


def path_in(dir: str) -> str:
    return os.path.join(dir, FILE_NAME)


def save(dir: str, cache: EpochCache, fsync: bool = True) -> None:
    """Write the checkpoint of ``cache`` into ``dir`` atomically (tmp + fsync + rename + directory fsync)."""
    write_durably(path_in(dir), cache.to_bytes(), fsync)


def load(dir: str, changelog: Changelog, fsync: bool = True) -> EpochCache:
    """The checkpointed cache of ``dir`` reconciled with ``changelog`` (see the module docstring); rebuilt
    from the changelog (and saved) when the checkpoint is missing or damaged."""
    try:
        with open(path_in(dir), "rb") as fh:
            cache = EpochCache.from_bytes(fh.read())
    except FileNotFoundError:
        cache = None
    except ValueError as exc:
        log.warning("bucket %s: leader-epoch checkpoint is damaged (%s); rebuilding it from the changelog",
                    dir, exc)
        cache = None
    if cache is None:
        cache = rebuild(changelog)
        save(dir, cache, fsync)
        return cache
    cache.truncate_from(changelog.end_offset + 1)  # an epoch assigned at the end itself stays (a new leader's)
    cache.truncate_before(changelog.start_offset)
    return cache


def rebuild(changelog: Changelog) -> EpochCache:
    """The cache of the changelog's entries, from their headers (entries without an epoch are skipped)."""
    cache = EpochCache()
    offset, end = changelog.start_offset, changelog.end_offset
    while offset < end:
        frames = changelog.read_raw(offset, _READ_BYTES)
        if not frames:
            break
        for frame in frames:
            header = read_header(frame, 0, len(frame))
            latest = cache.latest_epoch
            if header.leader_epoch >= 0 and (latest is None or header.leader_epoch > latest):
                cache.assign(header.leader_epoch, max(header.base_offset, offset))
            offset = max(offset, header.base_offset + header.count)
    return cache


class EpochFile:
    """One bucket's leader-epoch cache (:attr:`cache`) and its checkpoint in ``dir``, saved on every change.

    ``log_end()``: the open changelog's end offset now (epochs assigned at or past it hold no entry). Not
    locked: the bucket store's parts use it under the store's write lock."""

    def __init__(self, dir: str, fsync: bool, log_end: Callable[[], int]) -> None:
        self.dir = dir
        self.fsync = fsync
        self._log_end = log_end
        #: The cache; replaced whole when the files open, a snapshot is installed or the files are discarded.
        self.cache = EpochCache()

    def opened(self, changelog: Changelog) -> None:
        """The bucket's files opened: the checkpoint reconciled with ``changelog`` (:func:`load`)."""
        self.cache = load(self.dir, changelog, self.fsync)

    def clear(self) -> None:
        """Start empty (a snapshot installed, the files discarded); saved by the next change."""
        self.cache = EpochCache()

    def copy(self) -> EpochCache:
        return EpochCache((e.epoch, e.start_offset) for e in self.cache.entries)

    def stale(self, epoch: int) -> bool:
        """Whether the log holds entries of an epoch newer than ``epoch``."""
        latest = self.cache.latest_epoch
        if latest is None or epoch >= latest:
            return False
        older = self.copy()
        older.truncate_from(self._log_end())  # epochs assigned at the end hold no entry
        return older.latest_epoch is not None and epoch < older.latest_epoch

    def note(self, epoch: int, start: int) -> None:
        """An entry of ``epoch`` is appended at ``start``, the log end (or the replica leads from there):
        assign the epoch there unless it is the latest; epochs assigned at or after ``start`` hold no entry
        and are superseded. FencedLeaderEpochError if an older epoch than the log's."""
        cache = self.cache
        if epoch == cache.latest_epoch:
            return
        if self.stale(epoch):
            raise FencedLeaderEpochError(f"bucket {self.dir}: leader epoch {epoch} is older than the log's "
                                         f"latest, {cache.latest_epoch}", leader_epoch=cache.latest_epoch)
        cache.truncate_from(start)
        if epoch != cache.latest_epoch:
            cache.assign(epoch, start)
        self.save()

    def truncated(self, end: int) -> None:
        """The log was cut back to ``end``: the epochs from there on go."""
        self.cache.truncate_from(end)
        self.save()

    def retained(self, start: int) -> None:
        """Retention moved the log's start to ``start``."""
        self.cache.truncate_before(start)
        self.save()

    def save(self) -> None:
        save(self.dir, self.cache, self.fsync)
