"""The bucket keeper's round (tablet/replicas/keeper.py) against pushes taken while it works on a bucket: a
real ReplicaManager and store in a temp dir, pushes given to it directly, the keeper's rounds run by hand."""

from __future__ import annotations

import pytest

from kvlease.common import config as cfg
from kvlease.common.data_loss import RESTORE, DataLoss
from kvlease.common.storage.file import FileStorage
from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.replicas import lost_data
from kvlease.tablet.replicas.keeper import BucketKeeper
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.tablet.replication.roles import NO_LEADER, BucketRole

pytestmark = pytest.mark.unit

TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)
KEY = (7, 0)
OFFLINE = BucketRole(TABLE, 0, 2, NO_LEADER, "", (1,), (), 2,
                     offline_reason="data lost on tablet server 1: it started with a new data dir")
#: restored empty (no snapshot: nothing to download), owed by this server
RESTORED = BucketRole(TABLE, 0, 3, 1, "", (1,), (1,), 3, latest_loss=DataLoss(RESTORE, 3, 0, 15, 0, 0, 1, owed_by=(1,)),
                      restore_owed=True)


class NoSnapshots:
    """The coordinator, as the keeper asks it for a led bucket's latest snapshot: none committed."""

    def get_latest_kv_snapshots(self, table_id, partition_id=None):
        return {}


@pytest.fixture
def manager(tmp_path):
    replicas = ReplicaManager(str(tmp_path / "data"), cfg.Config({"log.flush.fsync": False}),
                              FileStorage(str(tmp_path / "remote")), admin=NoSnapshots(), server_id=1)
    yield replicas
    replicas.close()


def test_a_restore_pushed_while_the_keeper_opens_the_offline_bucket_is_carried_out(manager, monkeypatch):
    """A wiped server is told its one-replica bucket is offline, then at once that it is restored: the restore
    push lands while the keeper's first round opens the offline replica. The round must not take the bucket
    off the keeper's set after the push put it there for the restore (it was never carried out: the
    bucket never served again)."""
    manager.update_leadership(1, [OFFLINE], [])
    mark = manager.held.mark

    def restore_pushed_meanwhile(*key):  # the keeper opened the files: the push comes before its round ends
        monkeypatch.setattr(manager.held, "mark", mark)
        manager.update_leadership(1, [RESTORED], [])
        mark(*key)

    monkeypatch.setattr(manager.held, "mark", restore_pushed_meanwhile)
    keeper = BucketKeeper(manager)
    keeper.run_once()
    assert manager.replica(*KEY).loss_work == lost_data.RESTORE
    assert KEY in manager.unsettled  # the next round carries the restore out
    keeper.run_once()
    assert manager.replica(*KEY).loss_work == lost_data.CONFIRM  # restored; told the coordinator next
    assert KEY in manager.unsettled
