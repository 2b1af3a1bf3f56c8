"""Re-basing a follower's RocksDB on a snapshot checkpoint (tablet/store/kv_rebase.py, BucketStore.rebase_kv): real
RocksDB and changelogs in temp dirs. The follower keeps its log, epochs and high watermark and ends with the same rows;
a crash at each step of the swap is simulated by an error there, then a new store opens the directory as a restarted
server would."""

from __future__ import annotations

import os
import shutil

import pytest

from kvlease.common.errors import InvalidSnapshotError
from kvlease.tablet.store import kv_rebase
from tests.tablet.bucket.test_bucket import bucket_dir, keys, rows, state  # noqa: F401
from tests.tablet.bucket.test_bucket_replicated import open_store, replicate
from tests.tablet.store.test_snapshot_install import leader_dir  # noqa: F401 - a fixture

pytestmark = pytest.mark.unit


def leader_and_follower(leader_dir: str, follower_dir: str):
    """A leader with a checkpoint at offset 6 and 3 more records, and a follower that replicated and applied all 9."""
    leader = open_store(leader_dir)
    leader.become_leader(1)
    follower = open_store(follower_dir)
    follower.become_follower(1)
    leader.write(rows((1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)))
    leader.write(rows((1, "A", 1.5)), keys(2))  # -U +U -D: offsets 3..5
    leader.advance_high_watermark(leader.log_end_offset)
    checkpoint = os.path.join(leader_dir, "cp")
    assert leader.checkpoint(checkpoint) == 6
    leader.write(rows((4, "d", 4.0), (3, "C", 3.5)))
    leader.advance_high_watermark(leader.log_end_offset)
    assert replicate(leader, follower) == 9
    follower.advance_high_watermark(leader.high_watermark)
    return leader, follower, checkpoint


def kv_files(dir: str) -> set[str]:
    return {name for name in os.listdir(os.path.join(dir, "kv")) if name.endswith(".sst")}


def test_a_rebased_follower_holds_the_snapshots_files_and_the_same_rows_log_and_watermark(bucket_dir, leader_dir):
    leader, follower, checkpoint = leader_and_follower(leader_dir, bucket_dir)
    with leader, follower:
        snapshot_ssts = {name for name in os.listdir(checkpoint) if name.endswith(".sst")}
        before = (state(follower), follower.list_offsets(), follower.high_watermark, follower.epochs.entries)
        follower.rebase_kv(checkpoint, 6)
        assert not os.path.exists(checkpoint)  # moved, not copied
        assert snapshot_ssts <= kv_files(bucket_dir)
        assert (state(follower), follower.list_offsets(), follower.high_watermark, follower.epochs.entries) == before
        assert follower.applied_offset == 9 and state(follower) == state(leader)
        leader.write(rows((5, "e", 5.0)))
        leader.advance_high_watermark(leader.log_end_offset)
        assert replicate(leader, follower) == leader.log_end_offset  # it keeps following
        follower.advance_high_watermark(leader.high_watermark)
        assert state(follower) == state(leader)
        final = state(leader)
    with open_store(bucket_dir) as reopened:
        reopened.advance_high_watermark(reopened.log_end_offset)
        assert state(reopened) == final
    assert sorted(os.listdir(bucket_dir)) == ["kv", "leader-epochs.json", "log"]


def test_a_checkpoint_of_another_offset_or_beyond_what_was_applied_is_refused_and_nothing_changes(bucket_dir,
                                                                                                  leader_dir):
    leader, follower, checkpoint = leader_and_follower(leader_dir, bucket_dir)
    with leader, follower:
        files = kv_files(bucket_dir)
        with pytest.raises(InvalidSnapshotError, match="offset 6"):
            follower.rebase_kv(checkpoint, 5)
        follower.truncate_to(follower.applied_offset)  # nothing to cut: still 9
        with pytest.raises(InvalidSnapshotError):
            follower.rebase_kv(checkpoint, 10)  # the follower applied less than the snapshot holds
        assert kv_files(bucket_dir) == files and state(follower) == state(leader)


def test_a_changelog_starting_above_the_snapshot_is_refused_at_the_swap(bucket_dir, leader_dir, monkeypatch):
    leader, follower, checkpoint = leader_and_follower(leader_dir, bucket_dir)
    with leader, follower:
        monkeypatch.setattr(kv_rebase, "log_start", lambda dir: 7)  # retention ran after the first look
        with pytest.raises(InvalidSnapshotError, match="starts at 7"):
            follower.rebase_kv(checkpoint, 6)
        assert os.path.exists(checkpoint) and state(follower) == state(leader)


def _killed(*_args, **_kwargs):
    raise OSError("killed")


