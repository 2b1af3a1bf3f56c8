"""A changelog reader's position: the next offset, and the leader epoch of the entry just below it.

After a loss of data (a bucket restored from an older snapshot, or led by an
out-of-sync replica after an unclean election) the bucket's log reuses offsets
for other changes. A reader that sends the epoch of the last entry it read with
its next fetch (``FetchLogRequest.last_fetched_epoch``, Kafka's KIP-320) is
refused with :class:`~common.errors.DataLostError` instead of being served the
new changes under offsets it already read: the tablet server checks that its
log holds that epoch up to the offset. ``epoch`` None sends nothing (a position
from ``list_offsets`` of an empty log, an entry written without an epoch, or
an old checkpoint): that fetch is not checked, the following ones are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from common.logentry import LogEntry


@dataclass(frozen=True)
class LogPosition:
    """``offset``: the next changelog offset to read; ``epoch``: the leader epoch of the entry below it as
    read (None: unknown, not checked)."""

    offset: int
    epoch: int | None = None

    def after(self, entries: Sequence[LogEntry]) -> "LogPosition":
        """The position after reading ``entries`` (a fetch's answer from here; none: unchanged)."""
        if not entries:
            return self
        last = entries[-1]
        return LogPosition(last.next_offset, last.leader_epoch if last.leader_epoch >= 0 else None)
