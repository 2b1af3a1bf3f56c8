"""ScanKv answers serialized by hand: a batch's values are copied once, from its chunks into the bytes gRPC sends.

A served batch becomes the bytes of a ``ScanKvResponse`` in one ``b"".join``:
the small fields (``scanner_id``, ``record_count``, ``has_more_results``,
``log_offset``, ``resume_key``) serialized by protobuf, then the ``records``
field written here — protobuf parsers read concatenated serializations as one
message, and the fields may come in any order. ``records`` is the Arrow IPC
stream :func:`kvlease.tablet.scan.batch.records_ipc` would make (byte for byte): the
schema message (a constant), the record batch message and the end-of-stream
marker. The record batch message's metadata (a flatbuffer) depends only on
the row count and the data size, which it holds as int64 at fixed places:
:class:`_BatchHeader` takes pyarrow's metadata for two batch shapes, finds
those places, and checks the result against pyarrow's for a third shape.

gRPC sends what the methods return: :class:`SerializedScans` (a server
interceptor) lets ScanKv and ScanKvStream answer these bytes as they are
(an error is still a ``ScanKvResponse`` message).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import grpc
import numpy as np
import pyarrow as pa

from kvlease.common.proto import tablet_pb2 as pb
from kvlease.tablet.scan.batch import VALUE_SCHEMA, Batch, records_ipc

#: The methods whose answers may be bytes already serialized.
METHODS = ("/kvlease.TabletService/ScanKv", "/kvlease.TabletService/ScanKvStream")
_RECORDS_TAG = bytes([pb.ScanKvResponse.DESCRIPTOR.fields_by_name["records"].number << 3 | 2])  # length-delimited
_SCHEMA_MESSAGE = VALUE_SCHEMA.serialize().to_pybytes()
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_ZEROS = bytes(8)


def _pad(size: int) -> int:
    return (size + 7) & ~7


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _pyarrow_message(rows: int, data_size: int) -> tuple[bytes, bytes]:
    """(metadata part, body) of pyarrow's record batch message for ``rows`` values of ``data_size`` bytes in all."""
    values = [b"v" * data_size] + [b""] * (rows - 1)
    message = pa.record_batch([pa.array(values, pa.binary())], schema=VALUE_SCHEMA).serialize().to_pybytes()
    body = _pad(4 * (rows + 1)) + _pad(data_size)
    return message[:-body], message[-body:]


class _BatchHeader:
    """The metadata part of a record batch message for any row count >= 1 and data size."""

    # what each int64 slot holds, by its value in pyarrow's message of 2 rows and 5 data bytes
    _ROLES = {2: "rows", 12: "offsets_size", 16: "data_at", 5: "data_size", 24: "body_size"}

    def __init__(self) -> None:
        self.template, _ = _pyarrow_message(2, 5)
        other, _ = _pyarrow_message(5, 41)
        if len(other) != len(self.template):
            raise ValueError("pyarrow's record batch metadata changes size with the batch")
        self.slots: list[tuple[int, str]] = []
        for at in range(0, len(self.template) - 7, 8):
            a, b = (struct.unpack_from("<q", m, at)[0] for m in (self.template, other))
            if a != b:
                if a not in self._ROLES:
                    raise ValueError(f"unexpected field at {at} of pyarrow's record batch metadata: {a}, {b}")
                self.slots.append((at, self._ROLES[a]))
        if {role for _at, role in self.slots} != set(self._ROLES.values()):
            raise ValueError(f"record batch metadata: found {self.slots}")
        for rows, data_size in ((1, 0), (7, 1000), (3001, 70_001)):  # the check
            metadata, body = _pyarrow_message(rows, data_size)
            offsets = np.zeros(rows + 1, np.int32)
            offsets[1:] = data_size
            if self.metadata(rows, data_size) != metadata or body != b"".join(_body(offsets, [b"v" * data_size])):
                raise ValueError(f"record batch message of {rows} rows, {data_size} bytes differs from pyarrow's")

    def metadata(self, rows: int, data_size: int) -> bytes:
        offsets_size = 4 * (rows + 1)
        values = {"rows": rows, "offsets_size": offsets_size, "data_at": _pad(offsets_size),
                  "data_size": data_size, "body_size": _pad(offsets_size) + _pad(data_size)}
        out = bytearray(self.template)
        for at, role in self.slots:
            struct.pack_into("<q", out, at, values[role])
        return bytes(out)


def _body(offsets: np.ndarray, chunks: list[bytes]) -> list[bytes | memoryview]:
    """The body of a record batch message: the offsets, then the data, each padded to 8 bytes."""
    data_size = int(offsets[-1])
    return [memoryview(offsets).cast("B"), _ZEROS[:_pad(offsets.nbytes) - offsets.nbytes], *chunks,
            _ZEROS[:_pad(data_size) - data_size]]


_HEADER = _BatchHeader()
_EMPTY_RECORDS = records_ipc([])


@dataclass(frozen=True, eq=False)
class Answer:
    """A served batch as the bytes of its ScanKvResponse (``data``), and what the service books of it."""

    data: bytes
    record_count: int
    has_more_results: bool
    resume_key: bytes
    records_size: int  # bytes of its ``records``


def answer(batch: Batch, *, scanner_id: bytes = b"", log_offset: int | None = None) -> Answer:
    """``batch`` as a ScanKvResponse's bytes (``scanner_id`` and ``log_offset`` set when given).

    The rows' bytes are copied once (the join); ``batch`` can be dropped afterwards.
    """
    rows = batch.count
    if rows:
        metadata = _HEADER.metadata(rows, batch.data_size)
        records = [_SCHEMA_MESSAGE, metadata, *_body(batch.offsets, batch.chunks), _END_OF_STREAM]
    else:
        records = [_EMPTY_RECORDS]
    size = sum(map(len, records))
    head = pb.ScanKvResponse(scanner_id=scanner_id, record_count=rows, has_more_results=batch.has_more,
                             resume_key=batch.last_key)
    if log_offset is not None:
        head.log_offset = log_offset
    data = b"".join([head.SerializeToString(), _RECORDS_TAG, _varint(size), *records])
    return Answer(data, rows, batch.has_more, batch.last_key, size)


def serialize(response: pb.ScanKvResponse | bytes) -> bytes:
    """An answer already serialized goes as it is; a message (an error, an empty answer) is serialized."""
    return response if isinstance(response, bytes) else response.SerializeToString()


class SerializedScans(grpc.ServerInterceptor):
    """Lets ScanKv and ScanKvStream return :attr:`Answer.data` (see the module docstring)."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method not in METHODS:
            return handler
        return handler._replace(response_serializer=serialize)
