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


def test_a_prepared_entry_commits_what_applying_it_applies(tmp_path):
    """KvStore.prepare_records (built by any thread, before the store holds the entry's base) then commit leaves
    the rows and the applied offset apply_records leaves; a put without a value is refused when prepared."""
    def entry(*records):
        types, keys, values = zip(*records)
        return pa.RecordBatch.from_arrays([pa.array([int(t) for t in types], pa.int8()), pa.array(keys, pa.binary()),
                                           pa.array(values, pa.binary())], schema=SCHEMA)

    entries = [entry((C.INSERT, b"a", b"1"), (C.INSERT, b"b", b"1"), (C.INSERT, b"c", b"1")),
               entry((C.DELETE, b"a", b"1"), (C.INSERT, b"a", b"2"), (C.UPDATE_BEFORE, b"b", b"1"),
                     (C.UPDATE_AFTER, b"b", b"2"), (C.INSERT, b"d", b"1"), (C.DELETE, b"d", b"1")),
               entry((C.UPDATE_BEFORE, b"c", b"1"), (C.UPDATE_AFTER, b"c", b"3"))]
    applied, prepared = KvStore(str(tmp_path / "applied")), KvStore(str(tmp_path / "prepared"))
    try:
        writes = [KvStore.prepare_records(e, "here") for e in entries]
        assert writes[0].key_range == (b"a", b"c") and writes[1].key_range == (b"a", b"d")
        end = 0
        for e, write in zip(entries, writes):
            end += e.num_rows
            applied.apply_records([e], end)
            prepared.commit(write, end)
        keys = [b"a", b"b", b"c", b"d", b"e"]
        assert prepared.get(keys) == applied.get(keys) == [b"2", b"2", b"3", None, None]
        assert prepared.applied_offset == applied.applied_offset == 11
        with pytest.raises(BucketStoreError, match=r"here: changelog record \+I of key b.x. has no value"):
            KvStore.prepare_records(entry((C.INSERT, b"x", None)), "here")
    finally:
        applied.close()
        prepared.close()
