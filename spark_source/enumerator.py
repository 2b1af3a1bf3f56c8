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
from typing import Callable, Mapping

import tenacity

from kvlease.client.admin import AdminClient, SnapshotInfo
from kvlease.client.log_position import LogPosition
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.tables import TableInfo
from kvlease.spark_source.options import Options, OptionError
from kvlease.spark_source.splits import HybridSplit, LiveSplit, LogSplit


log = logging.getLogger(__name__)
#: The most changelog splits one plan makes (``split.max-rows`` asking for more gets larger ones).
MAX_LOG_SPLITS = 1000


class SnapshotUnavailableError(errors.SnapshotNotFoundError):
    """No snapshot of some buckets could be leased within the configured bound."""


def acquire_latest(admin: AdminClient, table: TableInfo, lease_id: str, options: Options, *, owner: str | None,
                   sleep: Callable[[float], None] = tenacity.nap.sleep) -> dict[int, SnapshotInfo]:
    """``bucket -> snapshot`` now held by ``lease_id`` (owned by ``owner``) for every bucket that has a
    snapshot. OptionError naming ``lease.id`` if another reader holds that lease."""
    held: dict[int, SnapshotInfo] = {}
    pending = set(range(table.buckets))
    started = time.monotonic()

    def attempt() -> set[int]:
        latest = {tb.bucket: info for tb, info in admin.get_latest_kv_snapshots(table.table_id).items()}
        wanted = {b: latest[b] for b in pending if b in latest}
        pending.difference_update(b for b in list(pending) if b not in latest)  # no snapshot: changelog only
        if not wanted:
            return set()
        try:
            result = admin.acquire_lease(lease_id, {TableBucket(table.table_id, b): info.snapshot_id
                                                    for b, info in wanted.items()}, options.lease_duration_ms,
                                         owner=owner)
        except errors.InvalidLeaseDurationError as exc:  # above the cluster's kv.snapshot.lease.max-duration
            raise OptionError(f"option 'lease.duration': {exc.message}") from None
        except errors.LeaseOwnedError as exc:  # nothing of the other reader's lease was changed
            raise OptionError(f"option 'lease.id': {exc.message}", lease_id=lease_id) from None
        missing = {tb.bucket for tb in result.unavailable}
        for b, info in wanted.items():
            if b not in missing:
                held[b] = info
                pending.discard(b)
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
            f"table {table.path}: no snapshot of bucket(s) {', '.join(map(str, sorted(missing)))} could be leased "
            f"(lease {lease_id}) after {retrying.statistics.get('attempt_number', 1)} attempt(s) in "
            f"{time.monotonic() - started:.1f}s: each was subsumed before the lease reached it; raise "
            "lease.acquire.max-attempts / lease.acquire.max-wait, or snapshot less often",
            table=table.path, buckets=sorted(missing), lease_id=lease_id)
    return held


def give_back(admin: AdminClient, table: TableInfo, lease_id: str, held: Mapping[int, object],
              owner: str | None) -> None:
    """Release ``held`` buckets of ``lease_id`` (a plan that failed after it leased them); a failure to
    is logged: the lease's expiry frees them then."""
    if not held:
        return
    try:
        admin.release_lease(lease_id, [TableBucket(table.table_id, b) for b in sorted(held)], owner=owner)
    except errors.KvLeaseError as exc:
        log.warning("table %s: could not give back lease %s after its read failed to plan (it expires within "
                    "lease.duration): %s", table.path, lease_id, exc)


def plan_bootstrap(admin: AdminClient, table: TableClient, options: Options, lease_id: str, *, owner: str,
                   release: bool, sleep: Callable[[float], None] = tenacity.nap.sleep) -> list:
    """A full read: one split per bucket (hybrid, changelog-only for a bucket without a snapshot,
    or a live scan with ``bootstrap.mode=live``)."""
    info = table.table
    if options.bootstrap_mode == "live":
        return [LiveSplit(b) for b in range(info.buckets)]
    held = acquire_latest(admin, info, lease_id, options, owner=owner, sleep=sleep)
    try:
        ends = table.end_positions()
    except BaseException:
        give_back(admin, info, lease_id, held, owner)
        raise
    # the end's epoch fences each read, from its first fetch on (client/log_position.py: a bound)
    return [HybridSplit(b, held[b].snapshot_id, ends[b].offset, lease_id, release, owner, ends[b].epoch) if b in held
            else LogSplit(b, 0, ends[b].offset, as_state=True, start_epoch=ends[b].epoch, end_epoch=ends[b].epoch)
            for b in range(info.buckets)]


def start_offsets(table: TableClient, options: Options) -> dict[int, int]:
    """Where a change feed starts in every bucket (``startup.mode`` earliest, latest or timestamp)."""
    if options.startup_mode == "timestamp":
        return dict(table.list_offsets(timestamp=options.startup_timestamp_ms))
    column = 0 if options.startup_mode == "earliest" else 1
    return {b: pair[column] for b, pair in table.list_offsets().items()}


def start_positions(table: TableClient, options: Options) -> dict[int, LogPosition]:
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


def fence_pieces(table: TableClient, splits: list[LogSplit], starts: Mapping[int, int | None],
                 ends: Mapping[int, int | None]) -> list[LogSplit]:
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
    DATA_LOST instead of serving other changes after it."""
    firsts: dict[int, int] = {}
    last: dict[int, int] = {}  # each bucket's range end
    asked_at: dict[int, list[int]] = {}
    for split in splits:
        if split.bucket in firsts:
            asked_at.setdefault(split.bucket, []).append(split.start)
        else:
            firsts[split.bucket] = split.start
        last[split.bucket] = split.end
    for bucket, end in last.items():
        if ends.get(bucket) is None:
            asked_at.setdefault(bucket, []).append(end)
    asked = table.epochs_at(asked_at) if asked_at else {}
    out = []
    for split in splits:
        end_epoch = ends.get(split.bucket)
        if end_epoch is None:
            end_epoch = asked[split.bucket][last[split.bucket]]
        start_epoch = (starts.get(split.bucket) if split.start == firsts[split.bucket]
                       else asked[split.bucket][split.start])
        out.append(dataclasses.replace(split, start_epoch=end_epoch if start_epoch is None else start_epoch,
                                       end_epoch=end_epoch))
    return out


def end_positions(table: TableClient, options: Options) -> dict[int, LogPosition]:
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
    return {b: LogPosition(o, latest[b].epoch if o <= latest[b].offset else None) for b, o in given.items()}


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


def log_splits(bucket: int, start: int, end: int, max_rows: int | None) -> list[LogSplit]:
    """``[start, end)`` as one split, or as pieces of at most ``max_rows`` records."""
    if end <= start:
        return []
    step = max_rows or end - start
    return [LogSplit(bucket, s, min(s + step, end)) for s in range(start, end, step)]


def log_splits_for(ranges: Mapping[int, tuple[int, int]], max_rows: int | None) -> list[LogSplit]:
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


def plan_changes(table: TableClient, options: Options) -> list[LogSplit]:
    """A batch change-feed read: the changelog records between the start and end offsets."""
    starts, ends = start_positions(table, options), end_positions(table, options)
    splits = log_splits_for({b: (starts[b].offset, ends[b].offset) for b in range(table.table.buckets)},
                            options.split_max_rows)
    return fence_pieces(table, splits, {b: p.epoch for b, p in starts.items()},
                        {b: p.epoch for b, p in ends.items()})
