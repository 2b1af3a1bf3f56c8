"""A follower's changelog: entries copied byte for byte (write_raw) and the tail cut (truncate_from)."""

from __future__ import annotations

import os

import pytest

from kvlease.common.errors import InvalidRequestError
from kvlease.common.logentry import ChangeType, read_header
from kvlease.tablet.log.changelog import Changelog
from tests.tablet.log.test_changelog import log_dir  # noqa: F401 (fixture)

pytestmark = pytest.mark.unit


def fill(log: Changelog, entries: int) -> None:
    for i in range(entries):
        log.write([])  # nothing: offsets stay
        log.append([ChangeType.INSERT] * 2, [b"k%d" % i, b"j%d" % i], [b"v" * 40, None])


def copy(source: Changelog, target: Changelog) -> None:
    frames = source.read_raw(target.end_offset, 1 << 30)
    pending = target.write_raw(frames, [read_header(f, 0, len(f)) for f in frames])
    target.sync(pending)
    target.publish(pending)


def test_write_raw_copies_entries_byte_for_byte_and_refuses_a_gap(log_dir):
    ticks = iter(range(1000, 10**6, 7))
    with Changelog(os.path.join(log_dir, "a"), segment_bytes=500, clock_ms=lambda: next(ticks)) as leader, \
            Changelog(os.path.join(log_dir, "b"), segment_bytes=500, clock_ms=lambda: 0) as follower:
        fill(leader, 9)
        frames = leader.read_raw(0, 1 << 30)
        with pytest.raises(InvalidRequestError, match="starts at offset 2, the log ends at 0"):
            follower.write_raw(frames[1:], [read_header(f, 0, len(f)) for f in frames[1:]])
        copy(leader, follower)
        assert follower.read_raw(0, 1 << 30) == frames
        assert [(s.base_offset, s.end_offset, s.size) for s in follower.segments()] == \
            [(s.base_offset, s.end_offset, s.size) for s in leader.segments()]
        times = [read_header(f, 0, len(f)).timestamp_ms for f in frames]
        assert len(set(times)) == len(frames)  # each entry its own time: the follower's index keeps them
        for t in (0, times[3], times[3] + 1, times[-1] + 1):
            assert follower.offset_for_timestamp(t) == leader.offset_for_timestamp(t)
        assert follower.offset_for_timestamp(times[3]) == 6


def test_truncate_from_cuts_whole_entries_across_segments_and_survives_a_reopen(log_dir):
    with Changelog(log_dir, segment_bytes=500) as log:
        fill(log, 12)
        segments = len(log.segments())
        frames = log.read_raw(0, 1 << 30)
        assert log.truncate_from(13) == 12  # offset 13 is inside the entry 12..14: it goes whole
        assert log.end_offset == 12 and len(log.segments()) < segments
        assert log.read_raw(0, 1 << 30) == frames[:6]
        assert log.append([ChangeType.DELETE], [b"x"], [b"old"]) == (12, 13)
        assert log.truncate_from(99) == 13
    with Changelog(log_dir, segment_bytes=500) as log:
        assert log.end_offset == 13
        assert log.read_raw(0, 1 << 30)[:6] == frames[:6]
        assert log.truncate_from(0) == 0 and log.end_offset == 0 and len(log.segments()) == 1
        assert log.append([ChangeType.INSERT], [b"a"], [b"b"]) == (0, 1)
    with Changelog(log_dir, segment_bytes=500) as log:
        assert log.end_offset == 1
