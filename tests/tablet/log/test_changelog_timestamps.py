"""Append times and leader epochs in the changelog: entry format version 3, version-1 and -2 entries
still read, timestamps that never go backwards, and the first offset at or after a time
(``Changelog.offset_for_timestamp``)."""

from __future__ import annotations

import logging
import struct
import time
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from kvlease.common.errors import InvalidRequestError
from kvlease.common.logentry import (HEADER_SIZE, CorruptLogError, decode_entry, encode_payload, frame_header,
                                     read_header, record_batch)
from kvlease.tablet.log.changelog import Changelog
from tests.support.changelog_writer import expected_records
from tests.tablet.log.test_changelog import expected_rows, fill, flip_byte, log_dir, read_all  # noqa: F401 (fixture)

pytestmark = pytest.mark.unit

#: The version-1 and -2 headers, written out here rather than taken from the code under test.
V1_HEADER = struct.Struct("<4sQIII")
V2_HEADER = struct.Struct("<4sQIIqI")


def frame_v1(base: int, records: pa.RecordBatch) -> bytes:
    """A version-1 entry of ``records`` (change_type, key, value) from offset ``base``, framed by hand."""
    payload = encode_payload(records).to_pybytes()
    head = V1_HEADER.pack(b"\xc7KL\x01", base, records.num_rows, len(payload), 0)[:20]
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


def frame_v2(base: int, records: pa.RecordBatch, timestamp_ms: int) -> bytes:
    """A version-2 entry (a timestamp, no leader epoch), framed by hand."""
    payload = encode_payload(records).to_pybytes()
    head = V2_HEADER.pack(b"\xc7KL\x02", base, records.num_rows, len(payload), timestamp_ms, 0)[:28]
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


def v1_frame(base: int, count: int) -> bytes:
    """A version-1 entry of ``expected_records(base, count)``."""
    return frame_v1(base, record_batch(*expected_records(base, count)))


def write_v1_segment(directory: str, base: int, counts: list[int]) -> int:
    """A segment file of version-1 entries from ``base``; returns the offset after its last record."""
    frames = []
    for count in counts:
        frames.append(v1_frame(base, count))
        base += count
    path = Path(directory) / f"{base - sum(counts):020d}.log"
    path.write_bytes(b"".join(frames))
    return base


class Clock:
    """A clock that answers the given times in turn, then keeps answering the last one."""

    def __init__(self, *times: int) -> None:
        self.times = list(times)

    def __call__(self) -> int:
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]


def timestamps(log: Changelog) -> list[tuple[int, int | None]]:
    """``(base_offset, timestamp_ms)`` of every kept entry."""
    return [(e.base_offset, e.timestamp_ms) for e in log.read(log.start_offset, 1 << 30)] \
        if log.end_offset > log.start_offset else []


def first_at_or_after(entries: list[tuple[int, int | None]], timestamp: int, end: int) -> int:
    """The answer by brute force: the first entry whose timestamp is >= ``timestamp`` (None: older)."""
    return next((base for base, ts in entries if ts is not None and ts >= timestamp), end)


# -- the entry format ----------------------------------------------------------------------------


def test_a_v3_entry_round_trips_its_timestamp_leader_epoch_and_writer():
    batch = record_batch(*expected_records(7, 3))
    payload = encode_payload(batch)
    frame = frame_header(7, 3, payload, 1_700_000_000_123, leader_epoch=5, writer_id=2**40 + 1,
                         sequence=9) + payload.to_pybytes()
    header = read_header(frame, 0, len(frame))
    assert (header.version, header.base_offset, header.count, header.size) == (3, 7, 3, HEADER_SIZE) == (3, 7, 3, 48)
    assert (header.timestamp_ms, header.leader_epoch, header.writer_id, header.sequence) == (
        1_700_000_000_123, 5, 2**40 + 1, 9)
    entry = decode_entry(frame)
    assert (entry.base_offset, entry.timestamp_ms, entry.records.equals(batch)) == (7, 1_700_000_000_123, True)
    assert (entry.leader_epoch, entry.writer_id, entry.sequence) == (5, 2**40 + 1, 9)
    assert entry.timestamps().to_pylist() == [1_700_000_000_123] * 3
    sliced = decode_entry(frame, from_offset=9)
    assert (sliced.base_offset, sliced.count, sliced.timestamp_ms, sliced.leader_epoch) == (9, 1, 1_700_000_000_123, 5)
    plain = decode_entry(frame_header(0, 3, payload, 1) + payload.to_pybytes())
    assert (plain.leader_epoch, plain.writer_id, plain.sequence) == (-1, -1, -1)  # none given


@pytest.mark.parametrize("byte, what", [(20, "timestamp_ms"), (28, "leader_epoch"), (32, "writer_id"),
                                        (40, "sequence")])
