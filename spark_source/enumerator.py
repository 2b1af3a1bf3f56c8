"""Driver side: lease the latest snapshots, read end offsets, plan splits.

``acquire_latest`` reads the latest snapshot of every bucket and leases them
under one lease id. A snapshot can be subsumed between "get" and "acquire";
the coordinator then reports it ``unavailable`` and those buckets are tried
again with the snapshots that are latest by then, with exponential backoff and
jitter (tenacity), at most ``lease.acquire.max-attempts`` times and for at most
``lease.acquire.max-wait``; past that a :class:`SnapshotUnavailableError`
names the table and the buckets. Buckets that have no snapshot yet are read
from the changelog alone.

Every lease a read takes carries the read's owner token: a ``lease.id`` that
another reader holds is refused by the coordinator (LEASE_OWNED), atomically,
instead of moving or releasing that reader's snapshots.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Iterable, Mapping

import tenacity

from kvlease.client.admin import AdminClient, SnapshotInfo
from kvlease.client.log_position import LogPosition
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo
from kvlease.spark_source.options import Options, OptionError
from kvlease.spark_source.partitions import (BucketKey, bucket_of, key_of, key_text, keys_of, partition_of,
                                             table_bucket)
from kvlease.spark_source.splits import HybridSplit, LiveSplit, LogSplit


log = logging.getLogger(__name__)
#: The most changelog splits one plan makes (``split.max-rows`` asking for more gets larger ones).
MAX_LOG_SPLITS = 1000


class SnapshotUnavailableError(errors.SnapshotNotFoundError):
    """No snapshot of some buckets could be leased within the configured bound."""


def acquire_latest(admin: AdminClient, table: TableInfo, lease_id: str, options: Options, *, owner: str | None,
                   sleep: Callable[[float], None] = tenacity.nap.sleep,
                   keys: Iterable[BucketKey] | None = None) -> dict[BucketKey, SnapshotInfo]:
    """``bucket key -> snapshot`` now held by ``lease_id`` (owned by ``owner``) for every bucket of ``keys``
    (default: every bucket of an unpartitioned table) that has a snapshot, in one acquire (more only for
    snapshots subsumed meanwhile). OptionError naming ``lease.id`` if another reader holds that lease;
    PartitionNotExistsError (nothing held) if a partition of ``keys`` was dropped meanwhile."""
    held: dict[BucketKey, SnapshotInfo] = {}
    pending = set(range(table.buckets) if keys is None else keys)
    started = time.monotonic()

    def attempt() -> set[BucketKey]:
        latest = {key_of(tb.partition_id, tb.bucket): info
                  for tb, info in admin.get_latest_kv_snapshots(table.table_id).items()}
        wanted = {k: latest[k] for k in pending if k in latest}
        pending.difference_update(k for k in list(pending) if k not in latest)  # no snapshot: changelog only
        if not wanted:
            return set()
        try:
            result = admin.acquire_lease(lease_id, {table_bucket(table.table_id, k): info.snapshot_id
                                                    for k, info in wanted.items()}, options.lease_duration_ms,
                                         owner=owner)
        except errors.InvalidLeaseDurationError as exc:  # above the cluster's kv.snapshot.lease.max-duration
            raise OptionError(f"option 'lease.duration': {exc.message}") from None
        except errors.LeaseOwnedError as exc:  # nothing of the other reader's lease was changed
            raise OptionError(f"option 'lease.id': {exc.message}", lease_id=lease_id) from None
        missing = {key_of(tb.partition_id, tb.bucket) for tb in result.unavailable}
        for k, info in wanted.items():
            if k not in missing:
                held[k] = info
                pending.discard(k)
        return missing

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(options.acquire_max_attempts)
        | tenacity.stop_after_delay(options.acquire_max_wait_s),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=max(0.05, options.acquire_max_wait_s / 4)),
        retry=tenacity.retry_if_result(bool), sleep=sleep, reraise=True,
        retry_error_callback=lambda state: state.outcome.result())
    try:
        missing = retrying(attempt)
    except BaseException:
        give_back(admin, table, lease_id, held, owner)
        raise
    if missing:
        give_back(admin, table, lease_id, held, owner)
        raise SnapshotUnavailableError(
            f"table {table.path}: no snapshot of {_buckets_text(missing)} could be leased "
            f"(lease {lease_id}) after {retrying.statistics.get('attempt_number', 1)} attempt(s) in "
            f"{time.monotonic() - started:.1f}s: each was subsumed before the lease reached it; raise "
            "lease.acquire.max-attempts / lease.acquire.max-wait, or snapshot less often",
            table=table.path, buckets=sorted(missing), lease_id=lease_id)
    return held


def _buckets_text(keys: Iterable[BucketKey]) -> str:
    """``bucket(s) 0, 1`` (an unpartitioned table's), or ``bucket(s) p12-0, p12-1`` (partition 12's)."""
    return f"bucket(s) {', '.join(key_text(k) for k in sorted(keys))}"


def give_back(admin: AdminClient, table: TableInfo, lease_id: str, held: Mapping[BucketKey, object],
              owner: str | None) -> None:
    """Release ``held`` buckets of ``lease_id`` (a plan that failed after it leased them); a failure to
    is logged: the lease's expiry frees them then."""
    if not held:
        return
    try:
        release_buckets(admin, lease_id, [table_bucket(table.table_id, k) for k in sorted(held)], owner)
    except errors.KvLeaseError as exc:
        log.warning("table %s: could not give back lease %s after its read failed to plan (it expires within "
                    "lease.duration): %s", table.path, lease_id, exc)


