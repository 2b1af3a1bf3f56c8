"""A bucket's RocksDB applying changelog records (``KvStore.apply_records``: a follower's apply, a replay)."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from kvlease.common.logentry import SCHEMA, ChangeType as C
from kvlease.tablet.store import record_apply
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


def _random_entries(rng: random.Random, keys: int, entries: int, per_entry: int,
                    widths: tuple[int, ...]) -> list[pa.RecordBatch]:
    """Changelog entries over ``keys`` keys (each ``widths`` bytes wide, one picked per record) in random
    order: a key repeats within and across entries, is deleted and inserted again, updated as -U/+U pairs."""
    out = []
    for _ in range(entries):
        types, ks, values = [], [], []
        for _ in range(per_entry):
            key = rng.randrange(keys).to_bytes(rng.choice(widths), "big")
            kind = rng.choice((C.INSERT, C.UPDATE_AFTER, C.DELETE, C.UPDATE_BEFORE))
            if kind == C.UPDATE_AFTER:
                types.append(int(C.UPDATE_BEFORE)); ks.append(key); values.append(b"before")
            types.append(int(kind)); ks.append(key); values.append(rng.randbytes(rng.randrange(1, 9)))
        out.append(pa.RecordBatch.from_arrays([pa.array(types, pa.int8()), pa.array(ks, pa.binary()),
                                               pa.array(values, pa.binary())], schema=SCHEMA))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_large_step_written_in_key_order_holds_the_rows_of_the_records_one_by_one(tmp_path, monkeypatch, seed):
    """A step of at least SORTED_MIN acting records is written in key order, each key once by its last
    record (record_apply.py): over real RocksDB it leaves every row as writing the records one by one in
    offset order does (random keys repeated within and across entries, deletes and re-inserts, -U/+U
    pairs), after rows of an earlier step, and its records are in key order; keys of one width (sorted as
    integers) and of two."""
    rng = random.Random(seed)
    keys, widths = rng.choice((50, 400, 5000)), ((2, 3), (3,), (8,))[seed % 3]
    earlier = _random_entries(rng, keys, 1, 200, widths)
    entries = _random_entries(rng, keys, rng.randrange(1, 5), rng.randrange(300, 1500), widths)
    expected: dict[bytes, bytes | None] = {}
    for entry in earlier + entries:
        for kind, key, value in zip(*(entry.column(i).to_pylist() for i in range(3))):
            if kind != C.UPDATE_BEFORE:
                expected[key] = None if kind == C.DELETE else value
    ordered = record_apply.last_per_key([record_apply._acting(e) for e in entries]).column(1).to_pylist()
    assert ordered == sorted(set(ordered)) and len(ordered) < sum(e.num_rows for e in entries)
    stores = {}
    try:
        for name, sorted_min in (("sorted", 1), ("one-by-one", 10**9)):
            monkeypatch.setattr(record_apply, "SORTED_MIN", sorted_min)
            store = stores[name] = KvStore(str(tmp_path / name))
            store.apply_records(earlier, 200)
            store.apply_records(entries, 5000)
        everything = sorted(expected)
        assert stores["sorted"].get(everything) == stores["one-by-one"].get(everything) == \
            [expected[k] for k in everything]
        for store in stores.values():
            with store.snapshot(5000) as snapshot:
                assert len(list(snapshot.rows())) == sum(v is not None for v in expected.values())
            assert store.applied_offset == 5000
    finally:
        for store in stores.values():
            store.close()


def test_a_step_in_key_order_is_not_sorted_again():
    """Records already in key order, each key once (a tail of updates in key order), are kept as they are."""
    entry = pa.RecordBatch.from_arrays([pa.array([0, 2, 3], pa.int8()), pa.array([b"a", b"b", b"c"], pa.binary()),
                                        pa.array([b"1", b"2", None], pa.binary())], schema=SCHEMA)
    assert record_apply.last_per_key([entry]) is entry


@pytest.mark.parametrize("width", [1, 2, 5, 8, 9])
def test_key_order_is_the_stable_bytewise_sort(width):
    """record_apply.key_order (integers for keys of one width up to 8 bytes, Arrow's sort otherwise) gives
    Arrow's stable sort of the bytes, also on a slice of an array and with repeated keys."""
    rng = random.Random(width)
    for _ in range(30):
        keys = [rng.randbytes(width) if rng.random() < 0.5 else b"\x00" * width for _ in range(rng.randrange(1, 300))]
        array = pa.array([b"#" * (width + 1), *keys], pa.binary()).slice(1)
        assert record_apply.key_order(array).tolist() == pc.sort_indices(array).to_numpy().tolist()
