"""What a replica must do about its bucket's latest restore before it serves (tablet/replicas/lost_data.py
``work_for``): the coordinator says whether it still owes it; its ``restore.json`` marker says whether it
was carried out already (then it is only confirmed, never repeated). Pure: a bucket dir and roles."""

from __future__ import annotations

import json
import os

import pytest

from kvlease.common.data_loss import RESTORE, UNCLEAN, DataLoss
from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.replicas import lost_data
from kvlease.tablet.replication.roles import BucketRole

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 1)
LOSS = DataLoss(RESTORE, 6, 10, 15, 1, 0, 1)


def role(leader_epoch: int, owed: bool | None, loss: DataLoss = LOSS) -> BucketRole:
    return BucketRole(TABLE, 0, leader_epoch, 1, "", (1,), (1,), leader_epoch, latest_loss=loss, restore_owed=owed)


def mark(bucket_dir, epoch: int, done: bool) -> None:
    os.makedirs(bucket_dir, exist_ok=True)
    with open(os.path.join(bucket_dir, lost_data.RESTORE_FILE), "w") as fh:
        json.dump({"epoch": epoch, "done": done}, fh)


@pytest.mark.parametrize("leader_epoch", [6, 7, 12])
def test_an_owed_restore_is_carried_out_at_any_later_epoch_with_no_marker_and_nothing_pending(tmp_path, leader_epoch):
    assert lost_data.work_for(role(leader_epoch, True), str(tmp_path / "b"), 1) == lost_data.RESTORE


def test_an_owed_restore_interrupted_runs_again_and_one_done_is_only_confirmed(tmp_path):
    mark(tmp_path, 6, done=False)
    assert lost_data.work_for(role(9, True), str(tmp_path), 1) == lost_data.RESTORE
    mark(tmp_path, 6, done=True)
    assert lost_data.work_for(role(9, True), str(tmp_path), 1) == lost_data.CONFIRM
    mark(tmp_path, 3, done=True)  # an older restore's marker: this one is still to do
    assert lost_data.work_for(role(9, True), str(tmp_path), 1) == lost_data.RESTORE


def test_a_restore_not_owed_is_never_carried_out_again(tmp_path):
    """Confirmed (then maybe written to, or wiped and rebuilt from a later snapshot: no marker), or a replica
    that joined after the restore: nothing, even at the restore's own epoch or with work pending."""
    assert lost_data.work_for(role(6, False), str(tmp_path / "rebuilt"), 1, pending=lost_data.RESTORE) is None
    mark(tmp_path, 6, done=False)
    assert lost_data.work_for(role(6, False), str(tmp_path), 1) is None


def test_without_the_coordinators_word_the_epoch_marker_and_pending_work_decide(tmp_path):
    """A restore recorded before the coordinator kept track of who owes it (``restore_owed`` unset)."""
    assert lost_data.work_for(role(6, None), str(tmp_path), 1) == lost_data.RESTORE
    assert lost_data.work_for(role(7, None), str(tmp_path), 1) is None
    assert lost_data.work_for(role(7, None), str(tmp_path), 1, pending=lost_data.RESTORE) == lost_data.RESTORE
    mark(tmp_path, 6, done=False)
    assert lost_data.work_for(role(7, None), str(tmp_path), 1) == lost_data.RESTORE
    mark(tmp_path, 6, done=True)
    assert lost_data.work_for(role(6, None), str(tmp_path), 1, pending=lost_data.RESTORE) is None


def test_an_unclean_takeover_ignores_restore_owed(tmp_path):
    unclean = DataLoss(UNCLEAN, 6, -1, 15, 0, 0, 1)
    assert lost_data.work_for(role(6, None, unclean), str(tmp_path), 1) == lost_data.UNCLEAN
    assert lost_data.work_for(role(7, None, unclean), str(tmp_path), 1) is None
