"""Bucket-key prefixes of one table: Python values or Arrow batches -> checked batches -> encoded bytes.

A prefix is a value of every bucket-key column (common/bucket_keys.py): a dict ``{column: value}``, a
tuple in bucket-key order, or a bare value when the bucket key has one column; or an Arrow batch of the
bucket-key columns, one prefix per row. Its encoding is the bytes those columns have at the start of
every key of its rows (:class:`~kvlease.common.codec_keys.KeyCodec` of the bucket-key columns), and its
bucket ``crc32(those bytes) % buckets``, the bucket each of its rows is in.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from kvlease.common.bucketing import bucket_array
from kvlease.common.codec import RowCodec
from kvlease.common.codec_keys import KeyCodec
from kvlease.common.errors import InvalidRequestError, InvalidRowError, show


class PrefixCodec:
    """The prefixes of ``codec``'s table; InvalidRequestError if the table has no bucket key."""

    def __init__(self, codec: RowCodec) -> None:
        table = codec.table
        if not table.bucket_key:
            raise InvalidRequestError(f"table {table.path} has no bucket key: a prefix lookup needs one "
                                      f"(table create --bucket-key COL[,COL…]; it is fixed at create)")
        self.codec = codec
        self.names: tuple[str, ...] = table.bucket_key
        self.schema = codec.key_schema_of(self.names)
        self.keys = KeyCodec(codec.keys.columns[:len(self.names)], self.schema)

    def to_batch(self, prefixes: Any) -> pa.RecordBatch:
        """The prefixes as a checked batch of the bucket-key columns; InvalidRowError naming the first bad one
        (an unknown or missing column, a null, a value of the wrong type)."""
        if isinstance(prefixes, pa.Table):
            prefixes = prefixes.combine_chunks().to_batches()[0] if prefixes.num_rows else \
                pa.RecordBatch.from_pylist([], schema=prefixes.schema)
        if isinstance(prefixes, pa.RecordBatch):
            self._check_names(prefixes.schema.names, "the batch")
            return self.codec.checked_key_columns(prefixes, self.names)
        if isinstance(prefixes, (str, bytes, dict)) or not isinstance(prefixes, Sequence):
            raise InvalidRowError(f"prefixes must be a list of prefixes (dicts of bucket-key column -> value, "
                                  f"tuples in bucket-key order ({', '.join(self.names)}), or values of a one-column "
                                  f"bucket key), an Arrow RecordBatch or Table, got {type(prefixes).__name__} "
                                  f"{show(prefixes)}; put a single prefix in a list")
        columns: list[list] = [[] for _ in self.names]
        for i, prefix in enumerate(prefixes):
            for column, value in zip(columns, self._values(i, prefix)):
                column.append(value)
        return self.codec.columns_to_batch(self.names, columns)

    def _values(self, i: int, prefix: Any) -> tuple:
        """Prefix ``i``'s values in bucket-key order."""
        n = len(self.names)
        if isinstance(prefix, dict):
            self._check_names(list(prefix), f"prefix {i}")
            return tuple(prefix[name] for name in self.names)
        if isinstance(prefix, (tuple, list)):
            if len(prefix) != n:
                raise InvalidRowError(f"prefix {i}: the bucket key has {n} column(s) ({', '.join(self.names)}), "
                                      f"got {len(prefix)} value(s) {show(prefix)}")
            return tuple(prefix)
        if n == 1:
            return (prefix,)
        raise InvalidRowError(f"prefix {i}: the bucket key has {n} columns ({', '.join(self.names)}); give a "
                              f"tuple or a dict, got {show(prefix)}")

    def _check_names(self, names: Sequence[str], what: str) -> None:
        for name in names:
            if name not in self.names:
                raise InvalidRowError(f"{what}: column {show(name)} is not in the bucket key "
                                      f"({', '.join(self.names)}) of table {self.codec.table.path}")
        for name in self.names:
            if name not in names:
                raise InvalidRowError(f"{what}: bucket key column {show(name)} is missing (a prefix names every "
                                      f"bucket-key column: {', '.join(self.names)})")

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        """The encoded prefix of every row of a checked batch (:meth:`to_batch`)."""
        return self.keys.encode_list(batch) if batch.num_rows else []

    def buckets(self, encoded: list[bytes]) -> np.ndarray:
        """The bucket of each encoded prefix (numpy ``uint64``)."""
        return bucket_array(encoded, self.codec.table.buckets)
