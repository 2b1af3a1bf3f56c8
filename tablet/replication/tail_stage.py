"""A rebuild's changelog tail made ready while the snapshot downloads: its changelog and its RocksDB writes.

A rebuilt replica must hold its leader's log from the snapshot's offset on and
RocksDB must apply it (``tablet/replication/rebuild.py``). Done after the
install, the tail's append (written, fsynced) and its apply are on the
rebuild's critical path. A :class:`TailStager` does both while the download
runs, on a thread of its own, one answer of the tail prefetch at a time as
they arrive (``tablet/replication/tail_prefetch.py``), in the rebuild's own
directory:

- the **changelog**: a new changelog starting at the snapshot's offset holding
  the entries byte for byte (``snapshot_install.start_log``, appended and
  fsynced as a follower appends them), with their leader epochs: the install
  moves it in instead of an empty one;
- the **write** of each answer's records (``KvStore.prepare_records``: the
  WriteBatch the follower's apply would build, in log order): committed in
  order once the replica's files are open, instead of decoding and applying
  the records after the install. An answer whose records cannot be prepared
  (a put without a value) ends the writes there: the records from it on are
  applied from the log (where the apply refuses them as ever).

Staging starts once the prefetched tail holds ``min_bytes``: a small tail is
appended and applied after the install as before (:meth:`TailStager.finish`
returns None). Any error ends the staging (logged): the rebuild then appends
and applies the whole tail itself.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
from dataclasses import dataclass

from kvlease.common.errors import KvLeaseError
from kvlease.common.fsync import fsync_path
from kvlease.common.logentry import checked_header, decode_entry
from kvlease.tablet.log.epochs import EpochCache
from kvlease.tablet.store import snapshot_install
from kvlease.tablet.store.kvstore import KvStore, PreparedWrite
from kvlease.tablet.store.snapshot_install import StagedLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedRecords:
    """The write of the records ``from_offset`` … ``next_offset - 1`` (``KvStore.prepare_records``)."""

    from_offset: int
    next_offset: int
    write: PreparedWrite


@dataclass(frozen=True)
class StagedTail:
    """The first ``count`` entries of a prefetched tail (records ``from_offset`` … ``next_offset - 1``),
    staged: ``log`` to install, ``writes`` to commit in order (records they lack are applied from the log)."""

    count: int
    from_offset: int
    next_offset: int
    log: StagedLog
    writes: tuple[PreparedRecords, ...]


class TailStager:
    """Stages the entries :meth:`add` is given in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str, from_offset: int, *, segment_bytes: int, fsync: bool, min_bytes: int) -> None:
        self.directory, self.from_offset = directory, from_offset
        self.segment_bytes, self.fsync, self.min_bytes = segment_bytes, fsync, min_bytes
        self._waiting: list[bytes] = []  # entries held back until min_bytes is reached
        self._bytes = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._changelog = None
        self._epochs = EpochCache()
        self._count, self._next = 0, from_offset
        self._writes: list[PreparedRecords] = []
        self._write_gap: int | None = None  # the offset from which no write is prepared (one could not be)
        self._failed: BaseException | None = None

    def add(self, entries: list[bytes]) -> None:
        """The next entries of the tail (the prefetch's thread): staged on the stager's own thread."""
        self._waiting += entries
        self._bytes += sum(map(len, entries))
        if self._bytes < self.min_bytes:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rebuild-tail-stage", daemon=True)
            self._thread.start()
        self._queue.put(self._waiting)
        self._waiting = []

    def finish(self) -> StagedTail | None:
        """Wait for what was added to be staged and make it durable; the staged tail, or None (nothing staged,
        or the staging failed: ``directory`` is removed then)."""
        if self._thread is None:
            return None
        self._queue.put(None)
        self._thread.join()
        try:
            if self._changelog is not None:
                self._changelog.close()
            if self._failed is None and self._count and self.fsync:  # the files were synced as they were staged
                for path in (os.path.join(self.directory, "log"), self.directory):
                    fsync_path(path)
        except Exception as exc:  # noqa: BLE001 - appended and applied after the install instead
            self._failed = exc
        if self._failed is not None or not self._count:
            if self._failed is not None:
                log.warning("staging the rebuild's changelog tail in %s failed (it is appended and applied after "
                            "the install): %s", self.directory, self._failed)
            shutil.rmtree(self.directory, ignore_errors=True)
            return None
        epochs = tuple((e.epoch, e.start_offset) for e in self._epochs.entries)
        return StagedTail(self._count, self.from_offset, self._next,
                          StagedLog(os.path.join(self.directory, "log"), epochs), tuple(self._writes))

    def _run(self) -> None:
        while (entries := self._queue.get()) is not None:
            if self._failed is None:
                try:
                    self._stage(entries)
                except Exception as exc:  # noqa: BLE001 - reported by finish
                    self._failed = exc

    def _stage(self, entries: list[bytes]) -> None:
        headers = [checked_header(frame) for frame in entries]
        if self._changelog is None:
            os.makedirs(self.directory, exist_ok=True)
            self._changelog = snapshot_install.start_log(os.path.join(self.directory, "log"), self.from_offset,
                                                         segment_bytes=self.segment_bytes, fsync=self.fsync)
        pending = self._changelog.write_raw(entries, headers)
        self._changelog.sync(pending)  # durable as it is staged: the waits overlap the download, not follow it
        self._changelog.publish(pending)
        for header in headers:  # as the follower's epoch file notes them on append (tablet/log/epoch_file.py)
            if header.leader_epoch >= 0 and header.leader_epoch != self._epochs.latest_epoch:
                self._epochs.assign(header.leader_epoch, header.base_offset)
        end = headers[-1].base_offset + headers[-1].count
        if self._write_gap is None:  # each write starts where the one before ends (committed after it)
            try:
                write = KvStore.prepare_records([decode_entry(frame).records for frame in entries], self.directory)
                self._writes.append(PreparedRecords(self._next, end, write))
            except KvLeaseError as exc:  # a put without a value: the apply from the log says so
                log.info("the rebuild's tail from offset %d is applied from the log: %s", self._next, exc)
                self._write_gap = self._next
        self._count += len(entries)
        self._next = end