def test_the_crc_covers_the_header(byte, what):
    payload = encode_payload(record_batch(*expected_records(0, 2)))
    frame = bytearray(frame_header(0, 2, payload, 1_000, leader_epoch=3, writer_id=4, sequence=5)
                      + payload.to_pybytes())
    frame[byte] ^= 0x01  # the low byte of the field
    with pytest.raises(CorruptLogError, match="CRC"):
        decode_entry(bytes(frame))


def test_a_hand_framed_v2_entry_still_decodes_with_its_timestamp_and_no_leader_epoch():
    batch = record_batch(*expected_records(3, 4))
    frame = frame_v2(3, batch, 1_234)
    header = read_header(frame, 0, len(frame))
    assert (header.version, header.size, header.timestamp_ms, header.leader_epoch) == (2, 32, 1_234, -1)
    entry = decode_entry(frame, from_offset=5)
    assert (entry.base_offset, entry.count, entry.timestamp_ms) == (5, 2, 1_234)
    assert (entry.leader_epoch, entry.writer_id, entry.sequence) == (-1, -1, -1)
    assert entry.batch.to_pylist() == expected_rows(5, 7)


def test_a_changelog_of_v2_entries_opens_and_goes_on_in_v3(log_dir):
    frames = [frame_v2(0, record_batch(*expected_records(0, 2)), 1_000),
              frame_v2(2, record_batch(*expected_records(2, 3)), 1_100)]
    (Path(log_dir) / f"{0:020d}.log").write_bytes(b"".join(frames))
    with Changelog(log_dir, segment_bytes=1 << 20, clock_ms=lambda: 2_000) as log:
        assert (log.start_offset, log.end_offset) == (0, 5)
        log.publish(log.write([record_batch(*expected_records(5, 2))], leader_epoch=7))
        entries = list(log.read(0, 1 << 30))
        assert [(e.base_offset, e.timestamp_ms, e.leader_epoch) for e in entries] == [
            (0, 1_000, -1), (2, 1_100, -1), (5, 2_000, 7)]
        assert read_all(log) == expected_rows(0, 7)
    with Changelog(log_dir, segment_bytes=1 << 20) as log:  # reopened: recovery reads both versions
        assert log.end_offset == 7 and read_all(log) == expected_rows(0, 7)


def test_a_hand_framed_v1_entry_still_decodes_without_a_timestamp():
    frame = v1_frame(4, 5)
    header = read_header(frame, 0, len(frame))
    assert (header.version, header.size, header.timestamp_ms) == (1, 24, None)
    entry = decode_entry(frame, from_offset=6)
    assert (entry.base_offset, entry.count, entry.timestamp_ms) == (6, 3, None)
    assert entry.timestamps().to_pylist() == [None] * 3
    assert entry.batch.to_pylist() == expected_rows(6, 9)


def test_an_unknown_version_is_refused():
    frame = bytearray(v1_frame(0, 1))
    frame[3] = 9
    with pytest.raises(CorruptLogError, match="bad magic/version"):
        decode_entry(bytes(frame))


# -- append times ----------------------------------------------------------------------------------


def test_append_times_never_go_backwards_even_when_the_clock_does(log_dir):
    with Changelog(log_dir, segment_bytes=1 << 20, clock_ms=Clock(1_000, 500, 2_000, 1_500, 2_500)) as log:
        fill(log, [2, 3, 1, 4, 2])
        assert timestamps(log) == [(0, 1_000), (2, 1_000), (5, 2_000), (6, 2_000), (10, 2_500)]
    with Changelog(log_dir, segment_bytes=1 << 20, clock_ms=Clock(10)) as log:  # reopened, clock far behind
        assert fill(log, [1]) == [(12, 13)]
        assert timestamps(log)[-1] == (12, 2_500)


def test_one_group_commit_is_one_append_time(log_dir):
    with Changelog(log_dir, segment_bytes=600, fsync=False, clock_ms=Clock(5_000, 6_000)) as log:
        batches = [record_batch(*expected_records(o, 5)) for o in range(0, 40, 5)]
        log.append_batches(batches)  # rolls segments on the way
        assert len(log.segments()) > 1
        assert {ts for _, ts in timestamps(log)} == {5_000}
        fill(log, [1])
        assert timestamps(log)[-1][1] == 6_000


def test_the_default_clock_is_the_wall_clock(log_dir):
    before = time.time_ns() // 1_000_000
    with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
        fill(log, [1])
        [(_, stamp)] = timestamps(log)
    assert before <= stamp <= time.time_ns() // 1_000_000


# -- version 1 segments, then version 2 appends -------------------------------------------------------


