"""The packed lookups' read of a bucket store (``BucketStore.lookup_values``, client/point_lookup.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kvlease.common.codec import RowCodec
from kvlease.common.errors import InvalidRowError
from kvlease.common.row_ttl import row_ttl
from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.bucket.reads import FEW_KEYS
from kvlease.tablet.bucket.store import BucketStore
from tests.tablet.bucket.test_bucket import bucket_dir, keys  # noqa: F401 - bucket_dir is a fixture

pytestmark = pytest.mark.unit


def test_lookup_values_are_the_stored_values_of_what_lookup_finds(bucket_dir):
    """The packed form's read (client/point_lookup.py): the same rows as lookup, as stored values, with the schema
    id lookup decodes them as; a key of another bucket refused, rows a row TTL expired not found."""
    now = [10_000_000]
    table = TableInfo(3, "db", "users", (Column("id", "BIGINT"), Column("name", "STRING"), Column("ts", "BIGINT")),
                      ("id",), 4, row_ttl=row_ttl("1s", "ts"))
    codec = RowCodec(table)
    mine = [i for i in range(40) if int(codec.buckets(codec.encode_keys(keys(i)))[0]) == 1]
    other = next(i for i in range(40) if i not in mine)
    with BucketStore.open(bucket_dir, table, segment_bytes=1 << 20, fsync=False, bucket=1,
                          clock_ms=lambda: now[0]) as s:
        s.write(pa.RecordBatch.from_pylist([{"id": i, "name": f"n{i}", "ts": now[0] - (5000 if i % 2 else 0)}
                                            for i in mine[:6]], schema=codec.schema))
        asked = keys(*mine[::-1], *mine)  # every key of the bucket, some never written, each twice
        found, rows = s.lookup(asked)
        found_v, values, schema_id = s.lookup_values(codec.encode_keys(asked))
        assert found_v.tolist() == found.tolist() and schema_id == table.schema_id
        assert codec.decode_values(values).equals(rows)
        live = {i for i in mine[:6] if i % 2 == 0}  # odd ids expired
        assert 0 < len(live) < 6
        assert [r["id"] for r in rows.to_pylist()] == [i for i in [*mine[::-1], *mine] if i in live]
        with pytest.raises(InvalidRowError, match="belongs to bucket"):
            s.lookup_values(codec.encode_keys(keys(other)))


def test_lookup_values_of_a_few_keys_are_what_lookup_finds(bucket_dir):
    """At most FEW_KEYS keys of a table without a row TTL are read without numpy/Arrow (tablet/bucket/reads.py):
    the same found flags and stored values as the vectorized read, deleted and absent keys not found, a key of
    another bucket refused."""
    table = TableInfo(3, "db", "users", (Column("id", "BIGINT"), Column("name", "STRING")), ("id",), 4)
    codec = RowCodec(table)
    mine = [i for i in range(60) if int(codec.buckets(codec.encode_keys(keys(i)))[0]) == 2]
    other = next(i for i in range(60) if i not in mine)
    with BucketStore.open(bucket_dir, table, segment_bytes=1 << 20, fsync=False, bucket=2) as s:
        s.write(pa.RecordBatch.from_pylist([{"id": i, "name": f"n{i}"} for i in mine[:6]], schema=codec.schema))
        s.write(deletes=keys(mine[1]))
        for asked in ([mine[0]], [mine[1]], [mine[7]], mine[:FEW_KEYS], [mine[0], mine[0], mine[2]]):
            found, rows = s.lookup(keys(*asked))
            found_v, values, schema_id = s.lookup_values(codec.encode_keys(keys(*asked)))
            assert isinstance(found_v, list) and isinstance(values, list) and schema_id == table.schema_id
            assert found_v == found.tolist() and codec.decode_values(values).equals(rows)
        with pytest.raises(InvalidRowError, match="belongs to bucket"):
            s.lookup_values(codec.encode_keys(keys(mine[0], other)))
