"""The wire form of snapshot listings and acquire answers, built per bucket in microseconds.

A ``GetLatestKvSnapshots`` of a 1,000-partition table lists 4,000 snapshots; building a
``KvSnapshotPb`` message per row cost ~30 us (protobuf messages built from keyword arguments,
a nested bucket message each). A stored handle never changes, so its encoded fields 1-6 are
kept (:class:`SnapshotRowEncoder`), and a listing is those bytes, each row's ``leased_by`` and
``retained`` appended, and the rows framed as the response's repeated field: parsed once into
the response message (in C). Protobuf encodes a message as its fields in any order, so the
bytes mean exactly what :func:`kvlease.common.wire.handle_to_pb` builds (a test compares them).

An acquire that got every snapshot it asked for answers ``acquired`` with the request's own
``snapshots`` (copied as one field) instead of building a message per bucket. Any other answer (a
``lease acquire --latest``, whose request names no snapshot: 4,000 entries for a 1,000-partition table)
is built from each acquired snapshot's ``BucketSnapshotPb`` bytes, kept per (bucket, snapshot id) while
the answers name it (:class:`AcquireAnswers`: ~2 ms instead of ~8 for 4,000 entries).
"""

from __future__ import annotations

import threading
from typing import Iterable

from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.wire import add_bucket_snapshots, handle_to_pb

#: Encoded handles kept at most (one per stored snapshot listed; beyond it the cache starts again).
MAX_CACHED = 262_144

_UINT64 = (1 << 64) - 1


_ONE_BYTE = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (a negative int64 as its 10-byte two's complement)."""
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte, the length, the payload."""
    return bytes((tag,)) + varint(len(payload)) + payload


_LEASED_BY = 0x3A  # KvSnapshotPb.leased_by (7, length-delimited)
_RETAINED = b"\x40\x01"  # KvSnapshotPb.retained (8, varint) = true
_SNAPSHOTS_TAG = b"\x1a"  # Get/ListKvSnapshotsResponse.snapshots (3, length-delimited)
_TABLE_ID = 0x10  # Get/ListKvSnapshotsResponse.table_id (2, varint)


class SnapshotRowEncoder:
    """Listing rows ``(handle, leased_by, retained)`` as a Get/ListKvSnapshotsResponse; thread-safe (the gRPC
    handlers share one)."""

    def __init__(self, max_cached: int = MAX_CACHED) -> None:
        self.max_cached = max_cached
        self._cache: dict[tuple[TableBucket, int], tuple[SnapshotHandle, bytes]] = {}
        self._lock = threading.Lock()

    def handle_bytes(self, handle: SnapshotHandle) -> bytes:
        """The handle's fields 1-6 encoded (kept while the store holds this very handle)."""
        key = (handle.bucket, handle.snapshot_id)
        cached = self._cache.get(key)
        if cached is not None and cached[0] is handle:
            return cached[1]
        data = handle_to_pb(handle, (), False).SerializeToString()
        with self._lock:
            if len(self._cache) >= self.max_cached:
                self._cache.clear()
            self._cache[key] = (handle, data)
        return data

    def response(self, response_cls, table_id: int, rows: Iterable[tuple[SnapshotHandle, Iterable[str], bool]]):
        """What ``response_cls(table_id=table_id, snapshots=[handle_to_pb(h, leased, kept) for h, leased, kept
        in rows])`` builds."""
        parts = [bytes((_TABLE_ID,)) + varint(table_id)] if table_id else []
        handle_bytes = self.handle_bytes
        # a row is its handle's bytes, then its fields 7 and 8 (leased_by, retained): the rows of one listing
        # share a few of those, each encoded once (by leased_by, for rows not retained and retained)
        tails: tuple[dict, dict] = ({}, {})
        for handle, leased_by, retained in rows:
            row = handle_bytes(handle)
            known = tails[bool(retained)]
            key = tuple(leased_by)
            tail = known.get(key)
            if tail is None:
                tail = known[key] = b"".join([_field(_LEASED_BY, lease_id.encode()) for lease_id in sorted(key)]
                                             + ([_RETAINED] if retained else []))
            parts += (_SNAPSHOTS_TAG, varint(len(row) + len(tail)), row, tail)
        return response_cls.FromString(b"".join(parts))


class AcquireAnswers:
    """Acquires' answers (see the module docstring); thread-safe (the gRPC handlers share one)."""

    def __init__(self, max_cached: int = MAX_CACHED) -> None:
        self.max_cached = max_cached
        self._entries: dict[tuple[TableBucket, int], bytes] = {}  # (bucket, snapshot id) -> its framed entry
        self._lock = threading.Lock()

    def response(self, request: pb.AcquireKvSnapshotLeaseRequest, outcome) -> pb.AcquireKvSnapshotLeaseResponse:
        """An acquire's answer (``outcome``: :class:`kvlease.leases.events.AcquireOutcome`): with nothing
        unavailable, what it acquired is what it asked for, the request's own ``snapshots`` (every bucket once:
        checked before); else the acquired snapshots by :meth:`TableBucket.sort_key` and the unavailable ones."""
        if not outcome.unavailable and len(outcome.acquired) == len(request.snapshots):
            return pb.AcquireKvSnapshotLeaseResponse(expiration_time_ms=outcome.expiration_time,
                                                     acquired=request.snapshots)
        known, entry = self._entries.get, self._entry
        data = b"".join([known(item) or entry(item)
                         for item in sorted(outcome.acquired.items(), key=lambda item: item[0].sort_key())])
        response = pb.AcquireKvSnapshotLeaseResponse.FromString(data)  # the acquired entries, parsed in C
        response.expiration_time_ms = outcome.expiration_time
        add_bucket_snapshots(response.unavailable, outcome.unavailable)
        return response

    def _entry(self, item: tuple[TableBucket, int]) -> bytes:
        """``acquired``'s entry for (bucket, snapshot id), framed, and kept."""
        alone = pb.AcquireKvSnapshotLeaseResponse()  # an answer of this entry only: its bytes are the entry, framed
        add_bucket_snapshots(alone.acquired, dict([item]))
        data = alone.SerializeToString()
        with self._lock:
            if len(self._entries) >= self.max_cached:
                self._entries.clear()
            self._entries[item] = data
        return data

