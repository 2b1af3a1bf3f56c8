"""Large writes of distinct keys in random order: RocksDB gets them in key order, the changelog in the client's
(``tablet/bucket/writes.py``, ``tablet/store/record_apply.py``)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from kvlease.common.logentry import ChangeType
from kvlease.tablet.bucket.store import BucketStore
from kvlease.tablet.store import record_apply
from tests.support import bucket_writer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("replicated", [False, True])
def test_a_large_write_in_random_key_order_holds_its_rows_and_logs_them_in_the_clients_order(tmp_path, replicated):
    """A write of at least SORTED_MIN distinct keys in random order (inserts, updates of existing rows and
    deletes in one write; also through the replicated leader's pre-write buffer) leaves the rows a model
    says, every key's lookup finds its row, and the changelog keeps the client's order of the keys."""
    rng = random.Random(5)
    n = record_apply.SORTED_MIN * 3
    ids = rng.sample(range(100_000), n)
    first = sorted(rng.sample(ids, n // 2))  # rows that exist before: the big write updates them
    upserts, deletes = ids[:-100], ids[-100:]
    model = {i: f"first-{i}" for i in first}
    model.update({i: f"second-{i}" for i in upserts})
    for i in deletes:
        model.pop(i, None)
    with BucketStore.open(str(tmp_path / "b"), bucket_writer.TABLE, segment_bytes=1 << 20, fsync=False,
                          replicated=replicated) as store:
        if replicated:
            store.become_leader(1)
        store.write(*bucket_writer.batches(first, [f"first-{i}" for i in first], []))
        base, end = store.write(*bucket_writer.batches(upserts, [f"second-{i}" for i in upserts], deletes))
        if replicated:
            store.advance_high_watermark(end)
        [entry] = store.read_log(base, 1 << 30)
        logged = store.codec.decode_keys(entry.records.column(1)).column(0).to_pylist()
        acting = [key for key, kind in zip(logged, entry.records.column(0).to_pylist())
                  if kind != ChangeType.UPDATE_BEFORE]
        assert acting == [i for i in ids if i in model or i in first]  # the client's order, deletes last
        probe = pa.RecordBatch.from_arrays([pa.array(ids + [100_001], pa.int64())], names=["id"])
        found, rows = store.lookup(probe)
        assert found.tolist() == [i in model for i in ids] + [False]
        assert rows.to_pylist() == [{"id": i, "v": model[i]} for i in ids if i in model]  # each key's own row
