"""The changelog entry format, which the tablet server writes and every client decodes.

Records are numbered 0, 1, 2, … (docs/architecture.md, "Offsets"). One entry holds
a whole write batch and the time it was appended. The format (little-endian)
is in ``docs/changelog.md``; version 3 is written, versions 1, 2 and 3 are read::

    magic b"\\xc7KL" | version u8 | base_offset u64 | count u32 | payload_len u32
        | timestamp_ms i64 (v2, v3) | leader_epoch i32 | writer_id i64 | sequence i32 (v3)
        | crc u32 | payload

``crc`` is CRC-32 of the header bytes before it followed by the payload;
``timestamp_ms`` is the append time in ms since the epoch (a v1 entry has
none). ``leader_epoch`` is the epoch of the bucket's leader that appended the
entry (replicas find where their logs diverge by it); ``writer_id`` and
``sequence`` name an idempotent writer's batch (-1: none). An entry of an
older version reads as -1 for all three. The payload is an Arrow IPC stream of one RecordBatch (change_type
int8, key binary, value binary nullable). The segment files that hold
entries are ``tablet/log/changelog.py``'s business.
"""

from __future__ import annotations

import enum
import mmap
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from kvlease.common import arrow_pandas

arrow_pandas.prepare()  # before pyarrow's first use (common/arrow_pandas.py)
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.checksum import crc32
from kvlease.common.errors import InvalidRequestError, KvLeaseError

MAGIC_PREFIX = b"\xc7KL"  # three magic bytes, then the format version
VERSION = 3  # the version written
MAGIC = MAGIC_PREFIX + bytes([VERSION])
#: magic+version, base_offset, count, payload_len, timestamp_ms, leader_epoch, writer_id, sequence, crc
HEADER = struct.Struct("<4sQIIqiqiI")
HEADER_SIZE = HEADER.size  # 48
CRC_START = HEADER_SIZE - 4  # the crc covers the header bytes before it and the payload
#: version 2 (read only): magic+version, base_offset, count, payload_len, timestamp_ms, crc
HEADER_V2 = struct.Struct("<4sQIIqI")
#: version 1 (read only): magic+version, base_offset, count, payload_len, crc
HEADER_V1 = struct.Struct("<4sQIII")
HEADER_V1_SIZE = HEADER_V1.size  # 24
NO_ID = -1  # leader epoch, writer id or sequence of an entry that has none
_MAGIC = struct.Struct("<4s")
_HEADERS = {MAGIC_PREFIX + b"\x01": HEADER_V1, MAGIC_PREFIX + b"\x02": HEADER_V2, MAGIC: HEADER}

SCHEMA = pa.schema([
    pa.field("change_type", pa.int8(), nullable=False),
    pa.field("key", pa.binary(), nullable=False),
    pa.field("value", pa.binary()),
])


class ChangeType(enum.IntEnum):
    INSERT = 0
    UPDATE_BEFORE = 1
    UPDATE_AFTER = 2
    DELETE = 3

    @property
    def short(self) -> str:
        return _SHORT[self]

    @classmethod
    def from_short(cls, text: str) -> "ChangeType":
        return _FROM_SHORT[text]

    def __str__(self) -> str:
        return self.short


_SHORT = {ChangeType.INSERT: "+I", ChangeType.UPDATE_BEFORE: "-U",
          ChangeType.UPDATE_AFTER: "+U", ChangeType.DELETE: "-D"}
_FROM_SHORT = {short: ct for ct, short in _SHORT.items()}


class ChangelogError(KvLeaseError):
    """The changelog cannot serve: closed, locked by another instance, or failed on a local write."""


class CorruptLogError(ChangelogError):
    """Damage that is not a torn tail: data would be lost if it were dropped silently."""


class FrameHeader(NamedTuple):
    """The header of a framed entry; ``size`` is the header's own length (24 in v1, 32 in v2, 48 in v3)."""

    version: int
    base_offset: int
    count: int
    payload_len: int
    timestamp_ms: int | None  # None in a v1 entry
    crc: int
    size: int
    leader_epoch: int = NO_ID  # v3 only
    writer_id: int = NO_ID  # v3 only
    sequence: int = NO_ID  # v3 only


