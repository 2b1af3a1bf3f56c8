"""The bucket changelog: append/read, segment rolls, recovery of torn tails, retention, crashes."""

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
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from common.config import Config
from common.errors import InvalidRequestError
from ops.zookeeper import dying_with_parent
from common.logentry import (HEADER_SIZE, SCHEMA, ChangeType, ChangelogError, CorruptLogError, decode_entry,
                             record_batch)
from tablet.changelog import Changelog, LogOffsetOutOfRangeError
from tests.changelog_writer import expected_records

PROJECT_ROOT = Path(__file__).resolve().parent.parent


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


@pytest.mark.unit
class TestRecovery:
    def _three_entries(self, log_dir: str) -> Path:
        with Changelog(log_dir, segment_bytes=1 << 20) as log:
            fill(log, [10, 20, 30])
        [path] = segment_files(log_dir)
        return path

    def _reopen_expecting(self, log_dir: str, end: int, caplog, dropped: bool) -> None:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tablet.changelog"):
            log = Changelog(log_dir, segment_bytes=1 << 20)
        with log:
            assert log.end_offset == end
            assert ("torn tail" in caplog.text) is dropped
            assert read_all(log) == expected_rows(0, end)
            assert fill(log, [4]) == [(end, end + 4)]  # appends continue at the right offset
        with Changelog(log_dir, segment_bytes=1 << 20) as log:
            assert read_all(log) == expected_rows(0, end + 4)

    @pytest.mark.parametrize("cut", ["mid-payload", "mid-header", "one byte"])
    def test_a_torn_tail_is_dropped_on_reopen(self, log_dir, caplog, cut):
        path = self._three_entries(log_dir)
        last = entry_positions(path)[-1]
        size = path.stat().st_size
        keep = {"mid-payload": last + HEADER_SIZE + 50, "mid-header": last + 11, "one byte": size - 1}[cut]
        os.truncate(path, keep)
        self._reopen_expecting(log_dir, 30, caplog, dropped=True)

    def test_the_warning_names_how_many_bytes_were_dropped(self, log_dir, caplog):
        path = self._three_entries(log_dir)
        last = entry_positions(path)[-1]
        os.truncate(path, last + 100)
        with caplog.at_level(logging.WARNING, logger="tablet.changelog"):
            Changelog(log_dir, segment_bytes=1 << 20).close()
        assert "torn tail of 100 bytes" in caplog.text

    def test_zeros_after_the_last_entry_are_dropped(self, log_dir, caplog):
        path = self._three_entries(log_dir)
        with open(path, "ab") as fh:
            fh.write(b"\0" * 5000)  # the file grew but the data never reached the disk
        self._reopen_expecting(log_dir, 60, caplog, dropped=True)

    def test_a_crc_mismatch_in_the_tail_entry_is_dropped(self, log_dir, caplog):
        path = self._three_entries(log_dir)
        flip_byte(path, path.stat().st_size - 20)
        self._reopen_expecting(log_dir, 30, caplog, dropped=True)

    def test_a_clean_log_reopens_without_a_warning(self, log_dir, caplog):
        self._three_entries(log_dir)
        self._reopen_expecting(log_dir, 60, caplog, dropped=False)

    @pytest.mark.parametrize("where", ["payload", "magic", "length"])
    def test_a_corrupt_entry_followed_by_good_ones_raises(self, log_dir, where):
        path = self._three_entries(log_dir)
        second = entry_positions(path)[1]
        flip_byte(path, second + {"payload": HEADER_SIZE + 40, "magic": 0, "length": 17}[where])
        with pytest.raises(CorruptLogError, match="not a torn write"):
            Changelog(log_dir, segment_bytes=1 << 20)
        assert path.stat().st_size > second  # nothing was cut away

    def test_corruption_in_an_older_segment_raises(self, log_dir):
        with Changelog(log_dir, segment_bytes=1000, fsync=False) as log:
            fill(log, [5] * 12)
        first = segment_files(log_dir)[0]
        flip_byte(first, 2)  # the magic of its first entry
        with pytest.raises(CorruptLogError, match="bad magic"):
            Changelog(log_dir, segment_bytes=1000)

    def test_payload_damage_in_an_older_segment_raises_on_read_or_with_verify_all(self, log_dir):
        with Changelog(log_dir, segment_bytes=1000, fsync=False) as log:
            fill(log, [5] * 12)
        flip_byte(segment_files(log_dir)[0], HEADER_SIZE + 30)
        with Changelog(log_dir, segment_bytes=1000) as log:  # headers only: opens
            with pytest.raises(CorruptLogError, match="CRC"):
                log.read(0, 100)
            assert log.read(log.segments()[1].base_offset, 100)  # the rest stays readable
        with pytest.raises(CorruptLogError, match="CRC"):
            Changelog(log_dir, segment_bytes=1000, verify_all=True)

    def test_a_missing_middle_segment_raises(self, log_dir):
        with Changelog(log_dir, segment_bytes=1000, fsync=False) as log:
            fill(log, [5] * 12)
        segment_files(log_dir)[2].unlink()
        with pytest.raises(CorruptLogError, match="starts at"):
            Changelog(log_dir, segment_bytes=1000)

    def test_an_empty_newest_segment_is_removed_and_its_predecessor_recovered(self, log_dir, caplog):
        path = self._three_entries(log_dir)
        last = entry_positions(path)[-1]
        os.truncate(path, last + 30)  # torn tail, and a roll had already created the next file
        (Path(log_dir) / f"{60:020d}.log").touch()
        self._reopen_expecting(log_dir, 30, caplog, dropped=True)
        assert [p.name for p in segment_files(log_dir)] == [f"{0:020d}.log"]

    def test_a_crash_right_after_a_roll_loses_nothing(self, log_dir):
        with Changelog(log_dir, segment_bytes=1000, fsync=False) as log:
            fill(log, [5] * 4)
            end = log.end_offset
        (Path(log_dir) / f"{end:020d}.log").touch()
        with Changelog(log_dir, segment_bytes=1000) as log:
            assert log.end_offset == end and fill(log, [5]) == [(end, end + 5)]
            assert read_all(log) == expected_rows(0, end + 5)


