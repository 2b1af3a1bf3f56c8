"""A bucket's RocksDB applying changelog records (``KvStore.apply_records``: a follower's apply, a replay)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kvlease.common.logentry import SCHEMA, ChangeType as C
from kvlease.tablet.store.kvstore import BucketStoreError, KvStore

pytestmark = pytest.mark.unit


def test_applying_change_records_keeps_their_order_and_refuses_a_put_without_a_value(tmp_path):
    """KvStore.apply_records (a follower's apply, a replay): -U changes nothing, a key deleted and inserted
    again in one entry ends present (and inserted then deleted ends absent), the applied offset moves;
    an insert or update with a null value is refused naming its key, and nothing of that call is applied."""
    def entry(*records):
        types, keys, values = zip(*records)
        return pa.RecordBatch.from_arrays([pa.array([int(t) for t in types], pa.int8()), pa.array(keys, pa.binary()),
                                           pa.array(values, pa.binary())], schema=SCHEMA)

    store = KvStore(str(tmp_path / "kv"))
    try:
        store.apply_records([entry((C.INSERT, b"a", b"1"), (C.INSERT, b"b", b"1"), (C.INSERT, b"c", b"1"))], 3)
        store.apply_records([entry((C.DELETE, b"a", b"1"), (C.INSERT, b"a", b"2"),  # deleted, then back
                                   (C.UPDATE_BEFORE, b"b", b"1"), (C.UPDATE_AFTER, b"b", b"2"),
                                   (C.INSERT, b"d", b"1"), (C.DELETE, b"d", b"1")),  # inserted, then gone
                             entry((C.UPDATE_BEFORE, b"c", b"1"), (C.UPDATE_AFTER, b"c", b"3"))], 11)
        assert store.get([b"a", b"b", b"c", b"d"]) == [b"2", b"2", b"3", None]
        assert store.applied_offset == 11
        with pytest.raises(BucketStoreError, match=r"record \+U of key b.x. has no value"):
            store.apply_records([entry((C.INSERT, b"e", b"1")),
                                 entry((C.UPDATE_BEFORE, b"x", b"1"), (C.UPDATE_AFTER, b"x", None))], 14)
        assert store.get([b"e"]) == [None] and store.applied_offset == 11
    finally:
        store.close()
