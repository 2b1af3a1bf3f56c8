"""Point lookups of a table's rows by primary key: ``TableClient.lookup_batch``, split by bucket, sent to leaders.

The keys are checked and encoded once (:mod:`kvlease.client.table_input`), split by bucket and sent, one request
per bucket (in slices of about ``MAX_REQUEST_BYTES``), in parallel on the client's pool; the answers are put
back in input order, a row of nulls where a key has no row.

Two wire forms of the same lookup (tablet.proto, ``LookupRequest``):

- packed (the default): the encoded keys as two byte strings (:mod:`kvlease.common.lookup_wire`); the leader
  answers the found rows' stored values and the schema id it reads rows as, and this client decodes them
  (:meth:`kvlease.common.codec.RowCodec.decode_values`, as a scan's rows are). No Arrow IPC stream and no
  Python object per row on the server: one multi-get, its values joined as they are. The leader finds the rows
  exactly as for the plain form (``BucketReads._lookup``: committed rows only, the row TTL's expired rows not
  found, a deposed leader or one whose files failed answering an error instead);
- plain: Arrow IPC key columns in, decoded rows (Arrow IPC) out. A client that reads rows as another schema
  than the table's (``read_as``) uses it, and so does a packed lookup whose answer was read as another schema
  id than this client's (the table's schema changed since it was opened): it is sent again in plain form,
  so a reader sees the rows the plain form shows.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from kvlease.client import table_input
from kvlease.client.table_writes import slices
from kvlease.common import errors, lookup_wire
from kvlease.common.codec import batch_to_ipc, ipc_to_batch
from kvlease.common.proto import tablet_pb2 as pb

#: ``(bucket, key columns of that bucket, the same keys encoded (a binary array), their indices in the input)``.
KeyPart = tuple[int, pa.RecordBatch, pa.Array, np.ndarray]


def lookup_batch(client, keys: Sequence[Any] | pa.RecordBatch | pa.Table, packed: bool = True) -> pa.RecordBatch:
    """The rows of ``keys`` (table schema), one per key in input order, nulls where a key has no row, from
    ``client`` (a :class:`~kvlease.client.table.TableClient` of an unpartitioned table or of a partition);
    ``packed``: the wire form (see the module docstring)."""
    codec = client.codec
    batch = table_input.key_batch(codec, keys)
    if batch.num_rows == 0:
        return table_input.concat([], codec.schema)
    parts = split_keys(codec, batch, codec.encode_checked_key_array(batch))
    results = client.map_parallel(lambda part: _lookup_bucket(client, part, packed), parts)
    for _result, error in results:
        if error is not None:
            raise error
    if len(parts) == 1 and results[0][0][0].all():  # every key found, in input order already
        return results[0][0][1]
    position = np.zeros(batch.num_rows, dtype=np.int64)  # index into the concatenated found rows
    found_mask = np.zeros(batch.num_rows, dtype=bool)
    found_rows, base = [], 0
    for (_bucket, _keys, _encoded, indices), ((found, rows), _error) in zip(parts, results):
        hit = indices[found]
        found_mask[hit] = True
        position[hit] = base + np.arange(rows.num_rows)
        base += rows.num_rows
        found_rows.append(rows)
    everything = table_input.concat(found_rows, codec.schema)
    return everything.take(pa.array(position, mask=~found_mask))


def split_keys(codec, batch: pa.RecordBatch, encoded: pa.Array) -> list[KeyPart]:
    """Keys (``batch``, and ``encoded``: the same encoded) divided among the table's buckets (a stable order
    within each)."""
    n = codec.table.buckets
    if n == 1:
        return [(0, batch, encoded, np.arange(len(encoded)))]
    order, groups = table_input.by_bucket(codec.buckets(encoded.to_pylist()).astype(np.int64), n)
    taken = pa.array(order)
    ordered, ordered_keys = batch.take(taken), encoded.take(taken)
    return [(bucket, ordered.slice(start, count), ordered_keys.slice(start, count), order[start:start + count])
            for bucket, start, count in groups]


def _lookup_bucket(client, part: KeyPart, packed: bool) -> tuple[np.ndarray, pa.RecordBatch]:
    bucket, rows_in, keys, indices = part
    found, batches = [], []
    for start, length in slices(len(keys), keys.get_total_buffer_size()):
        answer = _packed(client, bucket, keys.slice(start, length)) if packed and client.packed_lookups else None
        if answer is None:
            answer = _plain(client, bucket, rows_in.slice(start, length))
        found.append(answer[0])
        batches.append(answer[1])
    flags = np.concatenate(found)
    rows = table_input.concat(batches, client.codec.schema)
    if len(flags) != len(indices) or int(flags.sum()) != rows.num_rows:
        raise errors.UnknownServerError(f"bucket {bucket}: Lookup answered {len(flags)} flags and "
                                        f"{rows.num_rows} rows for {len(indices)} keys")
    return flags, rows


def request_of(client, bucket: int, **fields: Any) -> pb.LookupRequest:
    """A LookupRequest of ``client``'s table (or partition) and ``bucket`` with ``fields``."""
    table = client.table
    return pb.LookupRequest(table_id=table.table_id, partition_id=table.partition_id, bucket=bucket, **fields)


def _packed(client, bucket: int, keys: pa.Array) -> tuple[np.ndarray, pa.RecordBatch] | None:
    """The found flags and rows of encoded ``keys``, packed; None if the answer must be asked for plain (its
    rows were read as another schema id than this client's, or the server answers the plain form only)."""
    data, offsets = lookup_wire.pack(keys)
    response = client._call_bucket(bucket, "Lookup", request_of(client, bucket, key_data=data, key_offsets=offsets),
                                   idempotent=True)
    codec = client.codec
    if not usable(client, response):
        return None
    try:
        values = lookup_wire.unpack(response.values, response.value_offsets, "LookupResponse.values")
    except errors.InvalidRequestError as exc:
        raise errors.UnknownServerError(f"bucket {bucket}: {exc.message}") from None
    return lookup_wire.unpack_mask(response.found_mask), codec.decode_values(values)


def usable(client, response: pb.LookupResponse) -> bool:
    """Whether a packed answer can be decoded by ``client``: packed, and read as its schema id. Read as another
    (the table's schema changed since the client was opened: ids only move forward), it never will be again, so
    the client asks plain from then on (``packed_lookups`` off) instead of asking twice every time."""
    if response.value_offsets and response.schema_id != client.codec.table.schema_id:
        client.packed_lookups = False
    return bool(response.value_offsets) and response.schema_id == client.codec.table.schema_id


def _plain(client, bucket: int, keys: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
    """The found flags and rows of ``keys`` (key columns), sent as Arrow IPC, answered as decoded rows."""
    codec = client.codec
    request = request_of(client, bucket, keys=batch_to_ipc(keys))
    response = client._call_bucket(bucket, "Lookup", request, idempotent=True)
    rows = ipc_to_batch(response.rows) if response.rows else table_input.concat([], codec.schema)
    return np.asarray(response.found, dtype=bool), rows