@pytest.mark.parametrize("point", ["staging", "intent", "mid-swap", "cleanup"])
def test_a_crash_at_any_step_ends_with_the_same_rows_and_log(bucket_dir, leader_dir, monkeypatch, point):
    leader, follower, checkpoint = leader_and_follower(leader_dir, bucket_dir)
    expected, offsets = state(leader), follower.files.offsets()[:2]  # the changelog's start and end
    snapshot_ssts = {name for name in os.listdir(checkpoint) if name.endswith(".sst")}
    old_ssts = kv_files(bucket_dir)
    if point == "staging":
        real_move = shutil.move
        monkeypatch.setattr(kv_rebase.shutil, "move", lambda a, b: (real_move(a, b), _killed()))
    elif point == "intent":
        monkeypatch.setattr(kv_rebase, "write_durably", _killed)
    elif point == "mid-swap":
        real = os.rename
        monkeypatch.setattr(kv_rebase.os, "rename", lambda a, b: (real(a, b), _killed())
                            if b.endswith(f"{kv_rebase.OLD}/kv") else real(a, b))
    else:
        monkeypatch.setattr(kv_rebase.os, "unlink", _killed)
    with leader:
        with pytest.raises(OSError, match="killed"):
            follower.rebase_kv(checkpoint, 6)
        monkeypatch.undo()
        follower.files.close()  # the process dies: nothing more runs on these files
        with open_store(bucket_dir) as reopened:  # a restarted server: its high watermark comes from the leader
            assert reopened.files.offsets()[:2] == offsets  # the log is untouched
            reopened.advance_high_watermark(leader.high_watermark)  # (as after any crash: RocksDB has no WAL)
            assert reopened.list_offsets() == (0, 9)
            assert state(reopened) == expected
            if point in ("mid-swap", "cleanup"):  # past the intent: the snapshot's RocksDB, the log replayed
                assert snapshot_ssts <= kv_files(bucket_dir)
            else:  # before it: the old RocksDB
                assert old_ssts <= kv_files(bucket_dir)
        assert sorted(os.listdir(bucket_dir)) == ["kv", "leader-epochs.json", "log"]


def test_log_start_reads_the_segment_names(tmp_path):
    assert kv_rebase.log_start(str(tmp_path)) is None
    (tmp_path / "log").mkdir()
    assert kv_rebase.log_start(str(tmp_path)) is None
    for base in (40, 12):
        (tmp_path / "log" / f"{base:020d}.log").write_bytes(b"")
    (tmp_path / "log" / "notes.txt").write_bytes(b"")
    assert kv_rebase.log_start(str(tmp_path)) == 12


def test_only_a_snapshot_committed_after_the_latest_loss_is_a_base():
    from types import SimpleNamespace

    from kvlease.common.data_loss import DataLoss
    from kvlease.tablet.replication.rebase import of_this_history

    def replica(loss):
        return SimpleNamespace(role=SimpleNamespace(latest_loss=loss))

    assert of_this_history(replica(None), 7)
    unclean = DataLoss("UNCLEAN", 5, 100, newest_snapshot_id=7)  # snapshot 7 may hold the lost history
    assert not of_this_history(replica(unclean), 7)
    assert of_this_history(replica(unclean), 8)
    restore = DataLoss("RESTORE", 5, 100, snapshot_id=9)
    assert not of_this_history(replica(restore), 9)


def test_an_earlier_attempts_staged_ssts_of_the_snapshot_are_kept_and_the_rest_removed(tmp_path):
    from kvlease.common.kvsnapshot import ManifestFile
    from kvlease.tablet.replication.rebase import keep_staged
    from kvlease.tablet.store.snapshot import fingerprint

    stage = tmp_path / "rebase-download"
    stage.mkdir()
    for name, body in (("000007.sst", b"a" * 70_000), ("000008.sst", b"b" * 100), ("000009.sst", b"c" * 50),
                       ("MANIFEST-000004", b"m"), ("000010.sst.part", b"p")):
        (stage / name).write_bytes(body)
    (stage / "junk").mkdir()
    keys = {(name, size, fingerprint(str(stage / name), size)): ManifestFile(f"kv/1/0/shared/{name}", name, size)
            for name, size in (("000007.sst", 70_000), ("000008.sst", 100))}
    keys[("000009.sst", 50, 0)] = ManifestFile("kv/1/0/shared/x", "000009.sst", 50)  # another file of that name
    assert keep_staged(str(stage), keys) == {"000007.sst", "000008.sst"}
    assert sorted(p.name for p in stage.iterdir()) == ["000007.sst", "000008.sst"]
    assert keep_staged(str(tmp_path / "new"), keys) == set() and (tmp_path / "new").is_dir()
