"""A replica's leader-epoch cache on disk: ``{bucket dir}/leader-epochs.json``.

The cache (:class:`~tablet.replication.epochs.EpochCache`) says under which
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
"""

from __future__ import annotations

import logging
import os

from common.logentry import read_header
from tablet.changelog import Changelog
from tablet.replication.epochs import EpochCache
from tablet.segment_files import write_durably

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
