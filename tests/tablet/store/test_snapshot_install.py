"""Installing a snapshot checkpoint as a replicated bucket's files (tablet/store/snapshot_install.py): real RocksDB and
changelogs in temp dirs; a crash at each step of the install is simulated by an error there, then a new store opens
the directory as a restarted server would."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest

from kvlease.common.errors import InvalidSnapshotError
from kvlease.tablet.store import snapshot_install
from tests.tablet.bucket.test_bucket import bucket_dir, keys, rows, state  # noqa: F401
from tests.tablet.bucket.test_bucket_replicated import open_store, replicate

pytestmark = pytest.mark.unit


@pytest.fixture
def leader_dir(kvlease_tmp: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="leader-", dir=kvlease_tmp)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def leader_with_checkpoint(dir: str) -> tuple:
    """A leader store with 6 committed records, a checkpoint of them, then 3 more records committed."""
    leader = open_store(dir)
    leader.become_leader(1)
    leader.write(rows((1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)))
    leader.write(rows((1, "A", 1.5)), keys(2))  # -U +U -D: offsets 3..5
    leader.advance_high_watermark(leader.log_end_offset)
    checkpoint = os.path.join(dir, "cp")
    assert leader.checkpoint(checkpoint) == 6
    leader.write(rows((4, "d", 4.0), (3, "C", 3.5)))
    leader.advance_high_watermark(leader.log_end_offset)
    return leader, checkpoint


def stale_follower(dir: str):
    """A follower holding other data than the leader's, under an older epoch."""
    follower = open_store(dir)
    follower.become_leader(0)
    follower.write(rows((7, "x", 7.0)))
    follower.advance_high_watermark(1)
    follower.become_follower(1)
    return follower


def test_an_installed_snapshot_replaces_rocksdb_and_the_log_continues_from_its_offset(bucket_dir, leader_dir):
    leader, checkpoint = leader_with_checkpoint(leader_dir)
    with leader, stale_follower(bucket_dir) as follower:
        follower.install_snapshot(checkpoint, 6)
        assert not os.path.exists(checkpoint)  # moved, not copied
        assert follower.list_offsets() == (6, 6) and follower.applied_offset == 6 == follower.high_watermark
        assert follower.last_epoch == -1 and follower.epochs.entries == []
        assert state(follower) == {1: (1, "A", 1.5), 3: (3, "c", 3.0)}
        assert replicate(leader, follower) == leader.log_end_offset
        follower.advance_high_watermark(leader.high_watermark)
        assert state(follower) == state(leader)
        assert follower.last_epoch == 1
        final = state(leader)
    with open_store(bucket_dir) as reopened:  # durable: a restart sees the installed state and the log after it
        reopened.advance_high_watermark(reopened.log_end_offset)
        assert reopened.list_offsets() == (6, 9) and state(reopened) == final
    assert sorted(os.listdir(bucket_dir)) == ["kv", "leader-epochs.json", "log"]


def test_a_checkpoint_of_another_offset_is_refused_and_nothing_changes(bucket_dir, leader_dir):
    leader, checkpoint = leader_with_checkpoint(leader_dir)
    leader.close()
    with stale_follower(bucket_dir) as follower:
        with pytest.raises(InvalidSnapshotError, match="offset 6"):
            follower.install_snapshot(checkpoint, 5)
        assert follower.list_offsets() == (0, 1) and state(follower) == {7: (7, "x", 7.0)}
        with pytest.raises(InvalidSnapshotError, match="not a RocksDB checkpoint"):
            follower.install_snapshot(os.path.join(leader_dir, "nothing-here"), 6)


@pytest.mark.parametrize("crash_at, installed", [
    ("_write_intent", False),  # before the intent: the old state stays
    ("segment_path", False),  # the checkpoint staged, the log not
    ("save", True),  # kv and log swapped, epochs not reset, nothing cleaned: the next open finishes
    ("rename_log", True),  # kv swapped, log not
])
def test_a_crash_midway_leaves_the_old_state_or_the_new_one(bucket_dir, leader_dir, monkeypatch, crash_at, installed):
    leader, checkpoint = leader_with_checkpoint(leader_dir)
    expected = {1: (1, "A", 1.5), 3: (3, "c", 3.0)}
    leader.close()
    follower = stale_follower(bucket_dir)
    _plant_crash(monkeypatch, crash_at)
    with pytest.raises(OSError, match="crash"):
        follower.install_snapshot(checkpoint, 6)
    monkeypatch.undo()
    follower.close()
    with open_store(bucket_dir) as reopened:
        if installed:
            assert reopened.list_offsets() == (6, 6) and state(reopened) == expected
            assert reopened.epochs.entries == []
        else:
            reopened.advance_high_watermark(1)
            assert reopened.list_offsets() == (0, 1) and state(reopened) == {7: (7, "x", 7.0)}
            assert reopened.last_epoch == 0
    assert sorted(os.listdir(bucket_dir)) == ["kv", "leader-epochs.json", "log"]


def _plant_crash(monkeypatch, crash_at: str) -> None:
    def crash(*_args, **_kwargs):
        raise OSError(f"crash at {crash_at}")

    if crash_at == "save":
        monkeypatch.setattr(snapshot_install.epoch_file, "save", crash)
    elif crash_at == "rename_log":
        real = os.rename

        def rename(src, dst):
            if src.endswith(os.path.join(snapshot_install.STAGED, "log")):
                crash()
            real(src, dst)
        monkeypatch.setattr(snapshot_install.os, "rename", rename)
    else:
        monkeypatch.setattr(snapshot_install, crash_at, crash)


@pytest.mark.parametrize("synced", [False, True])
def test_a_checkpoint_already_durable_is_not_fsynced_again_but_what_the_install_creates_is(
        bucket_dir, leader_dir, monkeypatch, synced):
    """``synced`` (a rebuild's download fsynced every file as it landed): the install fsyncs the directories it
    moves the checkpoint through and the empty segment it creates, not the checkpoint's bytes a second time."""
    leader, checkpoint = leader_with_checkpoint(leader_dir)
    checkpoint_files = set(os.listdir(checkpoint))
    synced_paths: list[str] = []
    real = snapshot_install.fsync_path
    monkeypatch.setattr(snapshot_install, "fsync_path", lambda path: (synced_paths.append(path), real(path))[1])
    with leader:
        snapshot_install.install(bucket_dir, checkpoint, 6, fsync=True, synced=synced)
        again = {os.path.basename(p) for p in synced_paths} & checkpoint_files
        assert bool(again) is not synced  # every checkpoint file fsynced again unless synced
        assert any(p.endswith(f"{6:020d}.log") for p in synced_paths)  # the empty segment it creates, either way
        with open_store(bucket_dir) as follower:
            assert follower.list_offsets() == (6, 6) and follower.applied_offset == 6
            assert state(follower) == {1: (1, "A", 1.5), 3: (3, "c", 3.0)}
