"""A table client's writes to its buckets: each bucket's part in requests of at most :data:`MAX_REQUEST_BYTES`,
numbered by the bucket's idempotent writer (:mod:`kvlease.client.idempotent`), the buckets in parallel.

Also what a partial update sends (docs/merge-engines.md, "Partial updates"): :func:`partial_batches` cuts
dict rows into runs naming the same columns (a missing key is a column not written, ``None`` a null), each
run one checked batch of just the columns it writes; an Arrow batch's columns are the ones written.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from kvlease.client import table_input
from kvlease.common import errors
from kvlease.common.codec import RowCodec, batch_to_ipc
from kvlease.common.proto import tablet_pb2 as pb

#: A bucket's part of a write or lookup bigger than this (Arrow bytes) is sent as several requests.
#: An update writes the before- and after-image, so one write's changelog entry stays well under
#: common.limits.MAX_ENTRY_BYTES and FetchLog can always return it.
MAX_REQUEST_BYTES = 16 << 20


def write_parts(client, parts: list[table_input.Part], field: str, partial: bool = False) -> dict[int, tuple[int, int]]:
    """Send each bucket's part as ``field`` ("upserts", "retracts" or "deletes") of PutKv requests; ``{bucket:
    (base_offset, next_offset)}``. A bucket that fails raises after the others finish, with the buckets
    written (``details["written"]``) and the rows acknowledged per bucket (``details["written_rows"]``)."""
    table_id, partition_id = client.table.table_id, client.table.partition_id
    acked: dict[int, int] = {}  # bucket -> rows acknowledged

    def write_bucket(part) -> tuple[int, int]:
        bucket, rows, _ = part
        offsets = []
        with client._writers.use(bucket) as writer:  # its batches one at a time, in order
            for chunk in chunks(rows):
                request = pb.PutKvRequest(table_id=table_id, partition_id=partition_id, bucket=bucket,
                                          schema_id=client.codec.schema_id, partial=partial,
                                          **{field: batch_to_ipc(chunk)})
                response = writer.send(request, lambda watch: client._call_bucket(
                    bucket, "PutKv", request, idempotent=True, fenced=True, watch=watch))
                offsets.append((response.base_offset, response.next_offset))
                acked[bucket] = acked.get(bucket, 0) + chunk.num_rows
        return offsets[0][0], offsets[-1][1]

    results = client.map_parallel(write_bucket, parts)
    written = {part[0]: result for part, (result, error) in zip(parts, results) if error is None}
    failed = [(part[0], error) for part, (_, error) in zip(parts, results) if error is not None]
    if failed:
        bucket, error = failed[0]
        if isinstance(error, errors.KvLeaseError):
            error.details.setdefault("bucket", bucket)
            error.details["written"] = written
            error.details["written_rows"] = dict(acked)
        raise error
    return written


def partial_batches(codec: RowCodec, rows: Sequence[dict] | pa.RecordBatch | pa.Table) -> list[pa.RecordBatch]:
    """A partial update's rows as checked batches of the columns each writes, in input order (module docstring);
    InvalidRowError naming the row for a row without its primary key."""
    if isinstance(rows, pa.Table):
        rows = table_input.table_to_batch(rows)
    if isinstance(rows, pa.RecordBatch):
        return [_written(codec, codec.validate(rows), rows.schema.names)]
    table_input.check_collection(rows, "rows", "row", "dicts")
    rows = list(rows)
    batches, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or not isinstance(rows[i], dict) or rows[i].keys() != rows[start].keys():
            names = list(rows[start]) if isinstance(rows[start], dict) else []
            try:
                batches.append(_written(codec, codec.to_batch(rows[start:i]), names))
            except errors.InvalidRowError as exc:  # name the row in the input, not in the run
                raise errors.InvalidRowError(_renumber(exc.message, start), **exc.details) from None
            start = i
    return batches


def _written(codec: RowCodec, full: pa.RecordBatch, names: Sequence[str]) -> pa.RecordBatch:
    """The columns ``names`` of a checked full batch, in the table's order (the key always)."""
    given = set(names) | set(codec.table.primary_key)
    return full.select([c.name for c in codec.table.columns if c.name in given])


def _renumber(message: str, offset: int) -> str:
    if offset and message.startswith("row "):
        number, _, rest = message[4:].partition(",")
        if number.isdigit():
            return f"row {int(number) + offset},{rest}"
    return message


def chunks(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``batch`` in slices of at most about :data:`MAX_REQUEST_BYTES` each."""
    if batch.nbytes <= MAX_REQUEST_BYTES or batch.num_rows <= 1:
        return [batch]
    return [batch.slice(start, length) for start, length in slices(batch.num_rows, batch.nbytes)]


def slices(count: int, size: int) -> list[tuple[int, int]]:
    """``(start, length)`` of equal slices of ``count`` items of ``size`` bytes in all, each of at most about
    :data:`MAX_REQUEST_BYTES` (one slice of all when they fit or there is at most one item)."""
    if size <= MAX_REQUEST_BYTES or count <= 1:
        return [(0, count)]
    step = -(-count // -(-size // MAX_REQUEST_BYTES))
    return [(start, step) for start in range(0, count, step)]
