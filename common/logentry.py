"""The changelog entry format, which the tablet server writes and every client decodes.

Records are numbered 0, 1, 2, … (see "Offsets" in DESIGN.md). One entry holds
a whole write batch. The format (little-endian) is in ``docs/changelog.md``::

    magic b"\\xc7KL" | version u8 | base_offset u64 | count u32 | payload_len u32 | crc u32 | payload

``crc`` is CRC-32 of the 20 header bytes before it followed by the payload; the
payload is an Arrow IPC stream of one RecordBatch (change_type int8, key binary,
value binary nullable). The segment files that hold entries are
``tablet/changelog.py``'s business.
"""

from __future__ import annotations

import enum
import mmap
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import InvalidRequestError, KvLeaseError

MAGIC = b"\xc7KL\x01"  # three magic bytes, then the format version
HEADER = struct.Struct("<4sQIII")  # magic+version, base_offset, count, payload_len, crc
HEADER_SIZE = HEADER.size  # 24
CRC_START = 20  # the crc covers header[:20] and the payload

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


@dataclass(frozen=True)
class LogEntry:
    """Records ``base_offset`` … ``next_offset - 1`` (columns change_type, key, value)."""

    base_offset: int
    records: pa.RecordBatch

    @property
    def count(self) -> int:
        return self.records.num_rows

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.records.num_rows

    def offsets(self) -> pa.Array:
        return pa.array(np.arange(self.base_offset, self.next_offset, dtype=np.int64))

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


def frame_header(base_offset: int, count: int, payload: Any) -> bytes:
    head = HEADER.pack(MAGIC, base_offset, count, len(payload), 0)[:CRC_START]
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head)))


def decode_entry(data: Any, *, from_offset: int | None = None) -> LogEntry:
    """Decode one framed entry (bytes, memoryview or pa.Buffer), checking its CRC.

    ``from_offset`` drops the records below it (for the first entry of a read).
    Raises :class:`CorruptLogError` on a bad frame.
    """
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    if buf.size < HEADER_SIZE:
        raise CorruptLogError(f"changelog entry of {buf.size} bytes is shorter than its header")
    magic, base, count, length, crc = HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise CorruptLogError(f"changelog entry has bad magic/version {magic!r}")
    if buf.size != HEADER_SIZE + length:
        raise CorruptLogError(f"changelog entry at offset {base}: {buf.size} bytes, header says "
                              f"{HEADER_SIZE + length}")
    payload = buf.slice(HEADER_SIZE)
    if zlib.crc32(payload, zlib.crc32(buf.slice(0, CRC_START))) != crc:
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
    return LogEntry(base, records)


def check_frame(mm: mmap.mmap, pos: int, size: int, expected: int,
                 verify: bool) -> tuple[str | None, bool, int, int]:
    """(problem or None, whether a torn write explains it, count, payload length) at ``pos``."""
    if size - pos < HEADER_SIZE:
        return "incomplete header", True, 0, 0
    magic, base, count, length, crc = HEADER.unpack_from(mm, pos)
    if magic != MAGIC:
        return f"bad magic/version {magic!r}", True, 0, 0
    end = pos + HEADER_SIZE + length
    if end > size:
        return f"entry of {HEADER_SIZE + length} bytes runs past the end of the file", True, 0, 0
    if verify and zlib.crc32(mm[pos + HEADER_SIZE:end], zlib.crc32(mm[pos:pos + CRC_START])) != crc:
        return "CRC mismatch", True, 0, 0
    if base != expected or not count:
        # With a good CRC this was written so: a bug or a foreign file, never a torn write.
        return f"entry says offset {base} with {count} records, expected offset {expected}", False, 0, 0
    return None, False, count, length


def valid_frame_after(mm: mmap.mmap, start: int, size: int, expected: int) -> bool:
    """Whether a whole entry with a good CRC and an offset >= expected starts at or after ``start``."""
    while (i := mm.find(MAGIC, start)) != -1 and i + HEADER_SIZE <= size:
        _, base, count, length, crc = HEADER.unpack_from(mm, i)
        end = i + HEADER_SIZE + length
        if (base >= expected and count and end <= size
                and zlib.crc32(mm[i + HEADER_SIZE:end], zlib.crc32(mm[i:i + CRC_START])) == crc):
            return True
        start = i + 1
    return False
