"""Batch reads: the table as of planning (``startup.mode=full``), or a change feed (the other modes).

``partitions()`` runs once per action in a short-lived Python worker: it
acquires the lease (full reads from snapshots) and plans the splits. Each
split releases its bucket once read, so a finished job leaves no lease
behind; a job that dies leaves its lease to expire.
"""

from __future__ import annotations

import uuid
from typing import Iterable, Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, EqualTo, Filter, In

from client.table import TableClient
from common.codec import RowCodec, bucket_of_keys
from spark_source.enumerator import plan_bootstrap, plan_changes
from spark_source.options import Options, connect
from spark_source.reader import read_split
from spark_source.splits import LookupSplit, ReadContext

#: Key types a filter may look up (a TIMESTAMP filter value carries Spark's session time zone: left to Spark).
_LOOKUP_TYPES = {"BOOLEAN", "INT", "BIGINT", "DOUBLE", "STRING", "BYTES"}
MAX_LOOKUP_KEYS = 10_000


class BatchReader(DataSourceReader):
    def __init__(self, options: Options, ctx: ReadContext) -> None:
        self.options = options
        self.ctx = ctx
        self.keys: tuple | None = None  # whole primary keys to look up, from pushed filters

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Equality (or ``IN`` on a one-column key) on the whole primary key becomes lookups; Spark
        keeps evaluating every other filter."""
        table = self.ctx.table
        types = {c.name: c.type for c in table.columns}
        pk = table.primary_key
        if self.options.change_feed or not all(types[k] in _LOOKUP_TYPES for k in pk):
            return filters
        choices: dict[str, list] = {}
        pushed: list[Filter] = []
        for f in filters:
            name = f.attribute[0] if len(f.attribute) == 1 else None
            if name not in pk or name in choices:
                continue
            if isinstance(f, EqualTo) and f.value is not None:
                choices[name] = [f.value]
                pushed.append(f)
            elif isinstance(f, In) and len(pk) == 1 and 0 < len(f.value) <= MAX_LOOKUP_KEYS:
                choices[name] = [v for v in f.value if v is not None]
                pushed.append(f)
        if set(choices) != set(pk):
            return filters
        if len(pk) == 1:
            self.keys = tuple(((pk[0], v),) for v in dict.fromkeys(choices[pk[0]]))
        else:
            self.keys = (tuple((k, choices[k][0]) for k in pk),)
        return [f for f in filters if not any(f is p for p in pushed)]

    def partitions(self) -> list:
        if self.keys is not None:
            return self._lookups()
        with connect(self.ctx.bootstrap, self.ctx.security) as admin, TableClient(admin, self.ctx.table.table_id) as table:
            if self.options.change_feed:
                return plan_changes(table, self.options)
            lease_id = self.options.lease_id or f"spark-batch-{uuid.uuid4().hex}"
            return plan_bootstrap(admin, table, self.options, lease_id, release=True)

    def _lookups(self) -> list[LookupSplit]:
        """One lookup split per bucket that holds some of the keys."""
        codec = RowCodec(self.ctx.table)
        rows = [dict(key) for key in self.keys]
        if not rows:
            return []
        buckets = bucket_of_keys(codec.encode_keys(codec.to_batch(rows)), self.ctx.table.buckets)
        by_bucket: dict[int, list] = {}
        for bucket, key in zip(buckets, self.keys):
            by_bucket.setdefault(bucket, []).append(key)
        return [LookupSplit(b, tuple(keys)) for b, keys in sorted(by_bucket.items())]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return read_split(self.ctx, partition)
