"""What a live scan session holds besides the scanner manager's books, and how it reads its batches.

A :class:`ScanSession` owns its RocksDB snapshot
(:class:`~kvlease.tablet.store.kvstore.KvSnapshot`: a seekable iterator, a forward-only
values iterator and the log offset), the reader of its next batch, where it
has read to, its read-ahead, and how to answer its last call again
(:class:`Served`). :mod:`kvlease.tablet.scan.service` creates and frees sessions and
holds ``lock`` while it calls these methods.

Read-ahead: once a unary call is answered with more rows to come, the next
batch is built in the background with the same batch size, so the client's
next call finds it ready (streams need none: gRPC's flow control keeps the
stream's own thread ahead). A call with another size or row cap drops it and
seeks the iterator back after the last key served; the session then reads
with :func:`~kvlease.tablet.scan.batch.read_batch` on that iterator, because the
values iterator (:class:`~kvlease.tablet.scan.batch.ValueReader`, the faster one,
used until then) cannot go back.

Replays and memory: a replay of the last call reads its batch again from the
snapshot's seekable iterator (same start key, budget and row cap: the same
rows, the same bytes), so a session holds at most one batch of its own, the
one read ahead, plus at most one chunk of values read past it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from kvlease.common.model import TableBucket
from kvlease.tablet.scan import batch as scan_batch
from kvlease.tablet.scan import wire as scan_wire
from kvlease.tablet.store.kvstore import KvSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """A call answered, and how to answer it again: its batch starts after key ``after`` and was read
    with ``budget`` and ``max_rows``. ``answer`` is kept only for the batch a session ends with (its
    snapshot is then gone)."""

    call: int
    after: bytes
    budget: int
    max_rows: int | None
    answer: scan_wire.Answer | None


@dataclass(eq=False)
class ScanSession:
    """What a session holds besides the manager's books."""

    bucket: TableBucket
    limit: int | None
    stream: bool
    owner: str | None = None  # the principal that opened it (None: security off)
    lock: threading.RLock = field(default_factory=threading.RLock)
    released: threading.Event = field(default_factory=threading.Event)
    snapshot: KvSnapshot | None = None
    reader: scan_batch.ValueReader | None = None  # forward reads (None: read_batch on the snapshot's
    # iterator, which is then kept positioned after read_to)
    last: Served | None = None  # the last call answered: for a replay
    rows: int = 0  # rows answered
    resume_key: bytes = b""  # the last key answered
    read_to: bytes = b""  # the last key read from the snapshot (answered or read ahead)
    ahead_token: object | None = None  # the read-ahead scheduled (None: none, or it is cancelled)
    ahead: tuple[tuple, scan_wire.Answer | None] | None = None  # ((call, budget, max_rows), batch or failed)
    keep: Callable[[scan_batch.Batch, int | None], scan_batch.Batch] | None = None  # row TTL: ttl_filter.py

    def build(self, sid: bytes, budget: int, max_rows: int | None,
              log_offset: int | None = None) -> scan_wire.Answer:
        """The next batch from the session's iterator, serialized (hold ``lock``)."""
        it = self.snapshot.seekable()
        if self.reader is not None:
            batch = self.reader.read(self.snapshot.values(), it, budget, max_rows)
        else:
            batch = scan_batch.read_batch(it, budget, max_rows)
        del it  # no iterator reference outlives the batch: closing the snapshot frees it
        if batch.count:
            self.read_to = batch.last_key
        if self.keep is not None:
            batch = self.keep(batch, max_rows)
        return scan_wire.answer(batch, scanner_id=sid if batch.has_more and not self.stream else b"",
                                log_offset=log_offset)

    def read_again(self, sid: bytes, last: Served) -> scan_wire.Answer:
        """``last``'s batch built again; the iterator then goes back to where it was (hold ``lock``)."""
        it = self.snapshot.seekable()
        it.seek(last.after + b"\x00")
        batch = scan_batch.read_batch(it, last.budget, last.max_rows)
        it.seek(self.read_to + b"\x00")
        del it
        if self.keep is not None:
            batch = self.keep(batch, last.max_rows)
        return scan_wire.answer(batch, scanner_id=sid if batch.has_more else b"")

    def book(self, call: int, budget: int, max_rows: int | None, answer: scan_wire.Answer) -> None:
        """Call ``call`` was answered with ``answer`` (read with ``budget`` and ``max_rows``)."""
        self.last = Served(call, self.resume_key, budget, max_rows, answer)
        self.rows += answer.record_count
        if answer.record_count:
            self.resume_key = answer.resume_key

    def take_ahead(self, call: int, budget: int, max_rows: int | None) -> tuple[scan_wire.Answer | None, str | None]:
        """The batch read ahead, if it is call ``call``'s with this budget and cap, and ``"used"``; else
        None and ``"dropped"`` (the session is rewound) or None (nothing was read ahead). A queued
        read-ahead stays idle from now on (hold ``lock``)."""
        ahead, self.ahead, self.ahead_token = self.ahead, None, None
        if ahead is None:
            return None, None
        key, answer = ahead
        if key == (call, budget, max_rows) and answer is not None:
            return answer, "used"
        self.rewind()  # read ahead for another size: back after the last key answered
        return None, "dropped"

    def rewind(self) -> None:
        """Back to after the last key answered (a read-ahead was dropped; hold ``lock``): from here on
        ``read_batch`` on the seekable iterator, as the values iterator cannot go back."""
        self.reader = None
        it = self.snapshot.seekable()
        it.seek(self.resume_key + b"\x00")
        del it
        self.read_to = self.resume_key

    def read_ahead(self, sid: bytes, token: object, call: int, budget: int, max_rows: int | None) -> None:
        """Build call ``call``'s batch ahead (on the service's pool), unless the call came first (it took
        ``token``) or the session ended; a failure leaves it for the call to build again."""
        with self.lock:
            if self.ahead_token is not token or self.snapshot is None:
                return  # the call came first, or the session ended
            self.ahead_token = None
            try:
                answer = self.build(sid, budget, max_rows)
            except Exception:  # the call builds it again (and answers the error)
                log.debug("read-ahead of %s failed", self.bucket, exc_info=True)
                answer = None
            self.ahead = ((call, budget, max_rows), answer)

    def free(self) -> bool:
        """Drop the snapshot, reader and read-ahead (hold ``lock``); True if a snapshot was closed."""
        snapshot, self.snapshot = self.snapshot, None
        self.ahead_token = self.ahead = self.reader = None  # the reader holds the store
        if snapshot is None:
            return False
        snapshot.close()
        return True
