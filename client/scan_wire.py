"""ScanKv answers read without copying their records: ``records`` stays a view of the bytes gRPC received.

The generated stub parses a ScanKvResponse into a protobuf message (one copy
of a multi-MB batch) and reading ``response.records`` copies it again.
:func:`parse` walks the message's top-level fields instead: the small ones
are parsed by protobuf, ``records`` becomes a zero-copy ``pyarrow.Buffer``
slice of the received bytes (what :func:`kvlease.common.codec.ipc_to_batch` reads).
:class:`TabletStub` is the tablet service's stub with ScanKv and
ScanKvStream answering such :class:`ScanAnswer` objects.
"""

from __future__ import annotations

import pyarrow as pa

from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc

_RECORDS = pb.ScanKvResponse.DESCRIPTOR.fields_by_name["records"].number
_SERVICE = "/kvlease.TabletService/"


class ScanAnswer:
    """A ScanKvResponse: every field as the message has it, but ``records`` a ``pyarrow.Buffer``."""

    __slots__ = ("head", "records")

    def __init__(self, head: pb.ScanKvResponse, records: pa.Buffer) -> None:
        self.head = head
        self.records = records

    def __getattr__(self, name: str):
        return getattr(self.head, name)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def parse(data: bytes) -> ScanAnswer | pb.ScanKvResponse:
    """``data`` (a serialized ScanKvResponse) with its records not copied; a message without records,
    or one this walk cannot read, is parsed by protobuf as it is (which raises on malformed data)."""
    head: list[bytes] = []
    records = None
    at, end = 0, len(data)
    try:
        while at < end:
            tag, field_at = _varint(data, at)
            wire = tag & 7
            if wire == 0:
                _, at_next = _varint(data, field_at)
            elif wire == 2:
                size, value_at = _varint(data, field_at)
                at_next = value_at + size
                if tag >> 3 == _RECORDS:
                    records = (value_at, at_next)
            elif wire in (1, 5):
                at_next = field_at + (8 if wire == 1 else 4)
            else:
                raise ValueError(f"wire type {wire}")
            if at_next > end:
                raise ValueError("field past the end")
            if tag >> 3 != _RECORDS:
                head.append(data[at:at_next])
            at = at_next
    except (IndexError, ValueError):
        records = None
    if records is None:
        return pb.ScanKvResponse.FromString(data)
    return ScanAnswer(pb.ScanKvResponse.FromString(b"".join(head)), pa.py_buffer(data)[records[0]:records[1]])


class TabletStub(pb_grpc.TabletServiceStub):
    """The tablet service's stub; ScanKv and ScanKvStream answer :func:`parse`'s objects."""

    def __init__(self, channel) -> None:
        super().__init__(channel)
        self.ScanKv = channel.unary_unary(_SERVICE + "ScanKv", request_serializer=pb.ScanKvRequest.SerializeToString,
                                          response_deserializer=parse, _registered_method=True)
        self.ScanKvStream = channel.unary_stream(
            _SERVICE + "ScanKvStream", request_serializer=pb.ScanKvStreamRequest.SerializeToString,
            response_deserializer=parse, _registered_method=True)
