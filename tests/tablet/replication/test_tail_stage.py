"""Staging a rebuild's changelog tail as it arrives (tablet/replication/tail_stage.py): real RocksDB and changelogs
in temp dirs. The staged changelog and prepared writes, installed and committed, give the follower the leader's log
byte for byte and its rows; a write that cannot be prepared ends the writes there (the rest is applied from the
log); a small tail is not staged; a damaged entry ends the staging with nothing left behind."""

from __future__ import annotations

import os

import pytest

from kvlease.common.logentry import read_header
from kvlease.tablet.replication.tail_stage import TailStager
from tests.tablet.bucket.test_bucket import bucket_dir, keys, rows  # noqa: F401
from tests.tablet.bucket.test_bucket_replicated import open_store
from tests.tablet.store.test_snapshot_install import leader_dir  # noqa: F401
from tests.tablet.store.test_prepared_records import frame, state_rows

pytestmark = pytest.mark.unit


def leader_and_tail(leader_dir: str):
    """A leader with a checkpoint at its offset and a tail of many entries after it (updates, deletes,
    re-inserts of rows in the checkpoint and in the tail)."""
    leader = open_store(leader_dir)
    leader.become_leader(1)
    leader.write(rows(*[(i, f"a{i}", float(i)) for i in range(40)]))
    leader.advance_high_watermark(leader.log_end_offset)
    checkpoint = os.path.join(leader_dir, "cp")
    offset = leader.checkpoint(checkpoint)
    for i in range(12):
        leader.write(rows((i, f"b{i}", 1.0), (100 + i, "new", 2.0)), keys(20 + i, 100 + i - 1))
    leader.write(rows((20, "back", 3.0)))
    leader.advance_high_watermark(leader.log_end_offset)
    return leader, checkpoint, offset


def chunks(leader, offset: int, max_bytes: int) -> list[list[bytes]]:
    """The committed tail from ``offset`` as the prefetch's answers of ``max_bytes`` each."""
    out = []
    while offset < leader.high_watermark:
        entries, _ = leader.fetch_log(offset, max_bytes)
        out.append(entries)
        header = read_header(memoryview(entries[-1]), 0, len(entries[-1]))
        offset = header.base_offset + header.count
    return out


def test_a_tail_staged_answer_by_answer_installs_and_ingests_to_the_leaders_log_and_rows(bucket_dir, leader_dir):
    leader, checkpoint, offset = leader_and_tail(leader_dir)
    stager = TailStager(os.path.join(bucket_dir, "rebuild-tail"), offset, segment_bytes=400, fsync=True, min_bytes=0)
    answers = chunks(leader, offset, 300)
    assert len(answers) > 3
    for entries in answers:
        stager.add(entries)
    staged = stager.finish()
    assert staged is not None and staged.count == sum(map(len, answers)) and staged.next_offset == leader.high_watermark
    assert len(staged.writes) == len(answers)  # one write per answer, each starting where the one before ends
    assert [w.from_offset for w in staged.writes[1:]] == [w.next_offset for w in staged.writes[:-1]]
    assert staged.log.epochs == ((1, offset),)
    follower = open_store(bucket_dir)
    try:
        follower.become_follower(1)
        follower.install_snapshot(checkpoint, offset, tail_log=staged.log)
        assert follower.fetch_log(offset, 1 << 30, committed=False)[0] == [e for a in answers for e in a]
        for write in staged.writes:
            follower.apply_prepared(write.write, write.from_offset, write.next_offset)
        assert follower.applied_offset == leader.applied_offset and state_rows(follower) == state_rows(leader)
    finally:
        follower.close()
        leader.close()


def test_a_write_that_cannot_be_prepared_ends_the_writes_there_and_a_small_tail_is_not_staged(tmp_path):
    answers = [[frame(10, [0, 0], [b"a", b"b"], [b"1", b"2"])], [frame(12, [1], [b"a"], [b"1"])],  # -U only
               [frame(13, [0], [b"b"], [None])], [frame(14, [3], [b"b"], [None])]]  # a put without a value
    stager = TailStager(str(tmp_path / "staged"), 10, segment_bytes=1 << 20, fsync=False, min_bytes=0)
    for entries in answers:
        stager.add(entries)
    staged = stager.finish()
    assert staged is not None and staged.count == 4 and staged.next_offset == 15
    assert [(w.from_offset, w.next_offset) for w in staged.writes] == [(10, 12), (12, 13)]  # from 13: from the log
    small = TailStager(str(tmp_path / "small"), 10, segment_bytes=1 << 20, fsync=False, min_bytes=1 << 20)
    small.add(answers[0])
    assert small.finish() is None and not os.path.exists(tmp_path / "small")


def test_a_damaged_entry_ends_the_staging_and_leaves_nothing(tmp_path):
    good = frame(10, [0], [b"a"], [b"1"])
    damaged = frame(11, [0], [b"b"], [b"2"])[:-1] + b"x"
    stager = TailStager(str(tmp_path / "staged"), 10, segment_bytes=1 << 20, fsync=True, min_bytes=0)
    stager.add([good])
    stager.add([damaged])
    assert stager.finish() is None and not os.path.exists(tmp_path / "staged")
