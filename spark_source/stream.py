"""Streaming reads: bootstrap, then tail the changelog.

Offsets are JSON (``spark_source/stream_offsets.py``): per bucket (by bucket
key: a partition's buckets are ``"p{partition_id}-{bucket}"``) ``offset``, the
first changelog record of the bucket not yet read (``-1``: the bucket is not
bootstrapped yet), and ``snapshot``, the snapshot the bucket was bootstrapped
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
- ``partitions(start, end)``: a bucket at -1 in ``start`` (or not in it)
  reads its hybrid split (snapshot + changelog to ``end``) if ``end`` names
  its snapshot, else ``[0, end)``; any other reads ``[start, end)``. Both
  ``latestOffset`` (from ``start``) and ``partitions`` (up to ``end``, with
  the loss records ``end`` has seen) fail with DATA_LOST if a loss of data
  reused offsets below: a batch Spark planned before the loss and runs again
  after it (the query died in it) would read other changes under the planned
  offsets. (``"losses"`` per bucket: the loss records seen, see
  ``client/lost_ranges.py``.)
  ``"epoch"`` per bucket (absent when not known): the leader epoch of the
  entry just below ``offset``, from ListOffsets: its end's epoch when the end
  was planned at the log's end, else asked for the offset (an end cut by
  ``maxRowsPerTrigger`` or Trigger.AvailableNow, a ``startup.mode`` latest or
  timestamp start; a start at the log's start has nothing below); where the
  leader cannot tell it (above its high watermark), the epoch below the log's
  end the plan read, a bound (``client/log_position.py``). The first fetch of
  the next micro-batch's split sends it, later fetches the last entry's
  (``spark_source/changelog.py``); when ``split.max-rows`` cuts a range in
  pieces, each later piece starts with the epoch below its start, asked when
  the batch is planned (the end's where the leader cannot tell it). Every
  entry a split reads must be under an epoch no newer than the end's. A
  restore or unclean election between planning and reading, or while a split
  reads, fails the split with DATA_LOST instead of reading other changes
  under offsets the query read or planned. Epochs are asked before the plan's
  loss check (``_end_epochs`` says why). An offset written before ``epoch``
  existed (an older checkpoint) starts with the epoch below the end of the
  batch that starts there (asked so, if the end lacks it too).
  Planning a bootstrap makes sure the lease still holds its snapshots (renew,
  or re-acquire the same snapshots under the same id after an expiry) and
  starts the renewal thread (``spark_source/stream_lease.py``): every third
  of ``lease.duration`` until the bootstrap is committed. If a snapshot is
  gone, the query fails naming the lease.
- ``commit(end)`` releases the buckets ``end`` bootstrapped (idempotent: a late
  or repeated commit releases nothing more) and stops renewing when none is left.
  Spark commits a micro-batch's end only when it plans the next one, so the
  offset after a bootstrap differs from it (snapshot ids cleared) even when no
  change came in: one micro-batch, possibly empty, follows every bootstrap.

A partitioned table's offsets also name the partitions read (``"partitions"``).
``initialOffset`` lists them; ``latestOffset`` lists them again when the reader
first plans and then every ``partition.discovery.interval``
(``spark_source/discovery.py``): a new partition joins with every bucket at -1,
so the next micro-batch bootstraps it like a table's first (its snapshots leased
under the query's lease in one acquire, in full mode; a change feed reads its
changelog from 0), while the other partitions are tailed in the same batch; a
dropped partition leaves the offsets, and a split reading it when it is dropped
ends quietly (``reader.py``). Under Trigger.AvailableNow only the partitions
there when the query started are read.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from kvlease.client.admin import AdminClient
from kvlease.client.log_position import LogPosition
from kvlease.common import errors
from kvlease.spark_source.discovery import PartitionDiscovery, dropping, follow
from kvlease.spark_source.enumerator import (acquire_latest, fence_pieces, give_back, log_splits_for, release_buckets,
                                             start_positions)
from kvlease.spark_source.options import Options, connect, open_table
from kvlease.spark_source.partitions import (BucketKey, PartitionedTables, bucket_of, check_table_losses, key_of,
                                             name_splits, partition_of, table_bucket)
from kvlease.spark_source.reader import names_table, read_split
from kvlease.spark_source.splits import HybridSplit, ReadContext
from kvlease.spark_source.stream_schema import SchemaCheck
from kvlease.spark_source.stream_lease import Renewer, ensure_lease
from kvlease.spark_source.stream_offsets import (NOT_STARTED, LeaseRef, _limited, _losses_seen, _named, _offset, _parse,
                                                 _with_epochs, partition_names)

log = logging.getLogger(__name__)
#: Bucket -> (snapshot, offset), as an offset holds them.
Buckets = dict[BucketKey, tuple[int, int]]


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options, ctx: ReadContext) -> None:
        self.options = options
        self.ctx = ctx
        self._clients: tuple[AdminClient, object] | None = None  # the admin and a TableClient / PartitionedTables
        self._target: dict[BucketKey, LogPosition] | None = None  # Trigger.AvailableNow: offsets not to read past
        self._admitted: set[int] | None = None  # Trigger.AvailableNow: the partitions it reads
        self._renewer: Renewer | None = None
        self._discovery: PartitionDiscovery | None = None
        self._schema_check = SchemaCheck(ctx.table)

    def __getstate__(self) -> dict:  # Spark pickles the reader for read(); clients and threads stay here
        return {"options": self.options, "ctx": self.ctx, "_clients": None, "_target": None, "_admitted": None,
                "_renewer": None, "_discovery": None, "_schema_check": None}

    # -- clients ---------------------------------------------------------------------------------

    def _connect(self) -> tuple[AdminClient, object]:
        if self._clients is None:
            admin = connect(self.ctx.bootstrap, self.ctx.security)
            table = self.ctx.table
            self._clients = admin, (PartitionedTables(admin, table, self.ctx.security) if table.partitioned
                                    else open_table(admin, table.table_id, self.ctx.security))
        return self._clients

    def _tables(self, names: Mapping[int, str]):
        """The table client of the read (a partitioned table's: of the partitions ``names``)."""
        _, tables = self._connect()
        if self.ctx.table.partitioned:
            tables.set_partitions(names)
        return tables

    def _listing(self, force: bool = False) -> dict[int, str] | None:
        """A partitioned table's partitions (None: not due, or not partitioned; ``force``: listed now)."""
        if not self.ctx.table.partitioned:
            return None
        if self._discovery is None:
            self._discovery = PartitionDiscovery(self._connect()[0], self.ctx.table,
                                                 self.options.partition_discovery_interval_ms)
        return self._discovery.listing() if force else self._discovery.poll()

    def _keys(self, names: Mapping[int, str] | None) -> list[BucketKey]:
        buckets = range(self.ctx.table.buckets)
        return list(buckets) if names is None else [(p, b) for p in sorted(names) for b in buckets]

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
        names = self._listing(force=True)
        keys = self._keys(names)
        if self.options.startup_mode == "full":
            owner = uuid.uuid4().hex
            lease = LeaseRef(self.options.lease_id or f"spark-stream-{owner}", owner)
            return self._offset(lease, {k: (-1, NOT_STARTED) for k in keys}, names)
        admin, _ = self._connect()
        tables = self._tables(names or {})
        seen = self._check_losses(admin, {}, {k: (-1, NOT_STARTED) for k in keys}, names)  # a new query adopts them
        # with the epoch below each start, the first fetch's fence; asked after the adoption: a loss before
        # the ask moves start and epoch to the new history alike (nothing was read yet), one after it is
        # the next plan's loss check's and the fenced fetch's
        starts = start_positions(tables, self.options)
        if names is not None:
            names = {p: n for p, n in names.items() if p not in tables.gone}
        return self._offset(None, {k: (-1, starts[k].offset) for k in keys if k in starts}, names, seen,
                            {k: p.epoch for k, p in starts.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger:
            return ReadMaxRows(self.options.max_rows_per_trigger)
        return ReadAllAvailable()

    @names_table
    def prepareForTriggerAvailableNow(self) -> None:
        names = self._listing(force=True)
        self._target = self._tables(names or {}).end_positions()
        self._admitted = None if names is None else set(names)

    @names_table
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        lease, starts = self._parse(start)
        names = partition_names(start)
        admin, _ = self._connect()
        self._schema_check.poll(admin)
        if self.ctx.table.partitioned:
            names, starts = follow(names, starts, self._listing(), self.ctx.table.buckets, self._admitted)
        tables = self._tables(names)
        positions = tables.end_positions()
        if self.ctx.table.partitioned:  # partitions found dropped by that ask leave too
            names, starts = dropping(names, starts, tables.gone)
        target = self._target or {}
        latest = {k: min(p.offset, target[k].offset if k in target else p.offset) for k, p in positions.items()
                  if k in starts}
        known = ({k: LogPosition(o, e) for k, ((_, o), e) in _with_epochs(starts, start).items()}, positions, target)
        if any(offset == NOT_STARTED for _, offset in starts.values()):
            seen = self._check_losses(admin, start, starts, names)  # DATA_LOST: offsets it read were reused
            return self._bootstrap_end(admin, tables, lease, starts, latest, seen, known, names)
        ends = {k: max(starts[k][1], latest[k]) for k in starts}
        if isinstance(limit, ReadMaxRows):
            ends = _limited({k: o for k, (_, o) in starts.items()}, ends, limit.max_rows)
        new = (any(ends[k] != starts[k][1] or snapshot != -1 for k, (snapshot, _) in starts.items())
               or names != partition_names(start))
        epochs = _end_epochs(tables, ends, *known) if new else {}  # before the loss check: see _end_epochs
        seen = self._check_losses(admin, start, starts, names)  # DATA_LOST: offsets it read were reused
        if not new:
            return start  # nothing new: no micro-batch
        # Right after a bootstrap this is a new offset even with no new data: Spark commits a batch's
        # end to the source only when it plans the next one, and that commit releases the lease.
        return self._offset(lease, {k: (-1, ends[k]) for k in starts}, names, seen, epochs)

    def _check_losses(self, admin: AdminClient, start: dict, starts: Buckets,
                      names: Mapping[int, str] | None) -> dict[BucketKey, int]:
        """The loss records of each bucket this query has seen now; DataLostError if one it had not seen
        reused offsets it read (``client/lost_ranges.py``)."""
        return check_table_losses(admin, self.ctx.table, {k: o for k, (_, o) in starts.items()}, _losses_seen(start),
                                  names)

    def _bootstrap_end(self, admin: AdminClient, tables, lease: LeaseRef | None, starts: Buckets,
                       latest: dict[BucketKey, int], seen: dict[BucketKey, int], known: tuple,
                       names: dict[int, str] | None) -> dict:
        """The end of a bootstrap micro-batch: lease the latest snapshots of the buckets not started (in full
        mode; the whole bootstrap is one micro-batch, whatever the read limit); the others read on."""
        pending = [k for k, (_, offset) in starts.items() if offset == NOT_STARTED]
        held: dict = {}
        if self.options.startup_mode == "full":
            lease = _named(lease)
            held, gone = self._acquire(admin, lease, pending)
            if gone:
                names, starts = dropping(names, starts, gone)
        ends = {}
        for k, (_, offset) in starts.items():
            if offset != NOT_STARTED:
                ends[k] = (-1, max(offset, latest[k]))
            elif k in held:
                ends[k] = (held[k].snapshot_id, max(held[k].log_offset, latest[k]))
            else:
                ends[k] = (-1, latest[k])
        if held:
            try:
                self._renew(lease, {k: held[k].snapshot_id for k in held})
            except BaseException:  # the offset is not logged: nothing would ever read or release the lease
                give_back(admin, self.ctx.table, lease.lease_id, held, lease.owner)
                raise
        return self._offset(lease, ends, names, seen, _end_epochs(tables, {k: o for k, (_, o) in ends.items()}, *known))

    def _acquire(self, admin: AdminClient, lease: LeaseRef, keys: list[BucketKey]) -> tuple[dict, set[int]]:
        """``(bucket key -> snapshot leased, partitions found dropped)`` for ``keys``, in one acquire (again
        without the partitions that one found dropped: PARTITION_NOT_EXISTS refuses an acquire as a whole)."""
        gone: set[int] = set()
        while True:
            try:
                return acquire_latest(admin, self.ctx.table, lease.lease_id, self.options, owner=lease.owner,
                                      keys=keys), gone
            except errors.PartitionNotExistsError:
                there = self._listing(force=True) or {}
                dropped = {partition_of(k) for k in keys} - set(there)
                if not dropped:
                    raise
                gone |= dropped
                keys = [k for k in keys if partition_of(k) not in dropped]

    def _offset(self, lease: LeaseRef | None, buckets: Buckets, names: Mapping[int, str] | None = None,
                losses: Mapping[BucketKey, int] | None = None,
                epochs: Mapping[BucketKey, int | None] | None = None) -> dict:
        return _offset(lease, buckets, self.ctx.table.table_id, losses, epochs,
                       names if self.ctx.table.partitioned else None)

    def _parse(self, offset: dict) -> tuple[LeaseRef | None, Buckets]:
        """``offset``'s lease and buckets; InvalidRequestError if it is not an offset of this table."""
        table_id, lease, buckets = _parse(offset)
        table = self.ctx.table
        if table_id is not None and table_id != table.table_id:
            raise errors.InvalidRequestError(
                f"this query's checkpoint was written for table id {table_id}, but table {table.path} is now table "
                f"id {table.table_id} (the table was dropped and created again, or the query's 'table' option "
                f"changed): its offsets are not positions in this table's changelog; start the query with a new "
                f"checkpoint location")
        names = partition_names(offset) if table.partitioned else None
        if set(buckets) != set(self._keys(names)):
            shown = sorted(buckets) if names is None else sorted(buckets)[:8]
            raise errors.InvalidRequestError(
                f"this query's checkpoint has buckets {shown}, but table {table.path} has buckets "
                f"0..{table.buckets - 1}{' in each partition' if names is not None else ''}: the checkpoint is of "
                f"another table; start the query with a new checkpoint location")
        return lease, buckets

    # -- planning --------------------------------------------------------------------------------

    @names_table
    def partitions(self, start: dict, end: dict) -> list:
        _, starts = self._parse(start)
        lease, ends = self._parse(end)
        names = partition_names(end)
        admin, _ = self._connect()
        tables = self._tables(names)
        epochs = {k: e for k, (_, e) in _with_epochs(starts, start).items()}
        end_epochs = {k: e for k, (_, e) in _with_epochs(ends, end).items()}
        splits: list = []
        bootstrapping: dict[BucketKey, int] = {}
        ranges: dict[BucketKey, tuple[int, int]] = {}
        for k, (snapshot, end_offset) in ends.items():
            begin = starts.get(k, (-1, NOT_STARTED))[1]
            if begin == NOT_STARTED and snapshot != -1:
                bootstrapping[k] = snapshot
                lease = _named(lease)
                splits.append(HybridSplit(bucket_of(k), snapshot, end_offset, lease.lease_id, False, lease.owner,
                                          end_epochs[k], partition_of(k)))
            else:
                ranges[k] = (max(begin, 0), end_offset)
        # a later piece's epoch (and an end's that the offset does not tell: a checkpoint written before epochs)
        # is asked before the loss check (see _end_epochs); the first piece's is the start's, else the end's
        pieces = fence_pieces(tables, log_splits_for(ranges, self.options.split_max_rows), epochs, end_epochs)
        seen = self._check_losses(admin, end, ends, names)  # a batch planned before a loss: its range may be reused
        splits.extend(dataclasses.replace(s, losses_seen=seen.get(key_of(s.partition_id, s.bucket), 0))
                      for s in pieces)
        if bootstrapping:
            self._renew(_named(lease), bootstrapping)
        return name_splits(splits, names)

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return read_split(self.ctx, partition)

    @names_table
    def commit(self, end: dict) -> None:
        lease, ends = self._parse(end)
        done = [table_bucket(self.ctx.table.table_id, k) for k, (snapshot, _) in ends.items() if snapshot != -1]
        if not done or lease is None:
            return
        admin, _ = self._connect()
        try:  # idempotent: a late or second commit finds nothing held
            release_buckets(admin, lease.lease_id, done, lease.owner)
        except errors.KvLeaseError as exc:  # the data is committed; unrenewed, the lease expires by itself
            log.warning("could not release lease %s after its bootstrap committed (it expires within "
                        "lease.duration): %s", lease.lease_id, exc)
        if self._renewer is not None and self._renewer.lease == lease:
            self._renewer.stop()
            self._renewer = None

    # -- the lease -------------------------------------------------------------------------------

    def _renew(self, lease: LeaseRef, snapshots: dict[BucketKey, int]) -> None:
        """Make sure ``lease`` holds ``snapshots`` now, and keep renewing it until the bootstrap commits."""
        admin, _ = self._connect()
        if self._renewer is None or self._renewer.lease != lease or not self._renewer.alive:
            ensure_lease(admin, self.ctx.table, lease, snapshots, self.options.lease_duration_ms)
            if self._renewer is not None:
                self._renewer.stop()
            self._renewer = Renewer(admin, lease, self.options.lease_duration_ms)
        elif self._renewer.lost is not None:
            raise self._renewer.lost


def _end_epochs(table, ends: dict[BucketKey, int], starts: dict[BucketKey, LogPosition],
                latest: dict[BucketKey, LogPosition],
                target: dict[BucketKey, LogPosition]) -> dict[BucketKey, int | None]:
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