def read_header(buf: Any, pos: int, size: int) -> FrameHeader:
    """The header at ``pos`` of ``buf`` (bytes, memoryview, mmap or pa.Buffer) holding ``size`` bytes.

    Reads only the header. Raises :class:`CorruptLogError` when fewer bytes
    than a header remain or the magic/version is not one this code reads.
    """
    header = _header(buf, pos, size)
    if isinstance(header, str):
        raise CorruptLogError(f"changelog entry at byte {pos}: {header}")
    return header


def _header(buf: Any, pos: int, size: int) -> FrameHeader | str:
    """The header at ``pos``, or what is wrong with it (too short, or an unknown magic/version)."""
    if size - pos < _MAGIC.size:
        return "incomplete header"
    magic = _MAGIC.unpack_from(buf, pos)[0]
    header = _HEADERS.get(magic)
    if header is None:
        return f"bad magic/version {magic!r}"
    if size - pos < header.size:
        return "incomplete header"
    if header is HEADER:
        _, base, count, length, timestamp, epoch, writer, sequence, crc = HEADER.unpack_from(buf, pos)
        return FrameHeader(VERSION, base, count, length, timestamp, crc, HEADER_SIZE, epoch, writer, sequence)
    if header is HEADER_V2:
        _, base, count, length, timestamp, crc = HEADER_V2.unpack_from(buf, pos)
        return FrameHeader(2, base, count, length, timestamp, crc, HEADER_V2.size)
    _, base, count, length, crc = HEADER_V1.unpack_from(buf, pos)
    return FrameHeader(1, base, count, length, None, crc, HEADER_V1_SIZE)


def _crc_ok(buf: Any, pos: int, header: FrameHeader) -> bool:
    start = pos + header.size
    return crc32(buf[start:start + header.payload_len], crc32(buf[pos:start - 4])) == header.crc


@dataclass(frozen=True)
class LogEntry:
    """Records ``base_offset`` … ``next_offset - 1`` (columns change_type, key, value), appended at
    ``timestamp_ms`` (ms since the epoch; None for an entry written before format version 2) by the
    leader of ``leader_epoch``, for writer ``writer_id``'s batch ``sequence`` (-1: none; all three
    -1 for an entry written before format version 3)."""

    base_offset: int
    records: pa.RecordBatch
    timestamp_ms: int | None = None
    leader_epoch: int = NO_ID
    writer_id: int = NO_ID
    sequence: int = NO_ID

    @property
    def count(self) -> int:
        return self.records.num_rows

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.records.num_rows

    def offsets(self) -> pa.Array:
        return pa.array(np.arange(self.base_offset, self.next_offset, dtype=np.int64))

    def timestamps(self) -> pa.Array:
        """The entry's timestamp once per record (int64; null for a v1 entry)."""
        if self.timestamp_ms is None:
            return pa.nulls(self.count, pa.int64())
        return pa.array(np.full(self.count, self.timestamp_ms, dtype=np.int64))

    @cached_property
    def batch(self) -> pa.RecordBatch:
        """The records with an ``offset`` int64 column first."""
        return pa.RecordBatch.from_arrays([self.offsets(), *self.records.columns],
                                          names=["offset", *self.records.schema.names])


def record_batch(change_types: Any, keys: Any, values: Any) -> pa.RecordBatch:
    """A batch in :data:`SCHEMA` from arrays or lists (values may hold None)."""
    try:
        return pa.RecordBatch.from_arrays(
            [pa.array(change_types, pa.int8()), pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
            schema=SCHEMA)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"not a changelog batch: {exc}") from None


def conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    if not batch.schema.equals(SCHEMA):
        try:
            batch = pa.RecordBatch.from_arrays(
                [batch.column(f.name).cast(f.type) for f in SCHEMA], schema=SCHEMA)
        except (KeyError, pa.ArrowException) as exc:
            raise InvalidRequestError(f"changelog batch does not fit {SCHEMA}: {exc}") from None
    if batch.column(1).null_count:
        raise InvalidRequestError("changelog keys must not be null")
    lo, hi = pc.min_max(batch.column(0)).values()
    if batch.column(0).null_count or lo.as_py() < 0 or hi.as_py() > 3:
        raise InvalidRequestError("change_type must be 0..3 (+I, -U, +U, -D)")
    return batch


def encode_payload(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def frame_header(base_offset: int, count: int, payload: Any, timestamp_ms: int, *, leader_epoch: int = NO_ID,
                 writer_id: int = NO_ID, sequence: int = NO_ID) -> bytes:
    """The version-3 header of an entry appended at ``timestamp_ms`` by the leader of ``leader_epoch``
    (and, for an idempotent writer, its ``writer_id`` and batch ``sequence``)."""
    head = HEADER.pack(MAGIC, base_offset, count, len(payload), timestamp_ms, leader_epoch, writer_id, sequence,
                       0)[:CRC_START]
    return head + struct.pack("<I", crc32(payload, crc32(head)))


def decode_entry(data: Any, *, from_offset: int | None = None) -> LogEntry:
    """Decode one framed entry (bytes, memoryview or pa.Buffer) of any version, checking its CRC.

    ``from_offset`` drops the records below it (for the first entry of a read).
    Raises :class:`CorruptLogError` on a bad frame.
    """
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    header = read_header(buf, 0, buf.size)
    base, count = header.base_offset, header.count
    if buf.size != header.size + header.payload_len:
        raise CorruptLogError(f"changelog entry at offset {base}: {buf.size} bytes, header says "
                              f"{header.size + header.payload_len}")
    payload = buf.slice(header.size)
    if crc32(payload, crc32(buf.slice(0, header.size - 4))) != header.crc:
        raise CorruptLogError(f"changelog entry at offset {base}: CRC mismatch")
    try:
        records = pa.ipc.open_stream(payload).read_next_batch()
    except (pa.ArrowException, StopIteration) as exc:
        raise CorruptLogError(f"changelog entry at offset {base}: bad Arrow payload: {exc}") from None
    if records.num_rows != count or not records.schema.equals(SCHEMA):
        raise CorruptLogError(f"changelog entry at offset {base}: {records.num_rows} records "
                              f"of {records.schema}, header says {count}")
    if from_offset is not None and from_offset > base:
        records = records.slice(from_offset - base)
        base = min(from_offset, base + count)
    return LogEntry(base, records, header.timestamp_ms, header.leader_epoch, header.writer_id, header.sequence)


def check_frame(mm: mmap.mmap, pos: int, size: int, expected: int,
                verify: bool) -> tuple[str | None, bool, FrameHeader | None]:
    """(problem or None, whether a torn write explains it, the header) of the entry at ``pos``."""
    header = _header(mm, pos, size)
    if isinstance(header, str):
        return header, True, None
    if pos + header.size + header.payload_len > size:
        return f"entry of {header.size + header.payload_len} bytes runs past the end of the file", True, None
    if verify and not _crc_ok(mm, pos, header):
        return "CRC mismatch", True, None
    if header.base_offset != expected or not header.count:
        # With a good CRC this was written so: a bug or a foreign file, never a torn write.
        return (f"entry says offset {header.base_offset} with {header.count} records, expected offset "
                f"{expected}"), False, None
    return None, False, header


def valid_frame_after(mm: mmap.mmap, start: int, size: int, expected: int) -> bool:
    """Whether a whole entry (any version) with a good CRC and an offset >= expected starts at or
    after ``start``."""
    while (i := mm.find(MAGIC_PREFIX, start)) != -1:
        header = _header(mm, i, size)
        if (not isinstance(header, str) and header.base_offset >= expected and header.count
                and i + header.size + header.payload_len <= size and _crc_ok(mm, i, header)):
            return True
        start = i + 1
    return False