def release_buckets(admin: AdminClient, lease_id: str, buckets: list[TableBucket], owner: str | None) -> None:
    """Release ``buckets`` of ``lease_id``. A partition dropped meanwhile is no longer in any lease (the drop
    took it out) and a release naming it is refused as a whole (PARTITION_NOT_EXISTS): each partition's
    buckets are then released on their own, and the dropped ones' refusals ignored."""
    try:
        admin.release_lease(lease_id, buckets, owner=owner)
        return
    except errors.PartitionNotExistsError:
        if len({tb.partition_id for tb in buckets}) == 1:
            return
    for partition in sorted({tb.partition_id for tb in buckets}, key=lambda p: -1 if p is None else p):
        try:
            admin.release_lease(lease_id, [tb for tb in buckets if tb.partition_id == partition], owner=owner)
        except errors.PartitionNotExistsError:
            continue


def plan_bootstrap(admin: AdminClient, table, options: Options, lease_id: str, *, owner: str,
                   release: bool, sleep: Callable[[float], None] = tenacity.nap.sleep) -> list:
    """A full read: one split per bucket (hybrid, changelog-only for a bucket without a snapshot, or a live
    scan with ``bootstrap.mode=live``). ``table``: a TableClient, or :class:`PartitionedTables` (every bucket
    of its partitions under one lease, in one acquire; a partition dropped while the read plans is left out)."""
    info, keys = table.table, keys_of(table)
    if options.bootstrap_mode == "live":
        return [LiveSplit(bucket_of(k), partition_of(k)) for k in keys]
    held = acquire_latest(admin, info, lease_id, options, owner=owner, sleep=sleep, keys=keys)
    try:
        ends = table.end_positions()
    except BaseException:
        give_back(admin, info, lease_id, held, owner)
        raise
    give_back(admin, info, lease_id, {k: v for k, v in held.items() if k not in ends}, owner)  # dropped
    # the end's epoch fences each read, from its first fetch on (client/log_position.py: a bound)
    return [HybridSplit(bucket_of(k), held[k].snapshot_id, ends[k].offset, lease_id, release, owner, ends[k].epoch,
                        partition_of(k)) if k in held
            else LogSplit(bucket_of(k), 0, ends[k].offset, as_state=True, start_epoch=ends[k].epoch,
                          end_epoch=ends[k].epoch, partition_id=partition_of(k))
            for k in keys if k in ends]


