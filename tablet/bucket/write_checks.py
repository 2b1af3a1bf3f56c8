"""What a bucket checks of a write before anything is appended: each key is of its bucket, and no row
is over ``table.max-row-size``. Each failure names the first offending row; nothing is written."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kvlease.common.bucketing import bucket_of
from kvlease.common.codec import RowCodec
from kvlease.common.codec_arrays import value_offsets
from kvlease.common.errors import InvalidRowError, RecordTooLargeError, show
from kvlease.common.lookup_wire import FEW as FEW_KEYS


def check_bucket(codec: RowCodec, bucket: int | None, keys: list[bytes], what: str) -> None:
    """InvalidRowError naming the first encoded key that does not hash to ``bucket`` (None: not checked)."""
    table = codec.table
    if bucket is None or not keys or table.buckets == 1:
        return  # one bucket: every key is its
    n = table.buckets
    hashed = "bucket key" if table.bucket_key else "key"
    if len(keys) <= FEW_KEYS:  # a single-key lookup: no numpy fixed costs
        buckets = [bucket_of(key, n) for key in codec.bucket_keys(keys)]
        wrong = [i for i, got in enumerate(buckets) if got != bucket]
    else:
        buckets = codec.buckets(keys)
        wrong = np.flatnonzero(buckets != bucket).tolist()
    if not wrong:
        return
    i = int(wrong[0])
    key = codec.decode_keys([keys[i]]).to_pylist()[0]
    part = "" if table.partition_id is None else f" partition {table.partition_name} (id {table.partition_id})"
    raise InvalidRowError(f"{what} row {i} (key {show(key)}) belongs to bucket {int(buckets[i])} of table "
                          f"{table.table_id}{part}, not to bucket {bucket}; {len(wrong)} of {len(keys)} "
                          f"rows are of another bucket (bucket = crc32(encoded {hashed}) % {n})",
                          row=i, bucket=int(buckets[i]))


def check_row_sizes(codec: RowCodec, max_row_bytes: int, keys: pa.Array, values: pa.Array) -> None:
    """RecordTooLargeError naming the first row whose encoded key + value exceeds ``max_row_bytes``."""
    if not len(keys):
        return
    sizes = np.diff(value_offsets(keys)).astype(np.int64) + np.diff(value_offsets(values))
    big = np.flatnonzero(sizes > max_row_bytes)
    if not big.size:
        return
    i = int(big[0])
    key = codec.decode_keys(keys.slice(i, 1)).to_pylist()[0]
    raise RecordTooLargeError(f"upsert row {i} (key {show(key)}) is {int(sizes[i])} bytes, over the limit of "
                              f"{max_row_bytes} bytes (table.max-row-size); {big.size} of {len(keys)} "
                              f"rows are too large", row=i, size=int(sizes[i]))
