"""Clients following a failover (docs/architecture.md, "Losing and moving replicas"), on fake tablet servers.

The fakes here are replicas of one changelog: an idempotent batch appended by
one leader is known to the next (the changelog records (writer, sequence) on
every replica), and a leader refuses a write routed by an older leader epoch
(FENCED_LEADER_EPOCH). The admin hands out ``bucket -> (address, epoch)``.
"""

from __future__ import annotations

import time

import grpc
import pytest

from kvlease.common import errors
from kvlease.common.errors import ErrorCode
from kvlease.common.proto import coordinator_pb2 as cpb
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.client.admin import BucketLeader
from kvlease.client.routing import BucketRouter
from kvlease.client.scanner import KvBatchScanner
from kvlease.client.stream_scanner import KvStreamScanner
from kvlease.client.table import TableClient
from tests.client.test_table_client import TABLE, FakeRpcError, FakeTablet
from tests.support import fake_scan_server as scan_fake


class EpochAdmin:
    """The assignment: ``leaders[bucket] = (address, leader_epoch)``; counts fetches."""

    def __init__(self, table, leaders: dict[int, tuple[str, int]]) -> None:
        self.table, self.leaders, self.refreshes = table, dict(leaders), 0

    def get_table(self, path):
        return self.table

    def get_table_assignment(self, table_id):
        self.refreshes += 1
        return self.table, {b: BucketLeader(b, 1, a, e) for b, (a, e) in self.leaders.items()}


class Replica(FakeTablet):
    """A FakeTablet that is one replica of ``batches`` (shared: (writer, sequence) -> offsets) and leads
    every bucket at ``epoch``; ``crash()``, if set, is called once after the next batch was appended, whose
    answer is then lost in transport (the server died: ``crash`` moves the leadership)."""

    def __init__(self, address: str, batches: dict, epoch: int) -> None:
        super().__init__(address, TABLE, {0, 1, 2, 3})
        self.batches, self.epoch, self.epochs, self.crash = batches, epoch, [], None

    def PutKv(self, request, timeout=None):
        self.epochs.append(request.leader_epoch if request.HasField("leader_epoch") else None)
        if request.leader_epoch < self.epoch:
            self.writers.append((request.writer_id, request.sequence))
            return pb.PutKvResponse(error=cpb.ErrorPb(code=int(ErrorCode.FENCED_LEADER_EPOCH), message="fenced"))
        done = self.batches.get((request.writer_id, request.sequence))
        if done is not None:  # a resent batch: its original offsets
            self.writers.append((request.writer_id, request.sequence))
            return pb.PutKvResponse(base_offset=done[0], next_offset=done[1])
        response = super().PutKv(request, timeout)
        if not response.error.code:
            base = max((end for _, end in self.batches.values()), default=0)
            self.batches[(request.writer_id, request.sequence)] = (base, base + response.next_offset)
            response = pb.PutKvResponse(base_offset=base, next_offset=base + response.next_offset)
            if self.crash is not None:
                crash, self.crash = self.crash, None
                crash()
                raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED)
        return response


def failover_client(leaders: dict[int, tuple[str, int]], replicas: list[Replica], **kwargs):
    admin = EpochAdmin(TABLE, leaders)
    sleeps: list[float] = []
    client = TableClient(admin, TABLE.path, sleep=sleeps.append, **kwargs)
    by_address = {r.address: r for r in replicas}
    client.router.stub = lambda address: by_address[address]
    return client, admin, sleeps


def key_in(client: TableClient, bucket: int) -> int:
    return next(i for i in range(1000) if client.split(client.key_batch([i]))[0][0] == bucket)


# -- writes -------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_write_whose_answer_was_lost_in_a_failover_is_resent_as_the_same_batch_and_answered_its_offsets():
    batches: dict = {}
    old, new = Replica("a:1", batches, epoch=1), Replica("b:1", batches, epoch=2)
    client, admin, _ = failover_client({b: ("a:1", 1) for b in range(4)}, [old, new])
    key = key_in(client, 0)
    client.upsert([{"id": key, "v": "first"}])
    # appended on the old leader (and replicated), the answer lost: it dies, the other replica leads
    old.crash = lambda: admin.leaders.update({b: ("b:1", 2) for b in range(4)})
    offsets = client.upsert([{"id": key, "v": "second"}])
    assert offsets == {0: (1, 2)}  # the original offsets of the batch, not a second append
    assert len(batches) == 2 and old.rows[0][next(iter(old.rows[0]))]["v"] == "second"
    (w0, s0), (w1, s1) = old.writers
    assert new.writers == [(w1, s1)] and (w0, s0, s1) == (w1, 0, 1)  # the same writer, the same batch number
    assert old.epochs[-1] == 1 and new.epochs == [2]  # each attempt carries the epoch it was routed by
    client.upsert([{"id": key, "v": "third"}])
    assert new.writers[-1] == (w1, 2) and batches[(w1, 2)] == (2, 3)  # numbering goes on at the new leader


