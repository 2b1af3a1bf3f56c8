"""Prefix lookups of the table client: every row whose key starts with a bucket-key prefix.

The prefixes (common/prefix_codec.py) are checked, encoded and hashed once, split by bucket, and each
bucket's are sent to its leader as ``PrefixLookup`` requests (in parallel across buckets, on the client's
pool), each answered by RocksDB range scans of committed rows (tablet/bucket/prefix_reads.py). An answer
carries about ``max_bytes`` of rows; a prefix cut short is asked for again after its last key, so a large
prefix is read in several answers, each a consistent view of its own. A call is a read: retried and
re-routed like Lookup (idempotent). A partitioned table's bucket key holds its partition columns, so each
prefix names its partition: the prefixes go through their partitions' clients (none: no rows).

The rows come back prefix by prefix in the order given (a prefix given twice: its rows twice), each
prefix's in key order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from kvlease.client import table_input
from kvlease.common import errors
from kvlease.common.codec import batch_to_ipc, ipc_to_batch
from kvlease.common.prefix_codec import PrefixCodec
from kvlease.common.proto import tablet_pb2 as pb

#: Rows per answer, about (the server's default if 0).
ANSWER_BYTES = 4 << 20


def lookup_prefix_batch(client, prefixes: Any, max_bytes: int = ANSWER_BYTES) -> pa.RecordBatch:
    """The rows of every prefix of ``prefixes`` (see the module docstring) in one batch of the table's
    schema; InvalidRequestError for a table without a bucket key, InvalidRowError for a bad prefix."""
    batch = PrefixCodec(client.codec).to_batch(prefixes)
    per_prefix = (_by_partition if client.partitions is not None else _per_prefix)(client, batch, max_bytes)
    return table_input.concat([rows for rows in per_prefix if rows.num_rows], client.codec.schema)


def _per_prefix(client, batch: pa.RecordBatch, max_bytes: int) -> list[pa.RecordBatch]:
    """The rows of each prefix of a checked batch, one batch per prefix: the buckets' requests in parallel."""
    coder = PrefixCodec(client.codec)
    encoded = coder.encode(batch)
    buckets = coder.buckets(encoded).astype(np.int64) if client.table.buckets > 1 else np.zeros(len(encoded), int)
    groups = [(int(b), np.flatnonzero(buckets == b)) for b in np.unique(buckets)]
    results = client.map_parallel(lambda group: bucket_rows(client, group[0], batch.take(pa.array(group[1])),
                                                            max_bytes)[0], groups)
    per_prefix = [_empty(client)] * batch.num_rows
    for (_bucket, indices), (found, error) in zip(groups, results):
        if error is not None:
            raise error
        for index, rows in zip(indices.tolist(), found):
            per_prefix[index] = rows
    return per_prefix


def _empty(client) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=client.codec.schema)


def bucket_rows(client, bucket: int, prefixes: pa.RecordBatch,
                max_bytes: int = ANSWER_BYTES) -> tuple[list[pa.RecordBatch], int]:
    """The rows of each of ``prefixes`` (a checked batch, all of ``bucket``), one batch per prefix, and the
    first changelog offset not in the views read (the latest of its answers'): requests until every prefix
    is answered, each from the first prefix not answered yet (after the key an answer was cut at)."""
    table = client.table
    out: list[list[pa.RecordBatch]] = [[] for _ in range(prefixes.num_rows)]
    start, after, log_offset = 0, b"", 0
    while start < prefixes.num_rows:
        request = pb.PrefixLookupRequest(table_id=table.table_id, partition_id=table.partition_id, bucket=bucket,
                                         prefixes=batch_to_ipc(prefixes.slice(start)), start_after_key=after,
                                         max_bytes=max_bytes)
        response = client._call_bucket(bucket, "PrefixLookup", request, idempotent=True)
        rows = ipc_to_batch(response.rows) if response.rows else None
        counts = list(response.counts)
        total = rows.num_rows if rows is not None else 0
        if sum(counts) != total or not counts or len(counts) > prefixes.num_rows - start:
            raise errors.UnknownServerError(f"bucket {bucket}: PrefixLookup answered counts {counts[:10]} and "
                                            f"{total} rows for {prefixes.num_rows - start} prefixes")
        offset = 0
        for i, count in enumerate(counts):
            if count:
                out[start + i].append(rows.slice(offset, count))
            offset += count
        after, log_offset = response.resume_key, max(log_offset, response.log_offset)
        start += len(counts) - (1 if after else 0)
    return [table_input.concat(parts, client.codec.schema) for parts in out], log_offset


def _by_partition(client, batch: pa.RecordBatch, max_bytes: int) -> list[pa.RecordBatch]:
    """:func:`_per_prefix` of a partitioned table opened without a partition: each partition's prefixes
    through its client (a partition that does not exist has no rows)."""
    partitions = client.partitions
    per_prefix = [_empty(client)] * batch.num_rows
    for name, rows in partitions.by_partition(batch).items():
        partition = partitions.client(name, create=False)
        if partition is None:
            continue
        try:
            found = _per_prefix(partition, batch.take(pa.array(rows)), max_bytes)
        except errors.PartitionNotExistsError:  # dropped meanwhile: nothing there
            partitions.forget(name)
            continue
        for index, got in zip(rows.tolist(), found):
            per_prefix[index] = got
    return per_prefix
