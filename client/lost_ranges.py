"""A changelog reader's guard against offsets reused after a loss of data (docs/architecture.md, "The changelog").

A bucket restored from an older snapshot, or led by an out-of-sync replica
after an unclean election, gives new changes the offsets from the loss's
``from_offset`` on (:mod:`kvlease.common.data_loss`). A reader (a streaming query)
keeps, per bucket, its position (the next offset it reads) and how many of the
bucket's loss records it has seen. :meth:`LostRanges.check` fails with
:class:`~kvlease.common.errors.DataLostError` naming the range it read that was lost
when a loss it has not seen starts below its position; a loss at or past its
position is adopted silently (nothing it read was reused).
"""

from __future__ import annotations

import time
from typing import Mapping

from kvlease.common import errors
from kvlease.common.data_loss import RESTORE, DataLoss, resolved_count, unseen_loss


def lost_message(table: str, bucket: int, loss: DataLoss, position: int) -> str:
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(loss.at_ms / 1000))
    how = (f"the bucket was restored from snapshot {loss.snapshot_id}" if loss.kind == RESTORE and loss.snapshot_id
           else "the bucket was restored empty (no snapshot was kept)" if loss.kind == RESTORE
           else f"tablet server {loss.leader}, out of sync, was elected its leader (unclean election)")
    return (f"bucket {bucket} of {table}: offsets {loss.from_offset}..{position - 1} this query read were lost when "
            f"{how} at {at}; start the query again from a new checkpoint")


class LostRanges:
    """Checks positions against one table's loss records (``admin``: anything with ``get_table_assignment``)."""

    def __init__(self, admin, table_id: int, table_path: str) -> None:
        self.admin = admin
        self.table_id = table_id
        self.table_path = table_path

    def check(self, positions: Mapping[int, int], seen: Mapping[int, int]) -> dict[int, int]:
        """``positions``: bucket -> the next offset read (< 0: not started); ``seen``: bucket -> loss records
        seen (absent: 0). Returns bucket -> loss records seen now; DataLostError as the module says."""
        _table, leaders = self.admin.get_table_assignment(self.table_id)
        return check_losses(self.table_path, {b: leaders[b].losses for b in positions if b in leaders}, positions,
                            seen)


def check_losses(table_path: str, losses: Mapping[int, tuple[DataLoss, ...]], positions: Mapping[int, int],
                 seen: Mapping[int, int]) -> dict[int, int]:
    """:meth:`LostRanges.check` on given loss records (pure)."""
    out = {}
    for bucket, position in sorted(positions.items()):
        records = tuple(losses.get(bucket, ()))
        loss = unseen_loss(records, seen.get(bucket, 0), position)
        if loss is not None:
            raise errors.DataLostError(lost_message(table_path, bucket, loss, position), table=table_path,
                                       bucket=bucket, from_offset=loss.from_offset, position=position, kind=loss.kind)
        out[bucket] = resolved_count(records)
    return out
