"""Prefix lookups on a bucket: every row whose key starts with a bucket-key prefix, by RocksDB range scans.

The encoded bucket-key columns are a byte prefix of every key of their rows, and no other key starts with
them (common/bucket_keys.py), so a prefix's rows are exactly the keys in ``[prefix, prefix_upper(prefix))``.
The scans read one RocksDB iterator made under the write lock: a consistent view of the committed rows
(a replicated bucket applies an entry to RocksDB only once the high watermark passes it, as Lookup reads).
An answer carries about ``max_bytes`` of rows; a prefix cut short is resumed after its last key
(``PrefixLookupResponse.resume_key``), each answer from a view of its own.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa

from kvlease.common.bucket_keys import prefix_upper
from kvlease.common.errors import InvalidRequestError, InvalidRowError, show
from kvlease.common.prefix_codec import PrefixCodec
from kvlease.common.row_expiry import expired_mask
from kvlease.tablet.bucket.state import BucketShared
from kvlease.tablet.store.kvstore import KvStore

#: An answer's rows, about (the row that crosses it is the last), when the request names no size.
DEFAULT_MAX_BYTES = 4 << 20


class PrefixRows(NamedTuple):
    rows: pa.RecordBatch  # the rows found, prefix by prefix, each prefix's in key order
    counts: list[int]  # rows of each of the first len(counts) prefixes
    resume_key: bytes  # b"" unless the last counted prefix has more rows: its last key answered
    log_offset: int  # the first changelog offset not in the view read


def prefix_rows(bucket: BucketShared, prefixes: pa.RecordBatch, start_after: bytes = b"",
                max_bytes: int = 0, check_current: Callable[[KvStore], None] = lambda kv: None) -> PrefixRows:
    """The rows of ``prefixes`` (a batch of the bucket-key columns) in this bucket; ``start_after``: the first
    prefix's rows after that key only. InvalidRequestError for a table without a bucket key, InvalidRowError
    for a bad prefix or one of another bucket."""
    codec = bucket.spec.codec
    prefix_codec = PrefixCodec(codec)
    encoded = prefix_codec.encode(prefix_codec.to_batch(prefixes))
    _check_bucket(prefix_codec, bucket.spec.bucket, encoded)
    if start_after and (not encoded or not start_after.startswith(encoded[0])):
        raise InvalidRequestError("start_after_key is not a key of the first prefix")
    budget = max_bytes if max_bytes > 0 else DEFAULT_MAX_BYTES
    values: list[bytes] = []
    counts: list[int] = []
    resume, size = b"", 0
    with bucket.files.use() as (_changelog, kv):
        with bucket.write_lock:
            check_current(kv)  # BucketReads.check_current: failed files behind the high watermark are not read
            snapshot = kv.snapshot(kv.applied_offset)
        with snapshot:
            for i, prefix in enumerate(encoded):
                lower = start_after + b"\x00" if i == 0 and start_after else prefix
                count, last, cut = 0, b"", False
                for key, value in snapshot.rows(lower, prefix_upper(prefix)):
                    if size >= budget:  # never on the first prefix's first row: an answer has one at least
                        cut = True
                        break
                    values.append(value)
                    count, last, size = count + 1, key, size + len(key) + len(value)
                if cut and not count:
                    break  # this prefix not begun: the next request starts with it
                counts.append(count)
                if cut:
                    resume = last
                    break
    rows = codec.decode_values(values)
    if codec.table.row_ttl is not None:  # an expired row not deleted yet is not found (common/row_expiry.py)
        rows, counts = _live(bucket, rows, counts)
    return PrefixRows(rows, counts, resume, snapshot.log_offset)


def _live(bucket: BucketShared, rows: pa.RecordBatch, counts: list[int]) -> tuple[pa.RecordBatch, list[int]]:
    """``rows`` without those the table's row TTL expired, and each prefix's count of the rest."""
    expired = expired_mask(bucket.spec.codec.table.row_ttl, rows, bucket.files.settings.now_ms())
    if not expired.any():
        return rows, counts
    starts = np.cumsum([0, *counts])
    live = [c - int(expired[start:start + c].sum()) for start, c in zip(starts, counts)]
    return rows.filter(pa.array(~expired)), live


def _check_bucket(prefix_codec: PrefixCodec, bucket: int | None, encoded: list[bytes]) -> None:
    """InvalidRowError naming the first prefix whose rows are in another bucket than ``bucket``."""
    n = prefix_codec.codec.table.buckets
    if bucket is None or n == 1 or not encoded:
        return
    buckets = prefix_codec.buckets(encoded)
    wrong = np.flatnonzero(buckets != bucket)
    if wrong.size:
        i = int(wrong[0])
        raise InvalidRowError(f"prefix {i} ({show(encoded[i])}) belongs to bucket {int(buckets[i])}, not to bucket "
                              f"{bucket} (bucket = crc32(encoded bucket key) % {n})", row=i, bucket=int(buckets[i]))