def test_a_log_of_v1_segments_recovers_and_continues_in_v2(log_dir):
    end = write_v1_segment(log_dir, 0, [3, 4])
    end = write_v1_segment(log_dir, end, [5, 2])  # the tail segment: v2 entries follow the v1 ones in it
    with Changelog(log_dir, segment_bytes=1 << 20, clock_ms=Clock(100, 200)) as log:
        assert (log.start_offset, log.end_offset) == (0, end)
        assert fill(log, [3, 2]) == [(end, end + 3), (end + 3, end + 5)]
        assert read_all(log) == expected_rows(0, end + 5)
        assert timestamps(log) == [(0, None), (3, None), (7, None), (12, None), (14, 100), (17, 200)]
        assert log.offset_for_timestamp(0) == end  # v1 entries count as older than any time
    with Changelog(log_dir, segment_bytes=1 << 20) as log:  # and again from disk, v1 and v2 mixed in one file
        assert read_all(log) == expected_rows(0, end + 5)
        assert [log.offset_for_timestamp(t) for t in (0, 100, 101, 200, 201)] == [end, end, end + 3, end + 3, end + 5]


@pytest.mark.parametrize("cut", [1, 10, 30])
def test_a_torn_v1_tail_is_dropped(log_dir, caplog, cut):
    end = write_v1_segment(log_dir, 0, [3, 4, 5])
    path = Path(log_dir) / f"{0:020d}.log"
    path.write_bytes(path.read_bytes()[:-cut])
    with caplog.at_level(logging.WARNING, logger="kvlease.tablet.log.changelog"):
        log = Changelog(log_dir, segment_bytes=1 << 20)
    with log:
        assert "torn tail" in caplog.text
        assert log.end_offset == end - 5
        assert fill(log, [2]) == [(7, 9)] and read_all(log) == expected_rows(0, 9)


def test_a_damaged_v1_entry_followed_by_v2_entries_is_not_a_torn_tail(log_dir):
    write_v1_segment(log_dir, 0, [3, 4])
    with Changelog(log_dir, segment_bytes=1 << 20) as log:
        fill(log, [2, 2])
    flip_byte(Path(log_dir) / f"{0:020d}.log", len(v1_frame(0, 3)) + 24 + 10)  # the second v1 entry's payload
    with pytest.raises(CorruptLogError, match="not a torn write"):
        Changelog(log_dir, segment_bytes=1 << 20)


# -- the first offset at or after a time -----------------------------------------------------------------


def test_offset_for_timestamp_over_segments_ties_and_retention(log_dir):
    times = [100, 100, 150, 300, 300, 300, 310, 500, 500, 700, 800, 800, 900]
    with Changelog(log_dir, segment_bytes=700, fsync=False, clock_ms=Clock(*times)) as log:
        assert log.offset_for_timestamp(0) == 0  # an empty log: its end
        fill(log, [2, 3, 1, 4, 2, 3, 1, 2, 5, 1, 2, 3, 1])
        assert len(log.segments()) >= 4
        entries = timestamps(log)
        assert [ts for _, ts in entries] == times
        for t in range(0, 1_000, 5):
            assert log.offset_for_timestamp(t) == first_at_or_after(entries, t, log.end_offset), t
        assert log.offset_for_timestamp(300) == entries[3][0]  # at a time several entries share: the first
        assert log.offset_for_timestamp(901) == log.end_offset
        cut = log.segments()[2].base_offset
        assert log.truncate_before(cut) == 2
        kept = timestamps(log)
        assert kept[0][0] == cut == log.start_offset
        assert log.offset_for_timestamp(0) == cut  # before everything kept: the earliest kept
        for t in range(0, 1_000, 5):
            assert log.offset_for_timestamp(t) == first_at_or_after(kept, t, log.end_offset), t
    with Changelog(log_dir, segment_bytes=700) as log:  # the index rebuilt from the headers answers the same
        for t in range(0, 1_000, 5):
            assert log.offset_for_timestamp(t) == first_at_or_after(kept, t, log.end_offset), t


def test_offset_for_timestamp_reads_no_file(log_dir, monkeypatch):
    with Changelog(log_dir, segment_bytes=500, fsync=False, clock_ms=Clock(*range(10, 400, 10))) as log:
        fill(log, [3] * 30)
        entries = timestamps(log)

        def no_reads(*args, **kwargs):
            raise AssertionError("offset_for_timestamp read a segment file")

        monkeypatch.setattr(Changelog, "_pread", no_reads)
        assert [log.offset_for_timestamp(t) for t in (0, 55, 200, 10_000)] == [
            first_at_or_after(entries, t, log.end_offset) for t in (0, 55, 200, 10_000)]


def test_a_negative_timestamp_is_an_invalid_request(log_dir):
    with Changelog(log_dir, segment_bytes=1 << 20) as log:
        with pytest.raises(InvalidRequestError, match="timestamp"):
            log.offset_for_timestamp(-1)
