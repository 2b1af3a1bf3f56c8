"""A follower's RocksDB applying its changelog with writes prepared before it held the entries (a rebuild's
tail, prepared while the snapshot downloaded): real RocksDB and changelog in temp dirs."""

from __future__ import annotations

import pytest

from kvlease.common.logentry import decode_entry
from kvlease.tablet.store.kvstore import KvStore, PreparedEntry
from tests.tablet.bucket.test_bucket import TABLE, bucket_dir, fold, keys, kv_rows, log_records, rows  # noqa: F401
from tests.tablet.bucket.test_bucket_replicated import open_store, other_dir, raw_log, replicate  # noqa: F401

pytestmark = pytest.mark.unit


def test_a_follower_commits_the_writes_prepared_for_its_entries_up_to_the_high_watermark(bucket_dir, other_dir):
    """advance_high_watermark(hw, prepared) (a rebuild's tail, prepared while its snapshot downloaded): an
    entry whose prepared write starts at the applied offset is committed as prepared, one past the high
    watermark is not, and entries without one (or with one at another offset) are read back from the log:
    the rows end the same as the leader's."""
    with open_store(bucket_dir) as leader, open_store(other_dir) as follower:
        leader.become_leader(1)
        for i in range(6):
            leader.write(rows((i, f"v{i}", float(i)), (i + 1, f"w{i}", 0.0)))
        leader.write(None, keys(2))
        end = replicate(leader, follower)
        frames = raw_log(follower)
        entries = [decode_entry(frame) for frame in frames]
        def prepared(entry):
            return PreparedEntry(entry.base_offset, entry.next_offset, KvStore.prepare_records(entry.records, other_dir))

        first, second = entries[0], entries[1]
        marked = prepared(first)
        marked.prepared.batch.put(b"marker", b"prepared")  # shows which entries went the prepared way
        stray = KvStore.prepare([b"stray"], [b"never"], [])
        ahead = [marked, PreparedEntry(first.base_offset + 1, second.next_offset, stray)]
        assert follower.advance_high_watermark(second.next_offset, ahead) == second.next_offset
        assert kv_rows(follower)[b"marker"] == b"prepared"  # the first entry's write was the prepared one
        assert len(kv_rows(follower)) == 1 + 3  # the entries' rows, the second read from the log (no write at its base)
        rest = [prepared(e) for e in entries[2:]]
        assert follower.advance_high_watermark(entries[-2].next_offset, rest) == entries[-2].next_offset
        assert follower.applied_offset == entries[-2].next_offset  # the last one waits for the high watermark
        assert follower.advance_high_watermark(end, rest) == end
        leader.advance_high_watermark(end)
        follower_rows = kv_rows(follower)
        assert follower_rows.pop(b"marker") == b"prepared"
        assert follower_rows == kv_rows(leader) == fold(log_records(leader))
