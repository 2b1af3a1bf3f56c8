"""A one-replica bucket's replica changes mode as its move gives it a second replica and takes it back to one
(tablet/replicas/manager.py, tablet/replication/roles.py): a real store (RocksDB and changelog in a temp dir), pushes
given to the ReplicaManager directly, no processes."""

from __future__ import annotations

import threading

import pytest

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.codec import batch_to_ipc
from kvlease.common.errors import ErrorCode
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.storage.file import FileStorage
from kvlease.common.tables import Column, TableInfo
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.tablet.replication.roles import BucketRole
from kvlease.tablet.service import TabletService, _serving
from kvlease.tablet.store.kvstore import BucketStoreError

pytestmark = pytest.mark.unit

#: What a client retries (tablet/replicas/manager.py: the bucket is being opened again, or not held for a moment).
RETRIABLE = {ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE}
TABLE = TableInfo(7, "db", "t", (Column("id", "BIGINT"), Column("v", "STRING")), ("id",), 1)


def role(leader_epoch, replicas, isr, bucket_epoch, leader=1, table=TABLE) -> BucketRole:
    return BucketRole(table, 0, leader_epoch, leader, "", tuple(replicas), tuple(isr), bucket_epoch)


@pytest.fixture
def manager(tmp_path):
    config = cfg.Config({"log.flush.fsync": False})
    replicas = ReplicaManager(str(tmp_path / "data"), config, FileStorage(str(tmp_path / "remote")), admin=None,
                              server_id=1)
    yield replicas
    replicas.close()


def rows(store, *ids):
    return store.codec.to_batch([{"id": i, "v": f"v{i}"} for i in ids])


def found(store, *ids):
    hits, _rows = store.lookup(store.codec.to_batch([{"id": i} for i in ids]).select(["id"]))
    return hits.tolist()


def test_the_mode_follows_the_replicas_pushed():
    assert not role(1, [1], [1], 1).replicated
    assert role(2, [2, 1], [1], 2).replicated  # a one-replica bucket being moved
    replicated_table = TableInfo(**{**TABLE.__dict__, "replication_factor": 2})
    assert role(1, [1], [1], 1, table=replicated_table).replicated  # its table's factor, whatever is pushed


def test_a_second_replica_reopens_the_bucket_replicated_with_every_write_committed_and_known(manager):
    manager.update_leadership(1, [role(1, [1], [1], 1)], [])
    single = manager.get(7, 0)
    assert not single.replicated and single.leadership() is None
    first = single.store.write(rows(single.store, 1, 2, 3), writer=(5, 0))
    manager.update_leadership(1, [role(2, [2, 1], [1], 2)], [])  # phase 1: a new replica on server 2
    assert single.closed
    with pytest.raises(errors.NotLeaderError, match="closed on this tablet server"), _serving(single):
        single.store.write(rows(single.store, 4))  # a write that reached the old store: retried, not lost
    with pytest.raises(BucketStoreError):
        with _serving(manager.get(7, 0)):
            raise BucketStoreError("a store that is not closed keeps its own error")
    replicated = manager.get(7, 0)
    assert replicated is not single and replicated.replicated and replicated.leader_epoch == 2
    assert replicated.store.high_watermark == replicated.store.log_end_offset == first[1]
    assert found(replicated.store, 1, 2, 3) == [True, True, True]
    assert replicated.store.write(rows(replicated.store, 1, 2, 3), writer=(5, 0)) == first  # resent: a duplicate
    lead = replicated.leadership()
    lead.check_write(2)
    _base, end = replicated.store.write(rows(replicated.store, 4), writer=(5, 1))
    lead.appended()
    lead.wait_committed(end, timeout_s=0)  # its ISR is itself: committed at once
    assert (7, 0) in manager.unsettled  # the keeper learns its snapshot base again


def test_back_to_one_replica_reopens_the_bucket_with_every_entry_of_its_log(manager):
    manager.update_leadership(1, [role(2, [1, 2], [1, 2], 2)], [])
    replicated = manager.get(7, 0)
    lead = replicated.leadership()
    _base, end = replicated.store.write(rows(replicated.store, 1, 2))
    lead.appended()
    with pytest.raises(errors.NotEnoughReplicasError):
        lead.wait_committed(end, timeout_s=0.05)  # server 2 has not fetched it: not committed, not visible
    assert found(replicated.store, 1, 2) == [False, False]
    stale = role(1, [1], [1], 1)
    manager.update_leadership(1, [stale], [])  # an older push: ignored, nothing reopened
    assert manager.get(7, 0) is replicated
    manager.update_leadership(1, [role(3, [1], [1], 3)], [])  # the move's phase 2: one replica again
    single = manager.get(7, 0)
    assert single is not replicated and not single.replicated and single.leader_epoch == 3
    assert replicated.closed and lead.ended
    assert single.store.log_end_offset == end and found(single.store, 1, 2) == [True, True]  # its whole log
    _base, more = single.store.write(rows(single.store, 3))
    assert single.store.high_watermark == more


def test_writes_racing_the_mode_switches_are_acknowledged_or_retried_and_land_exactly_once(manager):
    """An idempotent writer through the real PutKv handler while pushes switch the bucket between one replica and
    two (the old leader's side of a move, over and over): every answer is an acknowledgement or a retriable
    error, resending the same batch until acknowledged applies each exactly once."""
    service = TabletService(manager)
    epoch = [1]

    def push(replicated: bool) -> None:
        epoch[0] += 1
        manager.update_leadership(1, [role(epoch[0], [2, 1] if replicated else [1], [1], epoch[0])], [])

    push(False)
    codec = manager.replica(7, 0).store.codec
    batches, window, failures, acked, switched = 120, 5, [], [0], [0]
    progress = threading.Condition()  # guards acked and switched; the writer and the switcher pace each other

    def write() -> None:
        try:
            for seq in range(batches):
                with progress:  # at most one window ahead of the switches: the switcher's pace is not the test's
                    if not progress.wait_for(lambda: switched[0] >= seq // window or switched[0] < 0, 20):
                        failures.append((seq, "no switch for 20 s"))
                    if switched[0] < 0 or failures:
                        return
                request = pb.PutKvRequest(table_id=7, bucket=0, upserts=batch_to_ipc(codec.to_batch([
                    {"id": seq, "v": f"v{seq}"}])), writer_id=9, sequence=seq)
                while (answer := service.PutKv(request, None)).HasField("error") and answer.error.code:
                    if answer.error.code not in RETRIABLE:
                        failures.append((seq, answer.error.code, answer.error.message))
                        return
                with progress:
                    acked[0] += 1
                    progress.notify_all()
        finally:
            with progress:
                acked[0] = batches
                progress.notify_all()

    (writer := threading.Thread(target=write, name="mode-switch-writer")).start()
    try:
        while True:
            with progress:  # switch once a window is acknowledged, while the next window's writes are in flight
                assert progress.wait_for(lambda: acked[0] >= window * switched[0] or acked[0] >= batches, 20), \
                    "writes stalled"
                if acked[0] >= batches:
                    break
            push(switched[0] % 2 == 0)
            with progress:
                switched[0] += 1
                progress.notify_all()
    finally:
        with progress:
            switches, switched[0] = switched[0], -1  # a writer still waiting for a switch leaves
            progress.notify_all()
        writer.join(20)
    assert not failures, failures
    assert switches >= batches // window - 1  # the last window's writes waited for the switch before them
    replica = manager.get(7, 0)
    assert found(replica.store, *range(batches)) == [True] * batches
    assert replica.store.log_end_offset == batches  # one +I record per batch: none applied twice
