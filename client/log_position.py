"""A changelog reader's position: the next offset, and the leader epoch of the entry just below it.

After a loss of data (a bucket restored from an older snapshot, or led by an
out-of-sync replica after an unclean election) the bucket's log reuses offsets
for other changes. A reader that sends the epoch of the last entry it read with
its next fetch (``FetchLogRequest.last_fetched_epoch``, Kafka's KIP-320) is
refused with :class:`~kvlease.common.errors.DataLostError` instead of being served the
new changes under offsets it already read: the tablet server checks that its
log holds that epoch up to the offset. ``epoch`` None sends nothing (a position
from ``list_offsets`` of an empty log, an entry written without an epoch, or
a start the reader chose with nothing read before it): that fetch is not
checked, the following ones are.

**A bound fences as well.** ``epoch`` may also be the leader epoch of an entry
*above* ``offset`` in the same history, e.g. the one below the end of the
range a reader planned to read (a Spark split whose start's own epoch the
leader could not tell: a new leader not caught up yet). Only one leader
writes under an epoch and epochs only grow along a log, so on that history
the log holds the bound's epoch up to an offset past ``offset`` and the check
passes; after a loss that reused offsets below ``offset`` the log holds other
epochs there (the restore's or the unclean leader's, newer than the bound) and
the fetch is refused as with the exact epoch.

The tablet server does not demand an epoch: a fetch without one comes from a
reader that read nothing below its offset (``TableClient.fetch_log`` of an
offset the caller chose, an older client), and there is nothing of its reads
to fence. Every kvlease reader that goes on from entries it read or planned
sends one (``kvlease log``, the Spark source, ``fetch_log_from``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvlease.common.logentry import LogEntry


@dataclass(frozen=True)
class LogPosition:
    """``offset``: the next changelog offset to read; ``epoch``: the leader epoch of the entry below it as
    read, or a bound of it (see the module docstring; None: unknown, not checked)."""

    offset: int
    epoch: int | None = None

    def after(self, entries: Sequence[LogEntry]) -> "LogPosition":
        """The position after reading ``entries`` (a fetch's answer from here; none: unchanged)."""
        if not entries:
            return self
        last = entries[-1]
        return LogPosition(last.next_offset, last.leader_epoch if last.leader_epoch >= 0 else None)
