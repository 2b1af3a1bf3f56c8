"""The chaos drill's full disk (ops/drills/chaos_disks.py) on a real small tmpfs (root only; skipped otherwise):
not a byte left while it lasts, room taken again as it is freed, all of it back at the end, and a filler a
killed drill left behind deleted by the next one."""

from __future__ import annotations

import errno

import pytest

from kvlease.ops.drills.chaos_disks import FILLER, DiskFill, free_bytes, restore_interrupted
from tests.support.fixtures.small_disk import fill, small_disk

pytestmark = pytest.mark.unit


def test_a_full_disk_has_no_byte_left_takes_what_is_freed_and_gives_it_all_back(tmp_path):
    with small_disk(tmp_path / "disk", size_mb=4) as disk:
        (disk / "store").write_bytes(b"s" * (1 << 20))  # what a server wrote before
        full = DiskFill(disk)
        full.begin()
        try:
            assert free_bytes(disk) == 0 and full.written > 0
            with pytest.raises(OSError) as raised:  # a server's next write
                with open(disk / "new", "wb", buffering=0) as fh:
                    fh.write(b"x" * 4096)
            assert raised.value.errno == errno.ENOSPC
            (disk / "store").unlink()  # the server frees space (a compaction's inputs)
            assert free_bytes(disk) >= 1 << 20
            assert full.top_up() >= 1 << 20 and free_bytes(disk) == 0  # taken again
        finally:
            full.end()
        assert not (disk / FILLER).exists() and free_bytes(disk) > 3 << 20
        full.end()  # again: nothing left to do


def test_a_filler_a_killed_drill_left_is_deleted_by_the_next_one(tmp_path):
    cluster = tmp_path / "cluster"
    with small_disk(cluster / "tablet-2" / "data", size_mb=4) as disk:
        fill(disk, 0, name=FILLER)  # a DiskFill never ended: the drill was killed (its file closed with it)
        assert free_bytes(disk) == 0
        doc = {"tablets": [{"id": "1"}, {"id": "2"}], "tablet_disk": {"size_bytes": 4 << 20, "tablets": ["1", "2"]}}
        assert restore_interrupted(str(cluster), doc) == ["2"]
        assert not (disk / FILLER).exists() and free_bytes(disk) > 3 << 20
        assert restore_interrupted(str(cluster), doc) == []
        assert restore_interrupted(str(cluster), {"tablets": [{"id": "2"}]}) == []  # no small disks: nothing asked
