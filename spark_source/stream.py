"""Streaming reads: bootstrap, then tail the changelog.

Offsets are JSON: ``{"table": table id, "lease": id, "owner": token,
"buckets": {"<b>": {"snapshot": id or -1, "offset": n, "losses": k}}}``.
``offset`` is the first changelog record of the bucket not yet read; ``-1`` means the bucket is not
bootstrapped yet. ``snapshot`` is the snapshot the bucket was bootstrapped
from in the micro-batch that ends at this offset (-1 in every later offset).
``table`` ties a checkpoint to the table it read: offsets are positions in
that table's changelogs only, so a query restarted from a checkpoint of
another table (the ``table`` option changed, or the table was dropped and
created again under its name) fails saying so instead of reading the new
table from the old positions. (Offsets written before ``table`` existed are
checked by their buckets only.) ``owner`` is the query's lease owner token,
made with the initial offset: every lease call of the query carries it, so a
restarted query goes on with its own lease while another reader naming the same
``lease.id`` is refused (offsets written before owners have none: an unowned
lease).

- ``initialOffset`` (full mode) only names the lease: every bucket at -1.
  The first ``latestOffset`` leases the latest snapshots and returns the end
  of the bootstrap (the snapshot ids and the offsets read at that moment).
  Spark logs that offset before it runs the batch, so a restarted query
  re-plans the very same bootstrap from its checkpoint, under the same lease,
  whatever ``initialOffset`` would say.
- ``partitions(start, end)``: a bucket at -1 in ``start`` reads its hybrid
  split (snapshot + changelog to ``end``); any other reads ``[start, end)``.
  Both ``latestOffset`` (from ``start``) and ``partitions`` (up to ``end``,
  with the loss records ``end`` has seen) fail with DATA_LOST if a loss of
  data reused offsets below: a batch Spark planned before the loss and runs
  again after it (the query died in it) would read other changes under the
  planned offsets. (``"losses"`` per bucket: the loss records seen, see
  ``client/lost_ranges.py``.)
  ``"epoch"`` per bucket (absent when not known): the leader epoch of the
  entry just below ``offset``, from ListOffsets: its end's epoch when the end
  was planned at the log's end, else asked for the offset (``epochs_at``: an
  end cut by ``maxRowsPerTrigger`` or Trigger.AvailableNow, a ``startup.mode``
  latest or timestamp start; a start at the log's start has nothing below);
  where the leader cannot tell it (above its high watermark), the epoch
  below the log's end the plan read, a bound (``client/log_position.py``).
  The first fetch of the next micro-batch's split sends it, later fetches the
  last entry's (``spark_source/changelog.py``); when ``split.max-rows`` cuts a
  range in pieces, each later piece starts with the epoch below its start,
  asked when the batch is planned (the end's where the leader cannot tell
  it). Every entry a split reads must be under an epoch no newer than the
  end's. A restore or unclean election between planning and reading, or
  while a split reads, fails the split with DATA_LOST instead of reading
  other changes under offsets the query read or planned. Epochs are asked
  before the plan's loss check (``_end_epochs`` says why). An offset written
  before ``epoch`` existed (an older checkpoint) starts with the epoch below
  the end of the batch that starts there (asked so, if the end lacks it too).
  Planning a bootstrap makes sure the lease still holds its snapshots (renew,
  or re-acquire the same snapshots under the same id after an expiry) and
  starts the renewal thread: every third of ``lease.duration`` until the
  bootstrap is committed. If a snapshot is gone, the query fails naming the lease.
- ``commit(end)`` releases the buckets ``end`` bootstrapped (idempotent: a late
  or repeated commit releases nothing more) and stops renewing when none is left.
  Spark commits a micro-batch's end only when it plans the next one, so the
  offset after a bootstrap differs from it (snapshot ids cleared) even when no
  change came in: one micro-batch, possibly empty, follows every bootstrap.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from kvlease.client.admin import AdminClient
from kvlease.client.log_position import LogPosition
from kvlease.client.lost_ranges import LostRanges
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.spark_source.enumerator import acquire_latest, fence_pieces, give_back, log_splits_for, start_positions
from kvlease.spark_source.options import Options, connect, open_table
from kvlease.spark_source.reader import names_table, read_split
from kvlease.spark_source.splits import HybridSplit, ReadContext

log = logging.getLogger(__name__)
NOT_STARTED = -1


class LeaseLostError(errors.SnapshotNotFoundError):
    """A streaming query's lease expired and the snapshots it was bootstrapping from were reclaimed."""