def start_offsets(table, options: Options) -> dict[BucketKey, int]:
    """Where a change feed starts in every bucket (``startup.mode`` earliest, latest or timestamp)."""
    if options.startup_mode == "timestamp":
        return dict(table.list_offsets(timestamp=options.startup_timestamp_ms))
    column = 0 if options.startup_mode == "earliest" else 1
    return {b: pair[column] for b, pair in table.list_offsets().items()}


def start_positions(table, options: Options) -> dict[BucketKey, LogPosition]:
    """:func:`start_offsets` with the leader epoch of the entry just below each (the first fetch's fence,
    ``client/log_position.py``): ``latest`` as ListOffsets tells the end's, ``timestamp`` asked for the
    offsets found. ``earliest`` has none: the log's start has nothing of the log below it, so the query
    read nothing there that a loss could take back (a loss reusing offsets below a start is the loss
    check's: ``client/lost_ranges.py``)."""
    if options.startup_mode == "latest":
        return table.end_positions()
    starts = start_offsets(table, options)
    if options.startup_mode == "earliest":
        return {b: LogPosition(o) for b, o in starts.items()}
    return table.positions(starts)


def fence_pieces(table, splits: list[LogSplit], starts: Mapping[BucketKey, int | None],
                 ends: Mapping[BucketKey, int | None]) -> list[LogSplit]:
    """``splits`` (:func:`log_splits_for`: each bucket's range in pieces, in order) with the leader epochs that
    fence their reads (``client/log_position.py``, ``spark_source/changelog.py``).

    ``end_epoch``: ``ends[bucket]``, the epoch of the entry below the range's end as planned (None: not known,
    an offset written before epochs: asked now). ``start_epoch``: the epoch of the entry just below the piece's
    start: ``starts[bucket]`` for a bucket's first piece (the epoch its range's start was planned with), the
    epoch there now for a later piece (``TableClient.epochs_at``: one ListOffsets for the pieces and the
    unknown ends). Where that is not known (a first piece at the log's start or from a checkpoint written
    before epochs) or the leader cannot tell it (a later piece above its high watermark: a leader that just
    took over and has not caught up yet, or a log that lost it), the piece starts with the end's epoch: a
    bound of the same history, which fences as well (``client/log_position.py``). The piece before reads the
    entries below a start: a loss reusing them before the piece's first fetch refuses the fetch with
    DATA_LOST instead of serving other changes after it. A piece of a partition found dropped while its
    epochs are asked is left out (the partition's part of the read ends)."""
    firsts: dict[BucketKey, int] = {}
    last: dict[BucketKey, int] = {}  # each bucket's range end
    asked_at: dict[BucketKey, list[int]] = {}
    for split in splits:
        key = key_of(split.partition_id, split.bucket)
        if key in firsts:
            asked_at.setdefault(key, []).append(split.start)
        else:
            firsts[key] = split.start
        last[key] = split.end
    for key, end in last.items():
        if ends.get(key) is None:
            asked_at.setdefault(key, []).append(end)
    asked = table.epochs_at(asked_at) if asked_at else {}
    out = []
    for split in splits:
        key = key_of(split.partition_id, split.bucket)
        if key in asked_at and key not in asked:  # its partition was dropped
            continue
        end_epoch = ends.get(key)
        if end_epoch is None:
            end_epoch = asked[key][last[key]]
        start_epoch = starts.get(key) if split.start == firsts[key] else asked[key][split.start]
        out.append(dataclasses.replace(split, start_epoch=end_epoch if start_epoch is None else start_epoch,
                                       end_epoch=end_epoch))
    return out


