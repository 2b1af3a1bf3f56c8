"""The memtable Bloom filter policy (pure), and on a real bucket: appends keep memtables without a
filter, writes that look keys up turn it on for a new memtable at once, appends turn it off again,
and the change records stay exact throughout."""

from __future__ import annotations

import configparser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kvlease.common.logentry import ChangeType
from kvlease.tablet.bucket.store import BucketStore
from kvlease.tablet.store.memtable_filter import OFF_SHARE, ON_SHARE, WINDOW_ROWS, MemtableFilterPolicy
from tests.support import bucket_writer

pytestmark = pytest.mark.unit

WINDOW = 1000


def test_off_at_first_and_appends_keep_it_off():
    policy = MemtableFilterPolicy(window_rows=WINDOW)
    assert policy.enabled is False
    assert [policy.observe(100, 0) for _ in range(30)] == [None] * 30


def test_a_window_with_enough_lookups_turns_it_on_only_when_the_window_is_full():
    policy = MemtableFilterPolicy(window_rows=WINDOW)
    assert policy.observe(600, 600) is None  # the window is not full yet
    assert policy.observe(400, 0) is True  # 600 of 1000 looked up
    assert policy.enabled is False  # until the caller applied it
    policy.enabled = True
    assert policy.observe(WINDOW, WINDOW) is None


def test_hysteresis_between_the_two_shares():
    policy = MemtableFilterPolicy(window_rows=WINDOW)
    just_under_on = int(ON_SHARE * WINDOW) - 1
    assert policy.observe(WINDOW, just_under_on) is None  # off stays off below ON_SHARE
    assert policy.observe(WINDOW, int(ON_SHARE * WINDOW) + 1) is True
    policy.enabled = True
    assert policy.observe(WINDOW, just_under_on) is None  # on stays on above OFF_SHARE
    assert policy.observe(WINDOW, int(OFF_SHARE * WINDOW)) is False


def test_each_window_starts_afresh():
    policy = MemtableFilterPolicy(window_rows=WINDOW)
    assert policy.observe(WINDOW, 0) is None
    # the lookups of this window alone decide, not diluted by the appends of the one before
    assert policy.observe(WINDOW, WINDOW // 2) is True


def test_a_refused_change_is_proposed_again_next_window():
    policy = MemtableFilterPolicy(window_rows=WINDOW)
    assert policy.observe(WINDOW, WINDOW) is True
    assert policy.observe(WINDOW, WINDOW) is True  # not applied: still wanted


@pytest.mark.parametrize("rows, looked_up", [(10, 11), (10, -1)])
def test_bad_counts_are_refused(rows, looked_up):
    with pytest.raises(ValueError, match="looked_up"):
        MemtableFilterPolicy().observe(rows, looked_up)


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window_rows"):
        MemtableFilterPolicy(window_rows=0)


# --- on a real bucket -----------------------------------------------------------------------------

def memtable_filter_options(kv_dir: Path) -> tuple[str, str]:
    """The rows column family's memtable filter settings in RocksDB's newest OPTIONS file."""
    newest = max(kv_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    parser = configparser.ConfigParser(strict=False)
    parser.read(newest)
    default = parser['CFOptions "default"']
    return default["memtable_prefix_bloom_size_ratio"], default["memtable_whole_key_filtering"]


def batch(ids, tag: str = "v") -> pa.RecordBatch:
    """Rows (id, "{tag}{id}")."""
    ids = np.asarray(ids, dtype=np.int64)
    return pa.record_batch({"id": pa.array(ids), "v": pa.array([f"{tag}{i}" for i in ids.tolist()], pa.string())})


def active_memtable_entries(store: BucketStore) -> int:
    return int(store._kv._db.property_value("rocksdb.num-entries-active-mem-table"))


def test_a_bucket_turns_its_memtable_filter_on_and_off_with_its_lookups(tmp_path):
    rows = 10_000
    with BucketStore.open(str(tmp_path), bucket_writer.TABLE, segment_bytes=64 << 20, fsync=False) as s:
        for start in range(0, WINDOW_ROWS + rows, rows):  # appending ids: nothing looked up
            s.write(batch(range(start, start + rows)))
        assert s._kv.memtable_filter is False
        assert memtable_filter_options(tmp_path / "kv") == ("0.000000", "false")

        # updates of random stored ids: every key looked up
        model = {i: f"v{i}" for i in range(WINDOW_ROWS + rows)}
        rng = np.random.default_rng(3)
        turned_on_at = None
        for i in range(WINDOW_ROWS // rows + 2):
            ids = rng.choice(WINDOW_ROWS, rows, replace=False).tolist()
            before = [model[k] for k in ids]
            base, _ = s.write(batch(ids, f"u{i}-"))
            model.update((k, f"u{i}-{k}") for k in ids)
            if turned_on_at is None and s._kv.memtable_filter:
                turned_on_at = i
                # the memtable was switched before this write went in: it holds this write alone
                assert active_memtable_entries(s) == rows
        assert turned_on_at is not None
        assert memtable_filter_options(tmp_path / "kv") == ("0.100000", "true")
        # the last write found every row it updated: its before-images are the values they held
        [entry] = s.read_log(base, 1 << 30)[:1]
        types = entry.records.column(0).to_pylist()
        written = s.codec.decode_values(entry.records.column(2)).column("v").to_pylist()
        assert types == [int(ChangeType.UPDATE_BEFORE), int(ChangeType.UPDATE_AFTER)] * rows
        assert written[0::2] == before and written[1::2] == [model[k] for k in ids]

        top = WINDOW_ROWS + rows
        for start in range(top, top + 2 * WINDOW_ROWS, rows):  # appending again: two windows at most
            s.write(batch(range(start, start + rows)))
        assert s._kv.memtable_filter is False
        assert memtable_filter_options(tmp_path / "kv") == ("0.000000", "false")
        ids = [0, 5, top, top + WINDOW_ROWS, 123_456_789]
        found, got = s.lookup(batch(ids).select(["id"]))
        assert found.tolist() == [True] * 4 + [False] and got.column(0).to_pylist() == ids[:4]


def test_a_refused_option_change_leaves_writes_working_and_is_tried_again(tmp_path, caplog):
    class Refusing:
        """The bucket's RocksDB, except that changing options fails (as rocksdict raises: bare Exception)."""

        def __init__(self, db) -> None:
            self.db, self.refusals = db, 0

        def set_options(self, options):
            self.refusals += 1
            raise Exception("Invalid argument: refused")

        def __getattr__(self, name):
            return getattr(self.db, name)

    rows = 10_000
    with BucketStore.open(str(tmp_path), bucket_writer.TABLE, segment_bytes=64 << 20, fsync=False) as s:
        s.write(batch(range(WINDOW_ROWS)))
        refusing = s._kv._db = Refusing(s._kv._db)
        for i in range(2 * (WINDOW_ROWS // rows + 1)):  # updates: every key looked up, two windows
            s.write(batch(range(i * rows % WINDOW_ROWS, i * rows % WINDOW_ROWS + rows)))
        assert refusing.refusals == 2 and s._kv.memtable_filter is False
        assert "cannot turn the memtable Bloom filter on" in caplog.text
        s._kv._db = refusing.db
        assert memtable_filter_options(tmp_path / "kv") == ("0.000000", "false")
        found, _ = s.lookup(batch([0, WINDOW_ROWS - 1, 10**9]).select(["id"]))
        assert found.tolist() == [True, True, False]