@pytest.mark.unit
def test_a_write_routed_by_an_old_leader_epoch_is_fenced_rerouted_and_sent_with_the_new_one():
    batches: dict = {}
    leader = Replica("a:1", batches, epoch=5)
    client, admin, sleeps = failover_client({b: ("a:1", 4) for b in range(4)}, [leader])
    key = key_in(client, 2)
    refreshes = admin.refreshes
    admin.leaders = {b: ("a:1", 5) for b in range(4)}  # what the coordinator says now
    assert client.upsert([{"id": key, "v": "x"}]) == {2: (0, 1)}
    assert leader.epochs == [4, 5] and admin.refreshes == refreshes + 1 and len(sleeps) == 1
    assert leader.writers[0] == leader.writers[1]  # the same batch, sent again


@pytest.mark.unit
@pytest.mark.parametrize("method", ["Lookup", "FetchLog", "ListOffsets"])
def test_reads_refused_with_fenced_leader_epoch_are_rerouted_to_the_new_leader(method):
    old, new = FakeTablet("a:1", TABLE, {0, 1, 2, 3}), FakeTablet("b:1", TABLE, {0, 1, 2, 3})
    old.fail = [ErrorCode.FENCED_LEADER_EPOCH]
    client, admin, sleeps = failover_client({b: ("a:1", 1) for b in range(4)}, [old, new])
    admin.leaders = {b: ("b:1", 2) for b in range(4)}
    call = {"Lookup": lambda: client.lookup([1]), "FetchLog": lambda: client.fetch_log(0, 0),
            "ListOffsets": lambda: client.list_offsets()}[method]
    call()
    assert [m for m, _ in old.calls] == [method] and method in [m for m, _ in new.calls]
    assert admin.refreshes == 2 and len(sleeps) == 1


@pytest.mark.unit
def test_not_enough_replicas_is_retried_as_the_same_batch_and_keeps_the_number():
    leader = Replica("a:1", {}, epoch=1)
    leader.fail = [ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS]
    client, admin, sleeps = failover_client({b: ("a:1", 1) for b in range(4)}, [leader])
    key = key_in(client, 1)
    client.upsert([{"id": key, "v": "x"}])
    first, second, third = leader.writers
    assert first == second == third and first[1] == 0 and len(sleeps) == 2
    assert admin.refreshes == 1  # the leader is right: nothing to re-route
    client.upsert([{"id": key, "v": "y"}])
    assert leader.writers[-1] == (first[0], 1)


@pytest.mark.unit
@pytest.mark.parametrize("earlier, kept", [
    ([], True),  # every attempt refused before appending: the number stays free
    ([grpc.StatusCode.DEADLINE_EXCEEDED], False),  # an attempt may have appended it: a new writer
])
def test_running_out_of_retries_on_not_enough_replicas(earlier, kept):
    leader = Replica("a:1", {}, epoch=1)
    leader.fail = earlier + [ErrorCode.NOT_ENOUGH_REPLICAS] * 1000
    client, _admin, _ = failover_client({b: ("a:1", 1) for b in range(4)}, [leader], retry_total_s=0.2)
    client.retry = client.retry.but(sleep=time.sleep, max_wait_s=0.02)
    key = key_in(client, 1)
    with pytest.raises(errors.NotEnoughReplicasError):
        client.upsert([{"id": key, "v": "x"}])
    leader.fail = []
    client.upsert([{"id": key, "v": "x"}])
    failed, then = leader.writers[0], leader.writers[-1]
    assert (then == failed) == kept and then[1] == 0


# -- live scans -----------------------------------------------------------------------------------------------


def scan_router(tablets: dict[str, scan_fake.FakeTablet], leader: tuple[str, int]):
    admin = EpochAdmin(scan_fake.TABLE, {0: leader})
    router = BucketRouter(admin, scan_fake.TABLE.table_id)
    router.stub = lambda address: tablets[address]
    return router, admin