def end_positions(table, options: Options) -> dict[BucketKey, LogPosition]:
    """Where a batch change feed ends (exclusive): ``ending.offsets``, ``ending.timestamp`` (inclusive
    time), else the latest offsets at planning; each with the epoch of the entry below the latest offset
    (ListOffsets' end epoch), read after the end: a bound of the epochs below the end as well
    (``client/log_position.py``)."""
    given = None
    if options.ending_timestamp_ms is not None:
        given = dict(table.list_offsets(timestamp=options.ending_timestamp_ms + 1))
    latest = table.end_positions()
    if options.ending_offsets is not None:
        given = _explicit_ends(table.table, options.ending_offsets, {b: p.offset for b, p in latest.items()})
    if given is None:
        return latest
    # an end past the latest (the log's end went back between the two asks: a loss) has no bound
    return {b: LogPosition(o, latest[b].epoch if o <= latest[b].offset else None) for b, o in given.items()
            if b in latest}  # (a partition dropped between the two asks: left out)


def _explicit_ends(info: TableInfo, given: Mapping[int, int], latest: Mapping[int, int]) -> dict[int, int]:
    out = dict(latest)
    for bucket, offset in given.items():
        if bucket >= info.buckets:
            raise OptionError(f"option 'ending.offsets': table {info.path} has buckets 0..{info.buckets - 1}, "
                              f"not {bucket}")
        if offset > latest[bucket]:
            raise OptionError(f"option 'ending.offsets': bucket {bucket} ends at offset {latest[bucket]} "
                              f"so far, not {offset}")
        out[bucket] = offset
    return out


def log_splits(key: BucketKey, start: int, end: int, max_rows: int | None) -> list[LogSplit]:
    """``[start, end)`` of a bucket as one split, or as pieces of at most ``max_rows`` records."""
    if end <= start:
        return []
    step = max_rows or end - start
    return [LogSplit(bucket_of(key), s, min(s + step, end), partition_id=partition_of(key))
            for s in range(start, end, step)]


def log_splits_for(ranges: Mapping[BucketKey, tuple[int, int]], max_rows: int | None) -> list[LogSplit]:
    """Each bucket's ``[start, end)`` cut by ``split.max-rows``, in at most :data:`MAX_LOG_SPLITS` splits
    in all (or one per bucket that has records, if more): where the option would make more, the pieces
    are made just large enough, and a warning says so."""
    sizes = [end - start for start, end in ranges.values() if end > start]
    bound = max(MAX_LOG_SPLITS, len(sizes))
    step = max_rows
    if max_rows and _pieces(sizes, max_rows) > bound:
        low, high = max_rows, max(sizes)  # the fewest records per piece that keeps within the bound
        while low < high:
            middle = (low + high) // 2
            low, high = (middle + 1, high) if _pieces(sizes, middle) > bound else (low, middle)
        step = low
        log.warning("split.max-rows=%d would cut %d changelog records into %d Spark partitions; reading them in "
                    "%d partitions of at most %d records instead (at most %d partitions)", max_rows, sum(sizes),
                    _pieces(sizes, max_rows), _pieces(sizes, step), step, bound)
    return [split for b in sorted(ranges) for split in log_splits(b, *ranges[b], step)]


def _pieces(sizes: list[int], step: int) -> int:
    return sum(-(-n // step) for n in sizes)


def plan_changes(table, options: Options) -> list[LogSplit]:
    """A batch change-feed read: the changelog records between the start and end offsets (of every bucket of
    every partition of a :class:`PartitionedTables`; a partition dropped while the read plans is left out)."""
    starts, ends = start_positions(table, options), end_positions(table, options)
    splits = log_splits_for({k: (starts[k].offset, ends[k].offset) for k in keys_of(table)
                             if k in starts and k in ends}, options.split_max_rows)
    return fence_pieces(table, splits, {b: p.epoch for b, p in starts.items()},
                        {b: p.epoch for b, p in ends.items()})
