"""Reads never go back in time (docs/architecture.md, "Leader leases"), on a real cluster of processes: one
ZooKeeper, a coordinator and three tablet servers, a one-bucket table of replication factor 3.

The leader of the bucket is paused (SIGSTOP: a GC pause, or a partition) while a writer's update is
acknowledged by the leader elected meanwhile. A reader pinned to the paused leader (a client whose routing
is stale: lookups sent straight to it, each timed when sent) must get no answer older than the update for
a lookup sent after its acknowledgement: when the paused leader resumes it answers NOT_LEADER (its leader
lease lapsed), never the old value. Nor does it answer a log reader with what its stale log says: a FetchLog
sent to it from the position after the update (as a change-feed reader that read on from its successor would),
with or without that position's leader epoch, is NOT_LEADER once it resumes, never DATA_LOST or an offset out
of range (its log ends before that position). A table client looking the key up meanwhile gives up on the
paused leader once the coordinator names another (it does not wait out its request timeout). Both ways the
leadership moves: the paused leader's ZooKeeper session expires (its successor waits for nothing), and an
operator's election while it is paused but its session lives (its demotions node is bumped, its successor
waits a lease). A leadership moved away from a live leader is served by its successor at once (the old
leader took the push), not a lease later.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.codec import batch_to_ipc, ipc_to_batch
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pbg
from kvlease.common import config as cfg
from kvlease.common import zkpaths
from kvlease.common.tables import Column
from kvlease.common.zk import make_client
from kvlease.ops import local_cluster
from kvlease.ops.drills.cluster import zk_config
from kvlease.ops.wait import poll, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SESSION_S = 6.0  # a lease lasts 4 s: a leader paused for one survives it, as the operator's election needs
#: a paused replica leaves the ISR after 1.5 s (else no write commits until its session expires)
SETTINGS = {"zookeeper.session-timeout": "6s", "replica.fetch.wait-max": "200ms", "replica.max-lag": "1500ms",
            "kv.snapshot.interval": "1h"}
SCHEMA = [Column("id", "BIGINT"), Column("v", "STRING")]
QUICK_RETRIES = cfg.Config({"client.retry.max-wait": "100ms"}, env={})


@pytest.fixture(scope="module")
def cluster(kvlease_tmp):
    directory = Path(tempfile.mkdtemp(prefix="linearizable-", dir=kvlease_tmp))
    try:
        local_cluster.start(directory, coordinators=1, tablets=3, config_overrides=SETTINGS)
        admin = AdminClient(local_cluster.bootstrap(directory), retry_total_s=30)
        try:
            yield directory, admin
        finally:
            admin.close()
    finally:
        try:
            local_cluster.stop(directory)
        finally:
            doc = local_cluster.load(directory) if (directory / "cluster.json").exists() else {}
            for role in local_cluster.ROLES:
                for entry in doc.get(role, []):
                    if local_cluster.pid_alive(entry.get("pid"), entry.get("proc_start")):
                        os.kill(entry["pid"], signal.SIGKILL)
            shutil.rmtree(directory, ignore_errors=True)


def _leader(admin, table) -> tuple[int, str, int]:
    """(leader id, its address, leader epoch) once the bucket has a live leader and a full ISR."""
    def led():
        b = admin.get_table_assignment(table.table_id)[1][0]
        return (b.leader_id, b.leader_address, b.leader_epoch) if b.leader_address and len(b.isr) == 3 else None
    return wait_until(led, 30, "a leader with a full ISR", interval_s=0.1)


def _pid(directory: Path, tablet_id: int) -> int:
    entry = local_cluster.member(local_cluster.load(directory), "tablets", tablet_id)
    return entry["pid"]


@dataclass
class Sent:
    at: float
    answer: object = None  # the value read, or the error


class PinnedReader:
    """Lookups of id 1 sent straight to one tablet server every 50 ms (a client whose routing is stale),
    each with its send time; answered whenever the server answers."""

    def __init__(self, address: str, table_id: int) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pbg.TabletServiceStub(self.channel)
        self.request = pb.LookupRequest(table_id=table_id, bucket=0,
                                        keys=batch_to_ipc(pa.RecordBatch.from_pydict({"id": [1]})))
        self.sent: list[Sent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            sent = Sent(time.monotonic())
            future = self.stub.Lookup.future(self.request, timeout=60)
            future.add_done_callback(lambda f, s=sent: setattr(s, "answer", _value(f)))
            self.sent.append(sent)

    def stop(self, settle_s: float) -> list[Sent]:
        self._stop.set()
        self._thread.join()
        poll(lambda: all(s.answer is not None for s in self.sent), settle_s)  # answered, as far as they will be
        self.channel.close()
        return self.sent


def _log_reads(channel: grpc.Channel, table_id: int, position) -> list:
    """FetchLog futures on ``channel`` from ``position``: one with its leader epoch (fenced), one without."""
    stub = pbg.TabletServiceStub(channel)
    fenced = pb.FetchLogRequest(table_id=table_id, bucket=0, from_offset=position.offset, max_bytes=1 << 20,
                                last_fetched_epoch=position.epoch)
    plain = pb.FetchLogRequest(table_id=table_id, bucket=0, from_offset=position.offset, max_bytes=1 << 20)
    return [stub.FetchLog.future(r, timeout=60) for r in (fenced, plain)]


def _log_answer(future):
    try:
        response = future.result()
    except grpc.RpcError as exc:
        return exc.code()
    return errors.ErrorCode(response.error.code) if response.error.code else f"{len(response.entries)} entries"


def _value(future):
    try:
        response = future.result()
    except grpc.RpcError as exc:
        return exc.code()
    if response.error.code:
        return errors.ErrorCode(response.error.code)
    rows = ipc_to_batch(response.rows).to_pylist() if response.rows else []
    return rows[0]["v"] if rows else "missing"


class RoutedReader:
    """Lookups of id 1 through a table client (20 s request timeout) in a loop: (sent, answered, value)."""

    def __init__(self, admin, table) -> None:
        self.client = TableClient(admin, table.path, request_timeout_s=20, retry_total_s=60)
        self.reads: list[tuple[float, float, object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            sent = time.monotonic()
            try:
                value = self.client.lookup([{"id": 1}])[0]["v"]
            except errors.KvLeaseError as exc:
                value = exc
            self.reads.append((sent, time.monotonic(), value))
            if self._stop.wait(0.02):
                return

    def stop(self) -> list[tuple[float, float, object]]:
        self._stop.set()
        self._thread.join(timeout=60)
        self.client.close()
        return self.reads


def _pause_and_update(directory, admin, table, elect_to: int | None = None,
                      resume_after_s: float = 2.0) -> tuple[list[Sent], list, float, int]:
    """Pause the leader, have the update acknowledged by its successor (``elect_to``: moved there by an
    operator's election; else once its session expired), resume it ``resume_after_s`` later. Returns the
    pinned reader's lookups, the routed reader's, the acknowledgement time and the old leader's id."""
    leader, address, epoch = _leader(admin, table)
    pid = _pid(directory, leader)
    with grpc.insecure_channel(address) as log_channel:  # closed however the pause ends
        pinned = PinnedReader(address, table.table_id)
        routed = RoutedReader(admin, table)
        wait_until(lambda: any(s.answer is not None for s in pinned.sent) and routed.reads, 30,
                   "both readers answered")
        os.kill(pid, signal.SIGSTOP)
        try:
            if elect_to is not None:
                admin.elect_leader(table.path, 0, False, tablet=elect_to)
            with TableClient(admin, table.path, QUICK_RETRIES, retry_total_s=60) as writer:
                writer.upsert([{"id": 1, "v": "new"}])  # acknowledged as soon as a new leader serves
                acked = time.monotonic()
                position = writer.end_positions()[0]  # from the new leader: after the update, under its epoch
            assert position.epoch is not None and position.epoch > epoch
            log_reads = _log_reads(log_channel, table.table_id, position)  # queue at the paused leader
            time.sleep(resume_after_s)  # the pause under test: lookups sent to the paused leader meanwhile queue there
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(2.0)  # lookups go on to the resumed leader: any it answers with the old value fails _check
        answers = [_log_answer(f) for f in log_reads]
    assert all(a in refused_codes() for a in answers), f"the resumed leader answered log reads with {answers}"
    return pinned.stop(settle_s=10), routed.stop(), acked, leader


def _check(pinned: list[Sent], routed: list, acked: float) -> None:
    after = [s for s in pinned if s.at > acked]
    assert after, "no lookup was sent to the paused leader after the acknowledgement"
    stale = [s for s in after if s.answer == "old"]
    assert not stale, f"{len(stale)} of {len(after)} lookups sent after the update was acknowledged read the old value"
    refused = [s for s in after if s.answer in (errors.ErrorCode.NOT_LEADER, errors.ErrorCode.FENCED_LEADER_EPOCH)]
    assert refused, f"the deposed leader answered none of them: {[s.answer for s in after][:10]}"
    assert all(s.answer in ("new", *refused_codes()) for s in after), {str(s.answer) for s in after}
    assert [v for sent, _done, v in routed if sent > acked and v != "new"] == []
    slowest = max(done - sent for sent, done, _v in routed)
    assert slowest < SESSION_S + 4, f"a routed lookup waited {slowest:.1f}s on the paused leader"


def refused_codes():
    return (errors.ErrorCode.NOT_LEADER, errors.ErrorCode.FENCED_LEADER_EPOCH, errors.ErrorCode.LEADER_NOT_AVAILABLE)


def _table(admin, name: str):
    table = admin.create_table(f"db.{name}", SCHEMA, ["id"], 1, replication_factor=3)
    _leader(admin, table)
    with TableClient(admin, table.path, retry_total_s=30) as client:
        client.upsert([{"id": 1, "v": "old"}])
    return table


def test_a_leader_paused_past_its_session_answers_nothing_old_once_resumed(cluster):
    directory, admin = cluster
    table = _table(admin, "expired")
    epoch = _leader(admin, table)[2]
    pinned, routed, acked, _old = _pause_and_update(directory, admin, table)
    _check(pinned, routed, acked)
    assert _leader(admin, table)[2] > epoch  # (it may lead again: its preferred replica, back in the ISR)


def test_a_leader_paused_while_an_operator_moves_its_leadership_answers_nothing_old(cluster):
    """Its session lives: its lease ends because the coordinator bumped its demotions node, and its successor
    waited a lease's duration (the paused leader could not take the push)."""
    directory, admin = cluster
    table = _table(admin, "elected")
    leader, _address, _epoch = _leader(admin, table)
    session = _session(directory, leader)
    target = next(s for s in (1, 2, 3) if s != leader)
    pinned, routed, acked, _old = _pause_and_update(directory, admin, table, elect_to=target, resume_after_s=0.2)
    _check(pinned, routed, acked)
    assert _session(directory, leader) == session, "the paused leader's session expired: not the case tested"


def _session(directory: Path, tablet_id: int) -> int:
    """The ZooKeeper session of the tablet server's registration."""
    zk = make_client(zk_config(local_cluster.load(directory), local_cluster.ZK_ROOT))
    try:
        return zk.exists(zkpaths.tablet_server(tablet_id)).ephemeralOwner
    finally:
        zk.stop()
        zk.close()


def test_a_leadership_moved_from_a_live_leader_is_served_at_once(cluster):
    _directory, admin = cluster
    table = _table(admin, "handover")
    leader, _address, epoch = _leader(admin, table)
    target = next(s for s in (1, 2, 3) if s != leader)
    with TableClient(admin, table.path, retry_total_s=30) as client:
        started = time.monotonic()
        admin.elect_leader(table.path, 0, False, tablet=target)
        client.refresh()
        client.upsert([{"id": 1, "v": "moved"}])
        took = time.monotonic() - started
        assert client.lookup([{"id": 1}])[0]["v"] == "moved"
    assert _leader(admin, table)[:1] == (target,)
    lease_s = SESSION_S * 2 / 3
    assert took < lease_s / 2, f"the new leader served after {took:.2f}s: it waited for the old one's lease"