def rows_of(n: int) -> list[dict]:
    return [{"id": i, "v": f"v{i}"} for i in range(n)]


def ids(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


@pytest.mark.unit
@pytest.mark.parametrize("cls", [KvBatchScanner, KvStreamScanner])
def test_a_scan_fenced_mid_way_resumes_on_the_new_leader(cls):
    old, new = scan_fake.FakeTablet(rows_of(40)), scan_fake.FakeTablet(rows_of(40), log_offset=50)
    old.continuation_faults[1] = [int(ErrorCode.FENCED_LEADER_EPOCH)]
    router, admin = scan_router({"a:1": old, "b:1": new}, ("a:1", 1))
    admin.leaders = {0: ("b:1", 2)}
    scanner = cls(router.route(0), scan_fake.TABLE, 0, resume=True, sleep=lambda s: None)
    assert ids(scanner) == list(range(40))
    assert scanner.resumed == 1 and scanner.log_offset == 42 and admin.refreshes == 2


@pytest.mark.unit
def test_an_open_refused_with_fenced_leader_epoch_goes_to_the_new_leader():
    old, new = scan_fake.FakeTablet(rows_of(5)), scan_fake.FakeTablet(rows_of(5), log_offset=50)
    old.open_errors = [int(ErrorCode.FENCED_LEADER_EPOCH)]
    router, admin = scan_router({"a:1": old, "b:1": new}, ("a:1", 1))
    admin.leaders = {0: ("b:1", 2)}
    scanner = KvBatchScanner(router.route(0), scan_fake.TABLE, 0, sleep=lambda s: None)
    assert ids(scanner) == list(range(5)) and scanner.log_offset == 50 and scanner.resumed == 0


@pytest.mark.unit
def test_replays_to_a_dead_leader_stop_once_another_server_leads_the_bucket():
    old, new = scan_fake.FakeTablet(rows_of(40)), scan_fake.FakeTablet(rows_of(40), log_offset=50)
    old.continuation_faults[1] = [("lost-request", grpc.StatusCode.UNAVAILABLE)] * 1000  # killed
    router, admin = scan_router({"a:1": old, "b:1": new}, ("a:1", 1))
    scanner = KvBatchScanner(router.route(0), scan_fake.TABLE, 0, sleep=lambda s: None, retry_total_s=30)
    got = [scanner.poll(), scanner.poll()]
    admin.leaders = {0: ("b:1", 2)}  # elected after a few replays
    with pytest.raises(errors.NotLeaderError, match="no longer leads") as info:
        scanner.poll()
    assert ids(got) == list(range(20)) and info.value.details["rows_delivered"] == 20
    assert old.continuations().count(1) >= 2 and new.requests == []


@pytest.mark.unit
@pytest.mark.parametrize("streaming", [False, True])
def test_scan_table_reads_a_bucket_that_lost_its_leader_again_as_a_new_session(streaming):
    old, new = scan_fake.FakeTablet(rows_of(40)), scan_fake.FakeTablet(rows_of(40), log_offset=50)
    old.continuation_faults[1] = [int(ErrorCode.NOT_LEADER)]
    admin = EpochAdmin(scan_fake.TABLE, {0: ("a:1", 1)})
    client = TableClient(admin, scan_fake.TABLE.path, sleep=lambda s: None)
    tablets = {"a:1": old, "b:1": new}
    client.router.stub = lambda address: tablets[address]
    admin.leaders = {0: ("b:1", 2)}
    seen = []
    result = client.scan(streaming=streaming, batch_size_bytes=100, on_batch=lambda b, batch: seen.append(b))
    assert sorted(r["id"] for r in result.rows) == list(range(40))  # the lost session's rows dropped
    assert result.log_offsets == {0: 50} and result.one_snapshot  # one snapshot: the new leader's
    assert len(seen) == 2 + 4  # the lost session's batches, then the new one's
    client.close()


@pytest.mark.unit
def test_scan_table_gives_up_after_bounded_restarts():
    tablet = scan_fake.FakeTablet(rows_of(40))
    tablet.continuation_faults[0] = [int(ErrorCode.NOT_LEADER)] * 100
    admin = EpochAdmin(scan_fake.TABLE, {0: ("a:1", 1)})
    client = TableClient(admin, scan_fake.TABLE.path, sleep=lambda s: None)
    client.router.stub = lambda address: tablet
    with pytest.raises(errors.NotLeaderError):
        client.scan()
    assert len([r for r in tablet.requests if r.HasField("bucket_scan_req")]) == 9
    client.close()