@dataclass(frozen=True)
class LeaseRef:
    """A streaming query's lease: its id and the owner token its calls carry."""

    lease_id: str
    owner: str | None


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options, ctx: ReadContext) -> None:
        self.options = options
        self.ctx = ctx
        self._clients: tuple[AdminClient, TableClient] | None = None
        self._target: dict[int, LogPosition] | None = None  # Trigger.AvailableNow: offsets not to read past
        self._renewer: Renewer | None = None

    def __getstate__(self) -> dict:  # Spark pickles the reader for read(); clients and threads stay here
        return {"options": self.options, "ctx": self.ctx, "_clients": None, "_target": None, "_renewer": None}

    # -- clients ---------------------------------------------------------------------------------

    def _connect(self) -> tuple[AdminClient, TableClient]:
        if self._clients is None:
            admin = connect(self.ctx.bootstrap, self.ctx.security)
            self._clients = admin, open_table(admin, self.ctx.table.table_id, self.ctx.security)
        return self._clients

    def stop(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
        if self._clients is not None:
            admin, table = self._clients
            self._clients = None
            table.close()
            admin.close()

    # -- offsets ---------------------------------------------------------------------------------

    @names_table
    def initialOffset(self) -> dict:
        buckets = range(self.ctx.table.buckets)
        if self.options.startup_mode == "full":
            owner = uuid.uuid4().hex
            lease = LeaseRef(self.options.lease_id or f"spark-stream-{owner}", owner)
            return self._offset(lease, {b: (-1, NOT_STARTED) for b in buckets})
        admin, table = self._connect()
        seen = self._check_losses(admin, {}, {b: (-1, NOT_STARTED) for b in buckets})  # a new query adopts them
        # with the epoch below each start, the first fetch's fence; asked after the adoption: a loss before
        # the ask moves start and epoch to the new history alike (nothing was read yet), one after it is
        # the next plan's loss check's and the fenced fetch's
        starts = start_positions(table, self.options)
        return _offset(None, {b: (-1, starts[b].offset) for b in buckets}, self.ctx.table.table_id, seen,
                       {b: p.epoch for b, p in starts.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger:
            return ReadMaxRows(self.options.max_rows_per_trigger)
        return ReadAllAvailable()

    @names_table
    def prepareForTriggerAvailableNow(self) -> None:
        _, table = self._connect()
        self._target = table.end_positions()

    @names_table
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        lease, starts = self._parse(start)
        admin, table = self._connect()
        positions = table.end_positions()
        latest = {b: p.offset for b, p in positions.items()}
        target = self._target or {}
        if self._target is not None:
            latest = {b: min(latest[b], target[b].offset if b in target else latest[b]) for b in latest}
        known = ({b: LogPosition(o, e) for b, ((_, o), e) in _with_epochs(starts, start).items()}, positions, target)
        if any(offset == NOT_STARTED for _, offset in starts.values()):
            seen = self._check_losses(admin, start, starts)  # DATA_LOST: offsets it read were reused
            return self._bootstrap_end(admin, table, lease, starts, latest, seen, known)
        ends = {b: max(starts[b][1], latest[b]) for b in starts}
        if isinstance(limit, ReadMaxRows):
            ends = _limited({b: o for b, (_, o) in starts.items()}, ends, limit.max_rows)
        new = any(ends[b] != starts[b][1] or snapshot != -1 for b, (snapshot, _) in starts.items())
        epochs = _end_epochs(table, ends, *known) if new else {}  # before the loss check: see _end_epochs
        seen = self._check_losses(admin, start, starts)  # DATA_LOST: offsets it read were reused
        if not new:
            return start  # nothing new: no micro-batch
        # Right after a bootstrap this is a new offset even with no new data: Spark commits a batch's
        # end to the source only when it plans the next one, and that commit releases the lease.
        return _offset(lease, {b: (-1, ends[b]) for b in starts}, self.ctx.table.table_id, seen, epochs)

    def _check_losses(self, admin: AdminClient, start: dict, starts: dict) -> dict[int, int]:
        """The loss records of each bucket this query has seen now; DataLostError if one it had not seen
        reused offsets it read (``client/lost_ranges.py``)."""
        table = self.ctx.table
        return LostRanges(admin, table.table_id, table.path).check({b: o for b, (_, o) in starts.items()},
                                                                   _losses_seen(start))

    def _bootstrap_end(self, admin: AdminClient, table: TableClient, lease: LeaseRef | None, starts: dict,
                       latest: dict[int, int], seen: dict[int, int], known: tuple) -> dict:
        """The end of the bootstrap micro-batch: lease the latest snapshots (the whole bootstrap is one
        micro-batch, whatever the read limit)."""
        lease = _named(lease)
        held = acquire_latest(admin, table.table, lease.lease_id, self.options, owner=lease.owner)
        ends = {}
        for b, (_, offset) in starts.items():
            if offset != NOT_STARTED:
                ends[b] = (-1, max(offset, latest[b]))
            elif b in held:
                ends[b] = (held[b].snapshot_id, max(held[b].log_offset, latest[b]))
            else:
                ends[b] = (-1, latest[b])
        if held:
            try:
                self._renew(lease, {b: held[b].snapshot_id for b in held})
            except BaseException:  # the offset is not logged: nothing would ever read or release the lease
                give_back(admin, table.table, lease.lease_id, held, lease.owner)
                raise
        return _offset(lease, ends, self.ctx.table.table_id, seen,
                       _end_epochs(table, {b: o for b, (_, o) in ends.items()}, *known))

    def _offset(self, lease: LeaseRef | None, buckets: dict[int, tuple[int, int]]) -> dict:
        return _offset(lease, buckets, self.ctx.table.table_id)

    def _parse(self, offset: dict) -> tuple[LeaseRef | None, dict[int, tuple[int, int]]]:
        """``offset``'s lease and buckets; InvalidRequestError if it is not an offset of this table."""
        table_id, lease, buckets = _parse(offset)
        table = self.ctx.table
        if table_id is not None and table_id != table.table_id:
            raise errors.InvalidRequestError(
                f"this query's checkpoint was written for table id {table_id}, but table {table.path} is now table "
                f"id {table.table_id} (the table was dropped and created again, or the query's 'table' option "
                f"changed): its offsets are not positions in this table's changelog; start the query with a new "
                f"checkpoint location")
        if set(buckets) != set(range(table.buckets)):
            raise errors.InvalidRequestError(
                f"this query's checkpoint has buckets {sorted(buckets)}, but table {table.path} has buckets "
                f"0..{table.buckets - 1}: the checkpoint is of another table; start the query with a new "
                f"checkpoint location")
        return lease, buckets

    # -- planning --------------------------------------------------------------------------------

    @names_table
    def partitions(self, start: dict, end: dict) -> list:
        _, starts = self._parse(start)
        lease, ends = self._parse(end)
        admin, table = self._connect()
        epochs = {b: e for b, (_, e) in _with_epochs(starts, start).items()}
        end_epochs = {b: e for b, (_, e) in _with_epochs(ends, end).items()}
        splits: list = []
        bootstrapping: dict[int, int] = {}
        ranges: dict[int, tuple[int, int]] = {}
        for b, (snapshot, end_offset) in ends.items():
            begin = starts.get(b, (-1, NOT_STARTED))[1]
            if begin == NOT_STARTED and snapshot != -1:
                bootstrapping[b] = snapshot
                lease = _named(lease)
                splits.append(HybridSplit(b, snapshot, end_offset, lease.lease_id, False, lease.owner, end_epochs[b]))
            else:
                ranges[b] = (max(begin, 0), end_offset)
        # a later piece's epoch (and an end's that the offset does not tell: a checkpoint written before epochs)
        # is asked before the loss check (see _end_epochs); the first piece's is the start's, else the end's
        pieces = fence_pieces(table, log_splits_for(ranges, self.options.split_max_rows), epochs, end_epochs)
        seen = self._check_losses(admin, end, ends)  # a batch planned before a loss: its range may be reused now
        splits.extend(dataclasses.replace(s, losses_seen=seen.get(s.bucket, 0)) for s in pieces)
        if bootstrapping:
            self._renew(_named(lease), bootstrapping)
        return splits

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return read_split(self.ctx, partition)

    @names_table
    def commit(self, end: dict) -> None:
        lease, ends = self._parse(end)
        done = [TableBucket(self.ctx.table.table_id, b) for b, (snapshot, _) in ends.items() if snapshot != -1]
        if not done or lease is None:
            return
        admin, _ = self._connect()
        try:  # idempotent: a late or second commit finds nothing held
            admin.release_lease(lease.lease_id, done, owner=lease.owner)
        except errors.KvLeaseError as exc:  # the data is committed; unrenewed, the lease expires by itself
            log.warning("could not release lease %s after its bootstrap committed (it expires within "
                        "lease.duration): %s", lease.lease_id, exc)
        if self._renewer is not None and self._renewer.lease == lease:
            self._renewer.stop()
            self._renewer = None

    # -- the lease -------------------------------------------------------------------------------

    def _renew(self, lease: LeaseRef, snapshots: dict[int, int]) -> None:
        """Make sure ``lease`` holds ``snapshots`` now, and keep renewing it until the bootstrap commits."""
        admin, _ = self._connect()
        if self._renewer is None or self._renewer.lease != lease or not self._renewer.alive:
            ensure_lease(admin, self.ctx.table, lease, snapshots, self.options.lease_duration_ms)
            if self._renewer is not None:
                self._renewer.stop()
            self._renewer = Renewer(admin, lease, self.options.lease_duration_ms)
        elif self._renewer.lost is not None:
            raise self._renewer.lost


def ensure_lease(admin: AdminClient, table, lease: LeaseRef, snapshots: dict[int, int], duration_ms: int) -> None:
    """Renew ``lease``; if it expired, acquire the same snapshots under the same id again. Raises
    :class:`LeaseLostError` naming the lease if any of them is gone, LeaseOwnedError if another reader
    took the lease id meanwhile."""
    wanted = {TableBucket(table.table_id, b): s for b, s in snapshots.items()}
    try:
        admin.renew_lease(lease.lease_id, duration_ms, owner=lease.owner)
        return
    except errors.LeaseNotFoundError:
        pass
    result = admin.acquire_lease(lease.lease_id, wanted, duration_ms, owner=lease.owner)
    if result.unavailable:
        if result.acquired:  # a bootstrap missing some snapshots cannot resume: hold nothing
            admin.release_lease(lease.lease_id, list(result.acquired), owner=lease.owner)
        gone = ", ".join(f"bucket {tb.bucket} snapshot {s}" for tb, s in sorted(result.unavailable.items()))
        raise LeaseLostError(
            f"table {table.path}: lease {lease.lease_id} of this streaming query expired and its snapshots were "
            f"reclaimed ({gone}); the bootstrap cannot resume: start the query again with a new checkpoint location",
            lease_id=lease.lease_id, table=table.path)


class Renewer:
    """A daemon thread renewing a lease every third of its duration until stopped."""

    def __init__(self, admin: AdminClient, lease: LeaseRef, duration_ms: int) -> None:
        self.lease = lease
        self.lost: errors.KvLeaseError | None = None
        self._admin = admin
        self._duration_ms = duration_ms
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvlease-renew-{lease.lease_id}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._duration_ms / 3000.0):
            try:
                self._admin.renew_lease(self.lease.lease_id, self._duration_ms, owner=self.lease.owner)
            except (errors.LeaseNotFoundError, errors.LeaseOwnedError) as exc:
                self.lost = exc
                log.error("lease %s expired before its bootstrap was committed: %s", self.lease.lease_id, exc)
                return
            except errors.KvLeaseError as exc:  # transient: try again next period
                log.warning("renewing lease %s failed, trying again: %s", self.lease.lease_id, exc)


# -- offsets as JSON ---------------------------------------------------------------------------------


def _offset(lease: LeaseRef | None, buckets: dict[int, tuple[int, int]], table_id: int,
            losses: dict[int, int] | None = None, epochs: dict[int, int | None] | None = None) -> dict:
    """``losses``: bucket -> the loss records of the bucket the query has seen (``"losses"`` in each bucket;
    absent, as in offsets written before it: 0); ``epochs``: bucket -> the leader epoch of the entry below
    its offset (``"epoch"``; absent when None)."""
    doc: dict = {"table": table_id, "lease": None if lease is None else lease.lease_id}
    if lease is not None and lease.owner is not None:
        doc["owner"] = lease.owner
    doc["buckets"] = {str(b): {"snapshot": s, "offset": o} for b, (s, o) in sorted(buckets.items())}
    for b, seen in (losses or {}).items():
        if seen and str(b) in doc["buckets"]:
            doc["buckets"][str(b)]["losses"] = seen
    for b, epoch in (epochs or {}).items():
        if epoch is not None and str(b) in doc["buckets"]:
            doc["buckets"][str(b)]["epoch"] = epoch
    return doc


def _with_epochs(buckets: dict[int, tuple[int, int]], offset: dict) -> dict[int, tuple[tuple[int, int], int | None]]:
    """bucket -> ``((snapshot, offset), the epoch below it)`` of a parsed offset and its JSON (None: it does
    not say, as an offset written before epochs)."""
    docs = offset.get("buckets", {})
    out = {}
    for b, pair in buckets.items():
        epoch = docs.get(str(b), {}).get("epoch") if isinstance(docs.get(str(b)), dict) else None
        out[b] = (pair, None if epoch is None or pair[1] == NOT_STARTED else int(epoch))
    return out


def _end_epochs(table: TableClient, ends: dict[int, int], starts: dict[int, LogPosition],
                latest: dict[int, LogPosition], target: dict[int, LogPosition]) -> dict[int, int | None]:
    """The epoch below each end: a known position's at that very offset (the start's, the latest's read by
    this plan, Trigger.AvailableNow's target), else asked now (``TableClient.positions``: an end cut by a read
    limit, say; None at the log's start, nothing below). Where the leader cannot tell it (the end above its
    high watermark: a leader that just took over and has not caught up yet), the epoch below the ``latest``
    offset this plan read, a bound of the same history that fences as well (``client/log_position.py``).

    Asked before the plan's loss check, so the epoch is of the history the reader read up to the end:
    a loss before the ask is seen by that check (DATA_LOST); one after it leaves the epoch of the history
    before, and the next batch's first fetch from the end, fenced by it, is refused if the loss reused
    offsets below the end; the batch reading up to the end meanwhile finds the entries the loss put in its
    range (``spark_source/changelog.py``). ``partitions`` asks a later split piece's epoch the same way,
    before its own check."""
    known = (starts, latest, target)
    epochs = {b: next((k[b].epoch for k in known if b in k and k[b].offset == end and k[b].epoch is not None),
                      None) for b, end in ends.items()}
    unknown = {b: ends[b] for b, epoch in epochs.items() if epoch is None and ends[b] > 0}
    if unknown:
        epochs.update((b, position.epoch) for b, position in table.positions(unknown).items())
    for b, epoch in epochs.items():
        if epoch is None and b in latest and 0 < ends[b] <= latest[b].offset:
            epochs[b] = latest[b].epoch
    return epochs


def _losses_seen(offset: dict) -> dict[int, int]:
    """bucket -> the loss records an offset has seen (0 when it does not say)."""
    return {int(b): int(v.get("losses", 0)) for b, v in offset.get("buckets", {}).items() if isinstance(v, dict)}


def _named(lease: LeaseRef | None) -> LeaseRef:
    """The lease of an offset that bootstraps buckets (InvalidRequestError if it names none)."""
    if lease is None:
        raise errors.InvalidRequestError("not a kvlease streaming offset: it bootstraps buckets but names no lease")
    return lease


def _parse(offset: dict) -> tuple[int | None, LeaseRef | None, dict[int, tuple[int, int]]]:
    """``(table id or None if the offset predates it, lease, buckets)``."""
    try:
        table_id = offset.get("table")
        lease_id, owner = offset.get("lease"), offset.get("owner")
        lease = None if lease_id is None else LeaseRef(str(lease_id), None if owner is None else str(owner))
        return (None if table_id is None else int(table_id), lease,
                {int(b): (int(v["snapshot"]), int(v["offset"])) for b, v in offset["buckets"].items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise errors.InvalidRequestError(f"not a kvlease streaming offset: {offset!r} ({exc})") from None


def _limited(starts: dict[int, int], ends: dict[int, int], max_rows: int) -> dict[int, int]:
    """Ends that read at most ``max_rows`` records in all, shared fairly between the buckets."""
    out = dict(starts)
    pending = {b: ends[b] - starts[b] for b in sorted(starts) if ends[b] > starts[b]}
    budget = max_rows
    while budget > 0 and pending:
        share = max(1, budget // len(pending))
        for b in list(pending):
            take = min(share, pending[b], budget)
            out[b] += take
            pending[b] -= take
            budget -= take
            if not pending[b]:
                del pending[b]
            if not budget:
                break
    return out
