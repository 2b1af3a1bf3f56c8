"""Reading a bucket's changelog range ``[start, end)`` on an executor: as change rows, or as final key states.

The range is fetched through the table client (``FetchLog`` on the bucket's
leader, re-routed and retried there, also across a failover: offsets are the
same on every replica), entry by entry, cut at ``end``. A range that the
changelog no longer holds, or that it does not reach yet, is an error naming
the bucket and the offsets: a split never returns fewer rows than it was
planned for. "Not yet" is waited for within the client's retry policy first:
a leader that just took over may serve up to a high watermark a little behind
the one the split was planned by, until its followers' next fetches.

Every fetch is fenced by the leader epoch of the entry just below its offset
(``client/log_position.py``): the first by the epoch the split was planned
with (None: not checked), each later one by the last entry read. After a
restore or an unclean election reused offsets the split read (or was planned
to start after), the fetch fails with DataLostError and nothing of it is
returned: the split never hands on other changes under offsets it read.

The range's own entries are checked against the plan too: every entry below
``end`` was written under a leader epoch no newer than the one below ``end``
as planned (``end_epoch``; one leader writes under an epoch, and epochs only
grow along a log). An entry under a newer one means that the log below
``end`` is no longer the one planned: a loss reused offsets of the range for
other changes after the plan (a restore starting at or inside the range, an
out-of-sync replica elected). That fails with DataLostError naming the
offsets before the entry is handed on: a split never returns other rows than
the ones its range held when it was planned.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from kvlease.client.log_position import LogPosition
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.logentry import ChangeType, LogEntry

FETCH_BYTES = 4 << 20
_KEEP = pa.array([int(ChangeType.INSERT), int(ChangeType.UPDATE_AFTER), int(ChangeType.DELETE)], pa.int8())


class ChangelogRangeError(errors.NotFoundError):
    """The changelog does not hold the range a split needs (truncated, or not written yet)."""


class _NotReachedYet(errors.RetriableError):
    """The leader serves the changelog up to before the offset asked for (its high watermark)."""


def _fetch(table: TableClient, bucket: int, offset: int, epoch: int | None) -> list[LogEntry]:
    entries, log_end = table.fetch_log_entries(bucket, offset, FETCH_BYTES, last_fetched_epoch=epoch)
    if not entries:
        raise _NotReachedYet(f"table {table.table.path} bucket {bucket}: the changelog ends at {log_end}",
                             log_end=log_end)
    return entries


def read_entries(table: TableClient, bucket: int, start: int, end: int, start_epoch: int | None = None,
                 end_epoch: int | None = None) -> Iterator[LogEntry]:
    """The entries of ``[start, end)``, the last one cut at ``end``; ``start_epoch``: the leader epoch of the
    entry just below ``start``, ``end_epoch``: the one below ``end`` as planned (or bounds of them; None: not
    checked; see the module docstring)."""
    position = LogPosition(start, start_epoch)
    while position.offset < end:
        offset = position.offset
        try:
            entries = table.retry.call(_fetch, table, bucket, offset, position.epoch, retry_on=(_NotReachedYet,))
        except errors.InvalidRequestError as exc:  # the offset fell off the log's start
            raise ChangelogRangeError(f"table {table.table.path} bucket {bucket}: changelog records "
                                      f"{offset}..{end - 1} are no longer kept ({exc})") from None
        except _NotReachedYet as exc:
            raise ChangelogRangeError(f"{exc.message}, the split needs records up to {end - 1}") from None
        except errors.DataLostError as exc:  # the details do not travel: say where the fetch was refused
            raise errors.DataLostError(exc.message, **{**exc.details, "bucket": bucket, "position": offset}) from None
        for entry in entries:
            if entry.base_offset >= end:
                return
            if end_epoch is not None and entry.leader_epoch > end_epoch:
                raise _rewritten(table, bucket, entry, end, end_epoch)
            if entry.next_offset > end:
                entry = dataclasses.replace(entry, records=entry.records.slice(0, end - entry.base_offset))
            if entry.count:
                yield entry
        position = position.after(entries)


def _rewritten(table: TableClient, bucket: int, entry: LogEntry, end: int, end_epoch: int) -> errors.DataLostError:
    first = entry.base_offset
    return errors.DataLostError(
        f"bucket {bucket} of {table.table.path}: offsets {first}..{end - 1} were planned when the entry below "
        f"offset {end} had leader epoch {end_epoch}, but the bucket's log holds other changes there now (written "
        f"under leader epoch {entry.leader_epoch}): it was restored from an older snapshot or led by an "
        f"out-of-sync replica, and reuses them for other changes; start the reader again from a new position",
        bucket=bucket, from_offset=first, position=end)


def final_states(entries: Iterator[LogEntry]) -> dict[bytes, bytes | None]:
    """``encoded key -> value`` after the entries (None: deleted); before-images are skipped."""
    states: dict[bytes, bytes | None] = {}
    for entry in entries:
        records = entry.records
        types = records.column("change_type")
        kept = pc.is_in(types, value_set=_KEEP)
        records = records.filter(kept) if not pc.all(kept).as_py() else records
        deleted = pc.equal(records.column("change_type"), int(ChangeType.DELETE))
        values = pc.if_else(deleted, pa.scalar(None, pa.binary()), records.column("value"))
        states.update(zip(records.column("key").to_pylist(), values.to_pylist()))  # later records win
    return states
