"""The bucket changelog: append/read and segment rolls (recovery, retention and crashes: test_changelog_recovery.py)."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from kvlease.common import checksum
from kvlease.common.config import Config
from kvlease.common.errors import InvalidRequestError
from kvlease.ops.local_cluster import dying_with_parent
from kvlease.common.logentry import (HEADER_SIZE, SCHEMA, ChangeType, ChangelogError, CorruptLogError, decode_entry,
                                     record_batch)
from kvlease.tablet.log.changelog import Changelog, LogOffsetOutOfRangeError
from tests.support.changelog_writer import expected_records
from tests.support.paths import REPO

PROJECT_ROOT = REPO


@pytest.fixture
def log_dir(kvlease_tmp: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="changelog-", dir=kvlease_tmp)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fill(log: Changelog, counts: list[int]) -> list[tuple[int, int]]:
    """Append batches of ``expected_records`` with the given sizes."""
    return [log.append(*expected_records(log.end_offset, n)) for n in counts]


def records_of(entries) -> list[dict]:
    return [row for entry in entries for row in entry.batch.to_pylist()]


def expected_rows(start: int, end: int) -> list[dict]:
    cts, keys, values = expected_records(start, end - start)
    return [{"offset": start + i, "change_type": ct, "key": k, "value": v}
            for i, (ct, k, v) in enumerate(zip(cts, keys, values))]


def read_all(log: Changelog, start: int | None = None) -> list[dict]:
    """Every record from ``start`` (default start_offset) to the end, in small reads."""
    offset = log.start_offset if start is None else start
    rows = []
    while offset < log.end_offset:
        entries = log.read(offset, 4096)
        rows += records_of(entries)
        offset = entries[-1].next_offset
    return rows


def segment_files(directory: str) -> list[Path]:
    return sorted(Path(directory).glob("*.log"))


def entry_positions(path: Path) -> list[int]:
    """Byte positions of the entries in a segment file (walking the headers)."""
    data, positions, pos = path.read_bytes(), [], 0
    while pos < len(data):
        positions.append(pos)
        pos += HEADER_SIZE + int.from_bytes(data[pos + 16:pos + 20], "little")
    return positions


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(position)
        byte = fh.read(1)
        fh.seek(position)
        fh.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.unit
class TestChecksum:
    """The entry CRC is zlib's CRC-32 whichever library computes it (ISA-L where installed)."""

    @pytest.mark.parametrize("size", [0, 1, 31, 4096, 1 << 20])
    def test_it_equals_zlibs_for_every_size_and_start_value(self, size):
        data = random.Random(size).randbytes(size)
        assert checksum.crc32(data) == zlib.crc32(data)
        for start in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):
            assert checksum.crc32(data, start) == zlib.crc32(data, start)
        assert checksum.crc32(pa.py_buffer(data)[size // 3:]) == zlib.crc32(data[size // 3:])
        assert checksum.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])

    def test_isal_computes_it_where_installed(self):
        pytest.importorskip("isal")
        assert checksum.crc32.__module__.startswith("isal")

    def test_an_appended_entry_carries_zlibs_crc(self, log_dir):
        with Changelog(log_dir, segment_bytes=1 << 20) as log:
            log.append([ChangeType.INSERT] * 3, [b"a", b"b", b"c"], [b"1", b"2", b"3"])
            [raw] = log.read_raw(0, 1 << 20)
        raw = bytes(raw)
        assert zlib.crc32(raw[HEADER_SIZE:], zlib.crc32(raw[:HEADER_SIZE - 4])) == \
            int.from_bytes(raw[HEADER_SIZE - 4:HEADER_SIZE], "little")