@pytest.mark.unit
class TestRetention:
    def test_truncate_before_removes_only_whole_old_segments(self, log_dir):
        with Changelog(log_dir, segment_bytes=1000, fsync=False) as log:
            fill(log, [5] * 12)
            infos = log.segments()
            cut = infos[2].base_offset + 1  # inside the third segment
            assert log.truncate_before(cut) == 2
            assert log.start_offset == infos[2].base_offset
            assert [p.name for p in segment_files(log_dir)] == [os.path.basename(s.path) for s in infos[2:]]
            with pytest.raises(LogOffsetOutOfRangeError):
                log.read(infos[2].base_offset - 1, 100)
            assert read_all(log) == expected_rows(infos[2].base_offset, log.end_offset)
            assert log.truncate_before(cut) == 0
            assert log.truncate_before(log.end_offset + 100) == len(infos) - 3
            assert [(s.base_offset, s.end_offset) for s in log.segments()] == [
                (infos[-1].base_offset, log.end_offset)]  # the active segment stays
            end = log.end_offset
        with Changelog(log_dir, segment_bytes=1000) as log:
            assert (log.start_offset, log.end_offset) == (infos[-1].base_offset, end)
            assert fill(log, [2]) == [(end, end + 2)]

    def test_segments_report_sizes_and_mtimes_for_time_based_retention(self, log_dir):
        with Changelog(log_dir, segment_bytes=1000, fsync=False) as log:
            fill(log, [5] * 6)
            infos = log.segments()
            assert sum(s.size for s in infos) == sum(p.stat().st_size for p in segment_files(log_dir))
            assert all(abs(s.mtime - time.time()) < 60 for s in infos)
            old = infos[0]
            os.utime(old.path, (old.mtime - 86400, old.mtime - 86400))
            expired = [s for s in log.segments() if s.mtime < time.time() - 3600]
            assert [s.base_offset for s in expired] == [0]
            assert log.truncate_before(expired[-1].end_offset) == 1


# --- crash test: SIGKILL a writer that acknowledges each fsynced append ------------------------------

@pytest.fixture
def writers() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


@pytest.mark.slow
def test_every_acknowledged_batch_survives_sigkill(log_dir, writers):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    print(f"seed {seed}")
    rng.seed(seed)
    acked: list[tuple[int, int]] = []
    for round_ in range(4):
        proc = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "tests.changelog_writer", log_dir,
                               str(rng.choice([20_000, 300_000])), str(seed + round_)]),
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        writers.append(proc)
        opened = proc.stdout.readline().split()
        assert opened[:1] == [b"open"], proc.stderr.read().decode()
        expected_base = int(opened[2])
        assert expected_base >= (acked[-1][1] if acked else 0)  # the reopen lost no acknowledged record
        deadline = time.monotonic() + rng.uniform(0.05, 1.0)
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line.endswith(b"\n"), f"writer died: {proc.stderr.read().decode()}"
            lines.append(line)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        lines += proc.stdout.read().splitlines(keepends=True)  # acks still in the pipe
        for line in lines:
            if line.endswith(b"\n"):  # a line cut by the kill was never acknowledged
                base, nxt = map(int, line.split())
                assert base == expected_base
                acked.append((base, nxt))
                expected_base = nxt

        with Changelog(log_dir, segment_bytes=1 << 20) as log:
            assert log.start_offset == 0
            assert log.end_offset >= acked[-1][1]
            assert read_all(log) == expected_rows(0, log.end_offset)  # acked or not, nothing is wrong
            for base, nxt in acked:
                [entry] = log.read(base, 1)
                assert (entry.base_offset, entry.next_offset) == (base, nxt)
        # The next round's writer reopens what this round's kill left behind.
