"""A table's changelog offsets per bucket (ListOffsets): the kept range, a start found by time, and the
positions a reader starts from (an offset with the leader epoch of the entry below it).

:class:`LogOffsets` is a part of :class:`kvlease.client.table.TableClient` (it uses the client's router, retry
policy and ``send``). A position's epoch fences the reader's first fetch from there
(``client/log_position.py``): after a loss of data reused offsets below it, the fetch is refused with
DataLostError instead of serving other changes under them. The epochs are answered by each bucket's leader
from its epoch cache, without a log read.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from kvlease.client.log_position import LogPosition
from kvlease.client.routing import REROUTE
from kvlease.client.transport import arguments
from kvlease.common import errors
from kvlease.common.errors import show
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.wire import error_from_pb


class LogOffsets:
    """ListOffsets of a :class:`kvlease.client.table.TableClient`."""

    def list_offsets(self, buckets: Iterable[int] | None = None,
                     timestamp: int | None = None) -> dict[int, tuple[int, int]] | dict[int, int]:
        """Changelog offsets per bucket, one request per tablet server.

        Without ``timestamp``: ``{bucket: (earliest, latest)}``, the first
        offset kept and the next offset to be assigned. With ``timestamp``
        (int ms since the epoch, >= 0): ``{bucket: offset}``, the first offset
        whose changelog entry was appended at or after it; the earliest kept
        offset if the time is before everything kept, the end offset (latest)
        if nothing is that new. Entries written before format version 2 have
        no time and count as older than any. Raises InvalidRequestError for a
        timestamp that is not a non-negative int.
        """
        if timestamp is not None and (not isinstance(timestamp, (int, np.integer)) or isinstance(timestamp, bool)
                                      or timestamp < 0):
            raise errors.InvalidRequestError(f"timestamp must be an int of ms since the epoch (>= 0), "
                                             f"got {show(timestamp)}")
        answers = self._list_offsets(buckets, timestamp)
        if timestamp is None:
            return {b: (o.earliest, o.latest) for b, o in answers.items()}
        return {b: o.timestamp_offset for b, o in answers.items()}

    def end_positions(self, buckets: Iterable[int] | None = None) -> dict[int, LogPosition]:
        """``{bucket: LogPosition}``: the end of each bucket's log (``latest`` of :meth:`list_offsets`) and
        the leader epoch of the entry below it, for a reader that goes on from there
        (:meth:`fetch_log_from`; the epoch is None for an empty log or a server that does not tell it)."""
        return {b: LogPosition(o.latest, o.end_epoch if o.HasField("end_epoch") else None)
                for b, o in self._list_offsets(buckets, None).items()}

    def positions(self, offsets: Mapping[int, int]) -> dict[int, LogPosition]:
        """``{bucket: LogPosition}`` at the given ``{bucket: offset}``: each with the leader epoch of the
        entry just below it, for a reader that starts there (:meth:`fetch_log_from`). The epoch is None
        where nothing committed is below the offset (at or below the log's start: a reader starting there
        read nothing of this log; above the end: not committed yet) or the server does not tell it."""
        epochs = self.epochs_at({b: [o] for b, o in offsets.items()})
        return {b: LogPosition(o, epochs[b][o]) for b, o in sorted(offsets.items())}

    def epochs_at(self, offsets: Mapping[int, Iterable[int]]) -> dict[int, dict[int, int | None]]:
        """``{bucket: {offset: epoch}}``: the leader epoch of the entry just below each offset (as
        :meth:`positions`), several offsets of a bucket in one request (a range cut into pieces)."""
        wanted = {b: sorted(set(int(o) for o in at)) for b, at in offsets.items()}
        answers = self._list_offsets(wanted, None, wanted)
        out: dict[int, dict[int, int | None]] = {b: dict.fromkeys(at) for b, at in wanted.items()}
        for b, o in answers.items():
            out[b].update((e.offset, e.epoch if e.HasField("epoch") else None)
                          for e in o.epochs_at if e.offset in out[b])
        return out

    def _list_offsets(self, buckets: Iterable[int] | None, timestamp: int | None,
                      epochs_at: Mapping[int, list[int]] | None = None) -> dict[int, Any]:
        """``{bucket: BucketOffsetsPb}`` in bucket order, one request per tablet server; ``epochs_at``:
        offsets per bucket to tell the epoch below (``BucketOffsetsPb.epochs_at``)."""
        pending = set(range(self.table.buckets) if buckets is None else buckets)
        for bucket in pending:
            self.physical.check_bucket(bucket)
        result: dict = {}

        def attempt():
            routing = self.physical.routing()
            for address, group in self.physical.by_leader(routing, pending).items():
                with arguments("list_offsets"):
                    at = [pb.BucketOffsetPb(bucket=b, offset=o) for b in group for o in (epochs_at or {}).get(b, ())]
                    request = pb.ListOffsetsRequest(table_id=self.table.table_id, partition_id=self.table.partition_id,
                                                    buckets=group, epochs_at=at,
                                                    timestamp=None if timestamp is None else int(timestamp))
                response = self.send(routing, address, "ListOffsets", request, idempotent=True, buckets=group)
                first_error = None
                for o in response.offsets:
                    if o.error.code:
                        first_error = first_error or error_from_pb(o.error)
                    elif o.bucket not in pending:
                        continue
                    elif timestamp is None or o.HasField("timestamp_offset"):
                        result[o.bucket] = o
                        pending.discard(o.bucket)
                    else:  # a server from before ListOffsets took a timestamp
                        raise errors.UnknownServerError(
                            f"tablet server {address} does not support ListOffsets by timestamp (bucket "
                            f"{o.bucket}); upgrade it", bucket=o.bucket)
                if first_error is not None:
                    if isinstance(first_error, REROUTE):
                        self.physical.stale(routing)
                    raise first_error
            return result

        return dict(sorted(self.retry.call(attempt).items()))