@pytest.mark.unit
class TestAppendAndRead:
    def test_round_trip_keeps_types_keys_values_and_nulls(self, log_dir):
        with Changelog(log_dir, segment_bytes=1 << 20) as log:
            types = [ChangeType.INSERT, ChangeType.UPDATE_BEFORE, ChangeType.UPDATE_AFTER, ChangeType.DELETE]
            assert log.append(types, [b"a", b"b", b"b", b"c"], [b"1", b"old", b"new", None]) == (0, 4)
            [entry] = log.read(0, 1 << 20)
        assert (entry.base_offset, entry.count, entry.next_offset) == (0, 4, 4)
        assert entry.batch.schema.names == ["offset", "change_type", "key", "value"]
        assert entry.batch.to_pylist() == [
            {"offset": 0, "change_type": 0, "key": b"a", "value": b"1"},
            {"offset": 1, "change_type": 1, "key": b"b", "value": b"old"},
            {"offset": 2, "change_type": 2, "key": b"b", "value": b"new"},
            {"offset": 3, "change_type": 3, "key": b"c", "value": None},
        ]
        assert entry.records.schema.equals(SCHEMA)

    def test_change_types_have_their_short_strings(self):
        assert [ct.short for ct in ChangeType] == ["+I", "-U", "+U", "-D"]
        assert [int(ct) for ct in ChangeType] == [0, 1, 2, 3]
        assert ChangeType.from_short("-D") is ChangeType.DELETE and str(ChangeType.UPDATE_AFTER) == "+U"

    def test_offsets_are_contiguous_over_every_append_form(self, log_dir):
        with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
            assert fill(log, [3, 1, 5]) == [(0, 3), (3, 4), (4, 9)]
            assert log.append_batch(record_batch(*expected_records(9, 2))) == (9, 11)
            assert log.append([], [], []) == (11, 11)  # an empty batch writes nothing
            batches = [record_batch(*expected_records(11, 4)), record_batch([], [], []),
                       record_batch(*expected_records(15, 1))]
            assert log.append_batches(batches) == [(11, 15), (15, 15), (15, 16)]
            assert (log.start_offset, log.end_offset) == (0, 16)
            assert [(e.base_offset, e.count) for e in log.read(0, 1 << 20)] == [
                (0, 3), (3, 1), (4, 5), (9, 2), (11, 4), (15, 1)]
            assert read_all(log) == expected_rows(0, 16)

    def test_append_batch_casts_compatible_column_types(self, log_dir):
        batch = pa.RecordBatch.from_pydict({
            "value": pa.array([b"v", None], pa.large_binary()),
            "key": pa.array([b"k1", b"k2"], pa.large_binary()),
            "change_type": pa.array([0, 3], pa.int32()),
        })
        with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
            assert log.append_batch(batch) == (0, 2)
            assert records_of(log.read(0, 1 << 20)) == [
                {"offset": 0, "change_type": 0, "key": b"k1", "value": b"v"},
                {"offset": 1, "change_type": 3, "key": b"k2", "value": None}]

    @pytest.mark.parametrize("types, keys, values", [
        ([7], [b"k"], [b"v"]),            # no such change type
        ([-1], [b"k"], [b"v"]),
        ([0], [None], [b"v"]),            # null key
        ([0, 0], [b"k"], [b"v"]),         # columns of different lengths
        ([0], ["not bytes"], [12]),
    ])
    def test_a_malformed_batch_is_an_invalid_request_and_writes_nothing(self, log_dir, types, keys, values):
        with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
            with pytest.raises(InvalidRequestError):
                log.append(types, keys, values)
            assert log.end_offset == 0 and log.append([0], [b"k"], [b"v"]) == (0, 1)

    def test_read_from_the_middle_of_an_entry_starts_exactly_there(self, log_dir):
        with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
            fill(log, [10, 10])
            entries = log.read(7, 1 << 20)
            assert [(e.base_offset, e.count) for e in entries] == [(7, 3), (10, 10)]
            assert entries[0].offsets().to_pylist() == [7, 8, 9]
            assert records_of(entries) == expected_rows(7, 20)
            assert records_of(log.read(19, 1)) == expected_rows(19, 20)

    def test_max_bytes_gives_at_least_one_entry_and_stops_before_exceeding(self, log_dir):
        with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
            fill(log, [50] * 6)
            sizes = [len(raw) for raw in log.read_raw(0, 1 << 20)]
            assert len(sizes) == 6
            assert [e.base_offset for e in log.read(0, 1)] == [0]  # one entry, bigger than the budget
            assert [e.base_offset for e in log.read(25, 1)] == [25]
            budget = sizes[0] + sizes[1] + sizes[2] - 1
            assert [e.base_offset for e in log.read(0, budget)] == [0, 50]
            assert [e.base_offset for e in log.read(0, budget + 1)] == [0, 50, 100]
            with pytest.raises(InvalidRequestError):
                log.read(0, 0)

    def test_read_raw_entries_decode_to_what_read_returns(self, log_dir):
        with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
            fill(log, [10, 5])
            raw = log.read_raw(4, 1 << 20)
            assert all(isinstance(r, bytes) for r in raw) and len(raw) == 2
            decoded = [decode_entry(raw[0], from_offset=4), Changelog.decode_entry(raw[1])]
            assert decode_entry(raw[0]).base_offset == 0  # raw entries are whole
            assert records_of(decoded) == records_of(log.read(4, 1 << 20)) == expected_rows(4, 15)
            with pytest.raises(CorruptLogError):
                decode_entry(raw[0][:-1])
            damaged = bytearray(raw[1])
            damaged[-3] ^= 1
            with pytest.raises(CorruptLogError, match="CRC"):
                decode_entry(bytes(damaged))

    def test_offsets_outside_the_log_are_typed_errors(self, log_dir):
        with Changelog(log_dir, segment_bytes=1 << 20, fsync=False) as log:
            assert log.read(0, 100) == [] and log.read_raw(0, 100) == []  # empty log
            fill(log, [5])
            assert log.read(5, 100) == []  # the end offset: nothing yet
            with pytest.raises(LogOffsetOutOfRangeError) as info:
                log.read(6, 100)
            assert isinstance(info.value, InvalidRequestError)
            assert info.value.details == {"offset": 6, "start_offset": 0, "end_offset": 5}
            with pytest.raises(LogOffsetOutOfRangeError):
                log.read_raw(-1, 100)

    def test_reads_cross_segment_rolls(self, log_dir):
        with Changelog(log_dir, segment_bytes=2000, fsync=False) as log:
            fill(log, [random.Random(7).randint(1, 30) for _ in range(40)])
            infos = log.segments()
            assert len(infos) > 5 and len(segment_files(log_dir)) == len(infos)
            assert [s.base_offset for s in infos[1:]] == [s.end_offset for s in infos[:-1]]
            assert infos[-1].end_offset == log.end_offset
            assert all(s.size <= 2000 or len(entry_positions(Path(s.path))) == 1 for s in infos)
            assert records_of(log.read(0, 1 << 30)) == expected_rows(0, log.end_offset)
            for offset in range(0, log.end_offset, 7):
                assert log.read(offset, 1)[0].batch.column("offset")[0].as_py() == offset
            assert read_all(log) == expected_rows(0, log.end_offset)

    def test_one_append_batches_call_may_roll_several_segments(self, log_dir):
        with Changelog(log_dir, segment_bytes=1500) as log:
            fill(log, [3])
            batches = [record_batch(*expected_records(3 + 10 * i, 10)) for i in range(8)]
            assert log.append_batches(batches) == [(3 + 10 * i, 13 + 10 * i) for i in range(8)]
            assert len(log.segments()) == 9
            assert read_all(log) == expected_rows(0, 83)
        with Changelog(log_dir, segment_bytes=1500) as log:
            assert len(log.segments()) == 9 and read_all(log) == expected_rows(0, 83)

    def test_a_failed_write_is_undone_and_blocks_appends_until_reopen(self, log_dir, monkeypatch):
        log = Changelog(log_dir, segment_bytes=1 << 20)
        fill(log, [5])
        size = log.segments()[-1].size

        def disk_full(fd, buffers):
            os.write(fd, buffers[0][:10])  # part of the entry reaches the file
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "writev", disk_full)
        with pytest.raises(ChangelogError, match="No space left"):
            fill(log, [3])
        monkeypatch.undo()
        assert log.end_offset == 5 and os.path.getsize(log.segments()[-1].path) == size
        with pytest.raises(ChangelogError, match="failed earlier"):
            fill(log, [3])
        assert read_all(log) == expected_rows(0, 5)  # reads go on
        log.close()
        with Changelog(log_dir, segment_bytes=1 << 20) as log:
            assert fill(log, [3]) == [(5, 8)]

    def test_an_entry_bigger_than_a_segment_gets_a_segment_of_its_own(self, log_dir):
        with Changelog(log_dir, segment_bytes=100, fsync=False) as log:
            fill(log, [20, 20, 1])
            assert [(s.base_offset, s.end_offset) for s in log.segments()] == [(0, 20), (20, 40), (40, 41)]

    def test_reopen_keeps_everything_and_continues_the_offsets(self, log_dir):
        with Changelog(log_dir, segment_bytes=3000) as log:
            fill(log, [30, 1, 17, 40])
            before = log.segments()
        with Changelog(log_dir, segment_bytes=3000) as log:
            assert [(s.base_offset, s.end_offset, s.size) for s in log.segments()] == [
                (s.base_offset, s.end_offset, s.size) for s in before]
            assert fill(log, [3]) == [(88, 91)]
        with Changelog(log_dir, segment_bytes=3000, verify_all=True) as log:
            assert read_all(log) == expected_rows(0, 91)

    def test_from_config_uses_the_log_keys(self, log_dir):
        config = Config({"log.segment.bytes": "1kb", "log.flush.fsync": False}, env={})
        with Changelog.from_config(log_dir, config) as log:
            assert (log.segment_bytes, log.fsync) == (1024, False)

    def test_one_instance_per_directory_and_none_after_close(self, log_dir):
        log = Changelog(log_dir, segment_bytes=1 << 20)
        with pytest.raises(ChangelogError, match="another Changelog"):
            Changelog(log_dir, segment_bytes=1 << 20)
        log.close()
        log.close()  # idempotent
        for call in (lambda: log.append([0], [b"k"], [b"v"]), lambda: log.read(0, 10), log.segments):
            with pytest.raises(ChangelogError, match="closed"):
                call()
        Changelog(log_dir, segment_bytes=1 << 20).close()  # the directory lock was released

    def test_readers_concurrent_with_the_writer_see_only_whole_entries(self, log_dir):
        errors, done = [], threading.Event()

        def reader(log: Changelog) -> None:
            try:
                offset = 0
                while not done.is_set() or offset < log.end_offset:
                    entries = log.read(offset, 5000)
                    rows = records_of(entries)
                    if rows:
                        assert rows == expected_rows(offset, offset + len(rows))
                        offset += len(rows)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        with Changelog(log_dir, segment_bytes=4000, fsync=False) as log:
            threads = [threading.Thread(target=reader, args=(log,)) for _ in range(2)]
            for t in threads:
                t.start()
            rng = random.Random(3)
            for _ in range(300):
                fill(log, [rng.randint(1, 40)])
            done.set()
            for t in threads:
                t.join(timeout=60)
        assert not errors, errors[0]
