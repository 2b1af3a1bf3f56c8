"""The changelog after failures: recovery at open (torn tails, damage that is not one), retention,
and SIGKILL of a writer that acknowledges each fsynced append."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlease.ops.local_cluster import dying_with_parent
from kvlease.common.logentry import HEADER_SIZE, CorruptLogError
from kvlease.tablet.log.changelog import Changelog, LogOffsetOutOfRangeError
from tests.support.procs import kill_after_reading
from tests.tablet.log.test_changelog import (  # noqa: F401 - the fixture log_dir and shared helpers
    PROJECT_ROOT, entry_positions, expected_rows, fill, flip_byte, log_dir, read_all, segment_files)



@pytest.mark.unit
class TestRecovery:
    def _three_entries(self, log_dir: str) -> Path:
        with Changelog(log_dir, segment_bytes=1 << 20) as log:
            fill(log, [10, 20, 30])
        [path] = segment_files(log_dir)
        return path

    def _reopen_expecting(self, log_dir: str, end: int, caplog, dropped: bool) -> None:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvlease.tablet.log.changelog"):
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
        with caplog.at_level(logging.WARNING, logger="kvlease.tablet.log.changelog"):
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

@pytest.mark.slow
def test_every_acknowledged_batch_survives_sigkill(log_dir, writers):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    print(f"seed {seed}")
    rng.seed(seed)
    acked: list[tuple[int, int]] = []
    for round_ in range(4):
        proc = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "tests.support.changelog_writer", log_dir,
                               str(rng.choice([20_000, 300_000])), str(seed + round_)]),
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        writers.append(proc)
        opened = proc.stdout.readline().split()
        assert opened[:1] == [b"open"], proc.stderr.read().decode()
        expected_base = int(opened[2])
        assert expected_base >= (acked[-1][1] if acked else 0)  # the reopen lost no acknowledged record
        for line in kill_after_reading(proc, rng.uniform(0.05, 1.0)):  # only acknowledged lines
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
