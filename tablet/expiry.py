"""The row TTL deleter: a tablet server's background rounds that delete the expired rows of the buckets it leads.

Every ``row-ttl.check-interval`` a round reads at most
``row-ttl.max-rows-per-check`` rows, over the led buckets of tables with a
row TTL (common/row_ttl.py), each bucket from where its last round stopped
(a cursor per bucket; past its last row it starts over), the buckets in
turn from the one after the bucket the last round ended in. The expired
rows it finds are deleted through the bucket's normal write path
(:meth:`kvlease.tablet.bucket.writes.BucketWrites.write` with an
:class:`~kvlease.tablet.bucket.expiry_deletes.ExpiredOnly` condition): -D
records in the changelog, which the followers fetch and apply like any other,
so every replica, snapshot and change-feed copy drops the row too. A key
written again since the round read it is kept (the condition is judged under
the write lock). Only a leader deletes: a follower's replica is not in
:meth:`ReplicaManager.replicas`, and a leadership lost during a round makes
its delete fail (NotLeaderError), which the round skips; the new leader's
rounds take over (from the start of the bucket: cursors are per server).

Work per second is thus at most ``max-rows-per-check / check-interval`` rows
read, and as many deleted.
"""

from __future__ import annotations

import logging
import time
from itertools import islice
from typing import Callable

from kvlease.common import errors
from kvlease.common.row_expiry import expired_mask
from kvlease.tablet.bucket.expiry_deletes import ExpiredOnly
from kvlease.tablet.periodic import Periodic
from kvlease.tablet.store.kvstore import BucketStoreError

log = logging.getLogger(__name__)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class ExpiryRounds(Periodic):
    """See the module docstring. ``replicas``: the server's ReplicaManager; ``notify()``: wake the followers'
    fetches and clients' FetchLog long polls after a delete was appended; ``clock_ms``: now, in ms since the epoch."""

    name = "row-ttl"

    def __init__(self, interval_s: float, max_rows: int, replicas, notify: Callable[[], None] = lambda: None,
                 clock_ms: Callable[[], int] = _wall_ms) -> None:
        super().__init__(interval_s)
        self.max_rows = max_rows
        self.replicas = replicas
        self.notify = notify
        self.clock_ms = clock_ms
        #: Per led bucket (physical id, bucket): the key its next round starts at (None: its first).
        self.cursors: dict[tuple[int, int], bytes | None] = {}
        self._last: tuple[int, int] | None = None  # the bucket the last round ended in
        #: Rows read and deleted by the last round (tests, logs).
        self.last_round: tuple[int, int] = (0, 0)

    def run_once(self) -> int:
        """One round; returns the rows it deleted."""
        led = [r.key for r in self.replicas.replicas() if r.table.row_ttl is not None]
        self.cursors = {key: self.cursors.get(key) for key in led}
        if self._last is not None:  # start after the bucket the last round ended in
            after = [key for key in led if key > self._last]
            led = after + [key for key in led if key <= self._last]
        budget, read, deleted = self.max_rows, 0, 0
        for key in led:
            if budget <= 0:
                break
            try:
                examined, removed = self._bucket(key, budget)
            except (errors.KvLeaseError, BucketStoreError) as exc:  # not leading now, closed, failed: next round
                log.debug("row TTL round skipped bucket %s: %s", key, exc)
                continue
            self._last = key
            budget -= examined
            read += examined
            deleted += removed
        self.last_round = (read, deleted)
        if deleted:
            log.info("row TTL round: %d rows read, %d expired rows deleted", read, deleted)
        return deleted

    def _bucket(self, key: tuple[int, int], budget: int) -> tuple[int, int]:
        """Read up to ``budget`` rows of one led bucket from its cursor and delete the expired ones:
        ``(rows read, rows deleted)``."""
        with self.replicas.leading(*key) as replica:
            store = replica.store
            codec = store.codec
            ttl = codec.table.row_ttl
            if ttl is None:
                return 0, 0
            lead = replica.leadership()
            if lead is not None:
                lead.check_write(None)  # deletes need the in-sync replicas a write needs
            now = self.clock_ms()
            with store.snapshot() as snapshot:
                rows = list(islice(store.iter_rows(snapshot, self.cursors.get(key)), budget))
            self.cursors[key] = rows[-1][0] + b"\x00" if len(rows) == budget else None  # else: over, start again
            if not rows:
                return 0, 0
            expired = expired_mask(ttl, codec.decode_values([value for _key, value in rows]), now)
            keys = [k for (k, _value), gone in zip(rows, expired.tolist()) if gone]
            if not keys:
                return len(rows), 0
            base, end = store.writes.write(None, codec.decode_keys(keys), only_if=ExpiredOnly(codec, ttl, now))
            if end > base:
                if lead is not None:
                    lead.appended()
                self.notify()  # followers' fetches, clients' FetchLog long polls
            return len(rows), end - base
