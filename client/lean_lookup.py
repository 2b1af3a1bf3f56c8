"""Single-key (and few-key) lookups without Arrow: ``TableClient.lookup`` of a handful of keys.

A lookup of one key spends most of its client time in fixed costs of the vectorized path
(:mod:`kvlease.client.point_lookup`): building an Arrow batch of the keys, encoding it, unpacking the answer
with numpy and decoding it into a one-row Arrow batch before ``to_pylist``. For at most :data:`LEAN_KEYS` keys
of one bucket, this module encodes the keys and decodes the answered stored values row by row in Python
(:mod:`kvlease.common.codec_lean`), and sends the same packed Lookup request (:mod:`kvlease.common.lookup_wire`)
to the same leader with the same retries. It returns exactly what the vectorized path returns, and whenever it
is not sure it returns None and the caller takes the vectorized path:

- keys of another form or type than :class:`~kvlease.common.codec_lean.LeanKeys` encodes (the vectorized path
  checks them and names a bad one), keys of several buckets, a partitioned table, a client that reads rows as
  another schema or sends the plain form;
- an answer read as another schema id than the client's, or not packed, or inconsistent (the vectorized path
  asks again and answers or raises as it does).

Stored values of another schema id or format than the client's own (rows written before a schema change)
are decoded by the vectorized codec (``RowCodec.decode_values``), as the vectorized path decodes them.
"""

from __future__ import annotations

import weakref
from typing import Any

import pyarrow as pa

from kvlease.client.point_lookup import request_of, usable
from kvlease.client.table_writes import MAX_REQUEST_BYTES
from kvlease.common import errors, lookup_wire
from kvlease.common.bucketing import bucket_of
from kvlease.common.codec_lean import LeanKeys, LeanValues

#: The most keys a lookup takes this path with (more: the vectorized path, whose fixed costs then pay off); the
#: server's own few-key read takes as many (``lookup_wire.FEW``).
LEAN_KEYS = lookup_wire.FEW
_CODECS: "weakref.WeakKeyDictionary[Any, tuple[LeanKeys, LeanValues]]" = weakref.WeakKeyDictionary()


def lookup(client, keys: Any) -> list[dict | None] | None:
    """``client.lookup(keys)`` (a :class:`~kvlease.client.table.TableClient`), or None if this path does not
    take it (the module docstring)."""
    if client.partitions is not None or not client.packed_lookups or type(keys) not in (list, tuple):
        return None
    if not 0 < len(keys) <= LEAN_KEYS:
        return None
    codec = client.codec
    lean_keys, lean_values = _lean(codec)
    encoded = lean_keys.encode(keys)
    if encoded is None:
        return None
    count = codec.table.buckets
    buckets = {bucket_of(key, count) for key in codec.bucket_keys(encoded)} if count > 1 else {0}
    if len(buckets) != 1 or sum(map(len, encoded)) > MAX_REQUEST_BYTES:
        return None
    bucket = buckets.pop()
    key_data, key_offsets = lookup_wire.pack_list(encoded)
    request = request_of(client, bucket, key_data=key_data, key_offsets=key_offsets)
    response = client._call_bucket(bucket, "Lookup", request, idempotent=True)
    if not usable(client, response):
        return None
    values = _values(response.values, response.value_offsets)
    found = response.found_mask
    if values is None or len(found) != len(keys) or len(found) - found.count(0) != len(values):
        return None
    rows = lean_values.decode(values)
    if rows is None:
        rows = codec.decode_values(pa.array(values, pa.binary())).to_pylist()
    it = iter(rows)
    return [next(it) if hit else None for hit in found]


def _lean(codec) -> tuple[LeanKeys, LeanValues]:
    """The lean key encoder and value decoder of ``codec`` (made once per codec)."""
    lean = _CODECS.get(codec)
    if lean is None:
        table = codec.table
        key_columns = [table.column(k) for k in table.primary_key]
        lean = (LeanKeys(key_columns), LeanValues(table.columns, codec.schema_id, codec.reads_own_schema))
        _CODECS[codec] = lean
    return lean


def _values(data: bytes, offsets: bytes) -> list[bytes] | None:
    """The byte strings of a packed answer; None if the offsets do not describe ``data``."""
    try:
        return lookup_wire.unpack_list(data, offsets, "LookupResponse.values")
    except errors.InvalidRequestError:
        return None
