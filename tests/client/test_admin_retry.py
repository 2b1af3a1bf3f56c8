"""The admin client resends a lease call whose answer was lost (it is idempotent) and does not resend
table DDL: real gRPC on loopback to a coordinator stand-in that answers its first call too late, or
answers it REQUEST_TIMED_OUT (outcome unknown: its ZooKeeper connection dropped during the write)."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import grpc
import pytest

from kvlease.client.admin import IDEMPOTENT, AdminClient
from kvlease.common import errors
from kvlease.common.model import SnapshotHandle, TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.proto import coordinator_pb2_grpc as pb_grpc
from kvlease.common.tables import Column
from kvlease.ops.wait import wait_until

pytestmark = pytest.mark.unit
#: The clients' per-attempt deadline. A late answer waits for the call to end (:func:`lost_answer`), so it is
#: lost however slowly either side runs; every other answer, a retry's too, must come back within it on a
#: loaded machine (at 0.3 s a resent call sometimes timed out as well and was sent a third time).
TIMEOUT_S = 1.0


def lost_answer(context) -> None:
    """Return only once the client gave up on this call (its deadline passed): the answer made next is lost.
    (A fixed sleep past the deadline was not enough: a client that ran late received it.)"""
    ended = threading.Event()
    if context.add_callback(ended.set):  # False: the call has ended already
        ended.wait(60)


class LateFirstAnswer(pb_grpc.CoordinatorServiceServicer):
    """Every method's first call answers after the client's deadline (its answer is lost)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def _count(self, method: str, context) -> int:
        with self.lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            n = self.calls[method]
        if n == 1:
            lost_answer(context)
        return n

    def ReleaseKvSnapshotLease(self, request, context):
        n = self._count("ReleaseKvSnapshotLease", context)
        return pb.ReleaseKvSnapshotLeaseResponse(released=n == 1, lease_remains=False)

    def DropKvSnapshotLease(self, request, context):
        n = self._count("DropKvSnapshotLease", context)
        return pb.DropKvSnapshotLeaseResponse(dropped=n == 1)

    def CreateTable(self, request, context):
        self._count("CreateTable", context)
        return pb.CreateTableResponse()


class UnknownFirstOutcome(pb_grpc.CoordinatorServiceServicer):
    """Every method's first call answers REQUEST_TIMED_OUT (outcome unknown), as a coordinator whose
    ZooKeeper write lost its connection does (it then steps down)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _first(self, method: str) -> bool:
        self.calls[method] = self.calls.get(method, 0) + 1
        return self.calls[method] == 1

    def _unknown(self) -> pb.ErrorPb:
        return pb.ErrorPb(code=errors.ErrorCode.REQUEST_TIMED_OUT, message="ZooKeeper connection lost during a write")

    def RenewKvSnapshotLease(self, request, context):
        if self._first("RenewKvSnapshotLease"):
            return pb.RenewKvSnapshotLeaseResponse(error=self._unknown())
        return pb.RenewKvSnapshotLeaseResponse(expiration_time_ms=1234)

    def CommitKvSnapshot(self, request, context):
        self._first("CommitKvSnapshot")
        return pb.CommitKvSnapshotResponse(error=self._unknown())


@contextlib.contextmanager
def stand_in(servicer) -> Iterator[str]:
    """``servicer`` as a coordinator on a free loopback port: its address."""
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_CoordinatorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait()


@pytest.fixture
def late():
    servicer = LateFirstAnswer()
    with stand_in(servicer) as address, \
            AdminClient([address], request_timeout_s=TIMEOUT_S, retry_total_s=10) as client:
        yield servicer, client


def test_a_release_whose_answer_was_lost_is_sent_again_and_answers_like_a_retry(late):
    servicer, client = late
    result = client.release_lease("L", [TableBucket(1, 0)])
    assert servicer.calls["ReleaseKvSnapshotLease"] == 2
    assert (result.released, result.lease_remains) == (False, False)  # what a retried release answers


def test_a_drop_whose_answer_was_lost_is_sent_again(late):
    servicer, client = late
    assert client.drop_lease("L") is False
    assert servicer.calls["DropKvSnapshotLease"] == 2


def test_table_ddl_whose_answer_was_lost_is_not_resent(late):
    servicer, client = late
    with pytest.raises(errors.OutcomeUnknownError, match="may or may not have been applied"):
        client.create_table("db.t", [Column("id", "BIGINT")], ["id"], 1)
    assert servicer.calls["CreateTable"] == 1


def test_every_lease_call_is_idempotent_and_ddl_is_not():
    assert {"AcquireKvSnapshotLease", "AcquireKvSnapshotLeases", "RenewKvSnapshotLease", "ReleaseKvSnapshotLease",
            "DropKvSnapshotLease"} <= IDEMPOTENT
    assert not {"CreateTable", "DropTable", "CommitKvSnapshot"} & IDEMPOTENT


def test_a_lease_call_the_coordinator_answers_outcome_unknown_is_sent_again_and_ddl_is_not():
    servicer = UnknownFirstOutcome()
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_CoordinatorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = AdminClient([f"127.0.0.1:{port}"], request_timeout_s=2, retry_total_s=10)
    try:
        assert client.renew_lease("L", 60_000) == 1234
        assert servicer.calls["RenewKvSnapshotLease"] == 2
        with pytest.raises(errors.OutcomeUnknownError):
            client.commit_kv_snapshot(SnapshotHandle(TableBucket(1, 0), 1, 0, "kv/1/0/snap-1/_METADATA"))
        assert servicer.calls["CommitKvSnapshot"] == 1
    finally:
        client.close()
        server.stop(0).wait()


class ZooKeeperGoneAfterFirstCall(pb_grpc.CoordinatorServiceServicer):
    """A coordinator that loses ZooKeeper: the first renew is not answered in time (its write waits for
    ZooKeeper), every later one is refused ZOOKEEPER_UNAVAILABLE, as a coordinator that knows answers; the
    first two creates are refused, the third is answered."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _answer(self, method: str, first_late: bool, context, **fields):
        """The response's fields: ``fields`` (the first call late, if ``first_late``), or a refusal."""
        self.calls[method] = self.calls.get(method, 0) + 1
        if self.calls[method] == 1 and first_late:
            lost_answer(context)
        elif first_late or self.calls[method] <= 2:
            return {"error": pb.ErrorPb(code=errors.ErrorCode.ZOOKEEPER_UNAVAILABLE,
                                        message="coordinator c:1 cannot reach ZooKeeper at z:2 (zookeeper.address)")}
        return fields

    def RenewKvSnapshotLease(self, request, context):
        return pb.RenewKvSnapshotLeaseResponse(**self._answer("RenewKvSnapshotLease", True, context,
                                                              expiration_time_ms=9))

    def CreateTable(self, request, context):
        return pb.CreateTableResponse(**self._answer("CreateTable", False, context, table=pb.TableInfoPb(
            table_id=4, database="db", name="t", columns=[pb.ColumnPb(name="id", type="BIGINT")],
            primary_key=["id"], buckets=1)))


@pytest.fixture
def zk_gone():
    servicer = ZooKeeperGoneAfterFirstCall()
    with stand_in(servicer) as address:
        yield servicer, address


def test_a_lease_call_unanswered_then_refused_until_the_retries_run_out_says_its_outcome_is_unknown(zk_gone):
    """The renew may have been applied by its first attempt: giving up with the last refusal alone would hide it."""
    servicer, address = zk_gone
    with AdminClient([address], request_timeout_s=TIMEOUT_S, retry_total_s=TIMEOUT_S * 2) as client:
        with pytest.raises(errors.OutcomeUnknownError) as info:
            client.renew_lease("L", 60_000)
    message = info.value.message
    assert message.startswith(f"RenewKvSnapshotLease to coordinator {address} timed out"), message
    assert "may or may not have been applied" in message and "cannot reach ZooKeeper at z:2" in message, message
    assert servicer.calls["RenewKvSnapshotLease"] >= 2


def test_a_call_refused_because_zookeeper_is_unreachable_is_sent_again_even_table_ddl(zk_gone):
    """Refused before anything was done: resending a create is safe."""
    servicer, address = zk_gone
    with AdminClient([address], request_timeout_s=TIMEOUT_S * 10, retry_total_s=10) as client:
        assert client.create_table("db.t", [Column("id", "BIGINT")], ["id"], 1).table_id == 4
    assert servicer.calls["CreateTable"] == 3


def test_retry_policy_runs_the_first_attempt_bare_and_retries_with_the_usual_waits():
    from kvlease.client.transport import RetryPolicy

    sleeps: list[float] = []
    calls: list[int] = []

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise errors.NetworkError("down")
        return x * 2

    assert RetryPolicy(10.0, sleep=sleeps.append).call(flaky, 21) == 42
    assert calls == [21, 21, 21] and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2  # full jitter, 0.05 * 2**n


def test_retry_policy_does_not_retry_past_its_budget_or_a_non_retriable_error():
    from kvlease.client.transport import RetryPolicy

    sleeps: list[float] = []
    calls: list[str] = []

    def failing(error: Exception) -> None:
        calls.append(type(error).__name__)
        raise error

    with pytest.raises(errors.NetworkError):
        RetryPolicy(0.0, sleep=sleeps.append).call(failing, errors.NetworkError("down"))
    with pytest.raises(errors.InvalidRequestError):
        RetryPolicy(10.0, sleep=sleeps.append).call(failing, errors.InvalidRequestError("bad"))
    assert calls == ["NetworkError", "InvalidRequestError"] and sleeps == []


def test_channels_keep_one_stub_per_address_and_service_until_closed():
    from kvlease.client.transport import Channels
    from kvlease.common.proto import security_pb2_grpc

    channels = Channels()
    try:
        stub = channels.stub("127.0.0.1:1", pb_grpc.CoordinatorServiceStub)
        assert channels.stub("127.0.0.1:1", pb_grpc.CoordinatorServiceStub) is stub  # not rebuilt per call
        assert channels.stub("127.0.0.1:2", pb_grpc.CoordinatorServiceStub) is not stub
        assert not isinstance(channels.stub("127.0.0.1:1", security_pb2_grpc.SecurityServiceStub),
                              pb_grpc.CoordinatorServiceStub)
        channels.close()
        assert channels.addresses() == []
        assert channels.stub("127.0.0.1:1", pb_grpc.CoordinatorServiceStub) is not stub  # a new channel's
    finally:
        channels.close()


# -- acquires that travel together (client.coalescing) ------------------------------------------------


class BatchingCoordinator(pb_grpc.CoordinatorServiceServicer):
    """Unary acquires wait for ``release``; a batched call is answered per ``mode`` on its first call:
    "late" (after the client's deadline: its answer is lost), "unknown" (one acquire answered
    REQUEST_TIMED_OUT) or "refused" (the whole call refused, as a set partition_id is)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.release = threading.Event()
        self.batches: list[list[str]] = []
        self.unary: list[str] = []
        self.lock = threading.Lock()

    @staticmethod
    def _answer(request) -> pb.AcquireKvSnapshotLeaseResponse:
        if request.lease_id.startswith("bad"):
            return pb.AcquireKvSnapshotLeaseResponse(error=pb.ErrorPb(
                code=errors.ErrorCode.TABLE_NOT_EXIST, message=f"no table for {request.lease_id}"))
        return pb.AcquireKvSnapshotLeaseResponse(expiration_time_ms=1000 + int(request.lease_id[1:]))

    def AcquireKvSnapshotLease(self, request, context):
        with self.lock:
            self.unary.append(request.lease_id)
        self.release.wait(10)
        return self._answer(request)

    def AcquireKvSnapshotLeases(self, request, context):
        with self.lock:
            self.batches.append(sorted(r.lease_id for r in request.requests))
            first = len(self.batches) == 1
        if self.mode == "unimplemented":
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        if first and self.mode in ("late", "late-then-zookeeper"):
            lost_answer(context)
        elif self.mode == "late-then-zookeeper":  # the coordinator lost ZooKeeper meanwhile, and knows it
            return pb.AcquireKvSnapshotLeasesResponse(error=pb.ErrorPb(
                code=errors.ErrorCode.ZOOKEEPER_UNAVAILABLE, message="coordinator c:1 cannot reach ZooKeeper"))
        if first and self.mode == "refused":
            return pb.AcquireKvSnapshotLeasesResponse(error=pb.ErrorPb(
                code=errors.ErrorCode.PARTITION_NOT_EXISTS, message="partition 0 of table 1 (bucket 0)"))
        responses = [self._answer(r) for r in request.requests]
        last = [i for i, r in enumerate(request.requests) if r.lease_id == "L7"]
        if last and ((first and self.mode == "unknown") or self.mode == "always-unknown"):
            responses[last[0]] = pb.AcquireKvSnapshotLeaseResponse(error=pb.ErrorPb(
                code=errors.ErrorCode.REQUEST_TIMED_OUT, message="ZooKeeper connection lost during a write"))
        if last and first and self.mode == "fenced":  # the coordinator was deposed while the batch was in its loop
            responses[last[0]] = pb.AcquireKvSnapshotLeaseResponse(error=pb.ErrorPb(
                code=errors.ErrorCode.COORDINATOR_FENCED, message="coordinator epoch changed"))
        return pb.AcquireKvSnapshotLeasesResponse(responses=responses)


def _acquire_together(mode: str, retry_total_s: float = 10):
    """Two acquires take both slots; five more queue and travel as one batch. Returns the servicer and,
    per lease id, its expiration time or its error."""
    servicer = BatchingCoordinator(mode)
    server = grpc.server(ThreadPoolExecutor(8))
    pb_grpc.add_CoordinatorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = AdminClient([f"127.0.0.1:{port}"], request_timeout_s=TIMEOUT_S * 2, retry_total_s=retry_total_s)
    ids = ["L1", "L2", "L3", "bad4", "L5", "L6", "L7"]

    def acquire(lease_id):
        try:
            return client.acquire_lease(lease_id, {TableBucket(1, 0): 1}, 60_000).expiration_time
        except errors.KvLeaseError as exc:
            return exc

    try:
        with ThreadPoolExecutor(len(ids)) as pool:
            futures = {lease_id: pool.submit(acquire, lease_id) for lease_id in ids[:2]}
            wait_until(lambda: len(servicer.unary) == 2, 10, "both slots taken", interval_s=0.005)
            for n, lease_id in enumerate(ids[2:], start=1):
                futures[lease_id] = pool.submit(acquire, lease_id)
                wait_until(lambda: client._acquires.waiting() == n, 10, f"{lease_id} queued", interval_s=0.005)
            servicer.release.set()
            return servicer, client, {lease_id: f.result(30) for lease_id, f in futures.items()}
    finally:
        servicer.release.set()
        client.close()
        server.stop(0).wait()


def _check_own_answers(outcomes) -> None:
    assert {k: v for k, v in outcomes.items() if k != "bad4"} == {
        "L1": 1001, "L2": 1002, "L3": 1003, "L5": 1005, "L6": 1006, "L7": 1007}
    assert isinstance(outcomes["bad4"], errors.TableNotExistError)


def test_acquires_made_together_whose_answer_was_lost_are_sent_again_each_with_its_own_answer():
    servicer, _client, outcomes = _acquire_together("late")
    _check_own_answers(outcomes)
    assert servicer.batches == [["L3", "L5", "L6", "L7", "bad4"]] * 2  # the same batch, resent once


def test_acquires_made_together_one_of_which_has_an_unknown_outcome_are_all_sent_again():
    servicer, _client, outcomes = _acquire_together("unknown")
    _check_own_answers(outcomes)
    assert servicer.batches == [["L3", "L5", "L6", "L7", "bad4"]] * 2


def test_acquires_refused_as_a_whole_are_sent_again_one_by_one():
    servicer, client, outcomes = _acquire_together("refused")
    _check_own_answers(outcomes)
    assert servicer.batches == [["L3", "L5", "L6", "L7", "bad4"]]
    assert sorted(servicer.unary) == ["L1", "L2", "L3", "L5", "L6", "L7", "bad4"]
    assert client._batch_acquires  # a refusal of one call: later acquires still travel together


def test_acquires_made_together_one_of_which_met_a_fenced_coordinator_are_all_sent_again():
    servicer, _client, outcomes = _acquire_together("fenced")
    _check_own_answers(outcomes)  # L7 too: not the fenced error (the unary call is followed and retried)
    assert servicer.batches == [["L3", "L5", "L6", "L7", "bad4"]] * 2


def test_out_of_retries_each_acquire_made_together_gets_its_own_last_answer():
    servicer, _client, outcomes = _acquire_together("always-unknown", retry_total_s=1.0)
    assert isinstance(outcomes.pop("L7"), errors.OutcomeUnknownError)
    assert {k: v for k, v in outcomes.items() if k != "bad4"} == {
        "L1": 1001, "L2": 1002, "L3": 1003, "L5": 1005, "L6": 1006}
    assert isinstance(outcomes["bad4"], errors.TableNotExistError)  # its own answer, not L7's error
    assert len(servicer.batches) >= 2


def test_acquires_made_together_unanswered_then_refused_until_the_retries_run_out_have_an_unknown_outcome():
    servicer, _client, outcomes = _acquire_together("late-then-zookeeper", retry_total_s=TIMEOUT_S * 3)
    assert {k: outcomes.pop(k) for k in ("L1", "L2")} == {"L1": 1001, "L2": 1002}  # alone, answered
    for lease_id, outcome in outcomes.items():  # the first batch may have been applied: said, not hidden
        assert isinstance(outcome, errors.OutcomeUnknownError), (lease_id, outcome)
        assert "may or may not have been applied" in outcome.message and "cannot reach ZooKeeper" in outcome.message
    assert len(servicer.batches) >= 2


def test_a_coordinator_without_the_batched_call_gets_each_acquire_alone_from_then_on():
    servicer, client, outcomes = _acquire_together("unimplemented")
    _check_own_answers(outcomes)
    assert servicer.batches == [["L3", "L5", "L6", "L7", "bad4"]]  # tried once
    assert sorted(servicer.unary) == ["L1", "L2", "L3", "L5", "L6", "L7", "bad4"]
    assert not client._batch_acquires


def test_an_address_that_is_not_a_coordinator_is_named_as_such():
    """A QA walkthrough gave a tablet server's port as --bootstrap and got gRPC's 'Method not found!'."""
    server = grpc.server(ThreadPoolExecutor(2))  # serves no service at all, like a port of another kind
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with AdminClient([f"127.0.0.1:{port}"], retry_total_s=2) as client:
            with pytest.raises(errors.UnknownServerError) as info:
                client.list_leases()
        assert (f"ListKvSnapshotLeases to coordinator 127.0.0.1:{port} failed: UNIMPLEMENTED: 127.0.0.1:{port} "
                f"does not serve ListKvSnapshotLeases; is it a coordinator's address?") in info.value.message
    finally:
        server.stop(None)


def test_bad_create_table_arguments_and_a_closed_client_are_typed_errors_before_anything_is_sent():
    """Nothing listens at the address: each error comes from the client itself, at once."""
    admin = AdminClient(["127.0.0.1:1"], retry_total_s=0)
    columns = [Column("id", "BIGINT"), Column("i", "INT"), Column("d", "DOUBLE")]
    for args, message in [
        (("db.t", columns, "id", 1), r"primary_key: a list of column names, e\.g\. \['id'\], not a string"),
        (("db.t", [("id", "BIGINT")], ["id"], 1), "columns: common.tables.Column"),
        (("db.t", columns, ["id"], 2**31), "bucket count must be between 1 and 1024, got 2147483648"),
        (("db.t", columns, ["id"], "4"), "buckets: an int, got '4'"),
        ((None, columns, ["id"], 1), "bad table name None"),
    ]:
        with pytest.raises(errors.InvalidRequestError, match=message):
            admin.create_table(*args)
    with pytest.raises(errors.InvalidRequestError, match="bad table name 5"):
        admin.get_table(5)
    for call, message in [
        (lambda: admin.renew_lease("L", 2**63), "renew_lease: bad argument: Value out of range"),
        (lambda: admin.renew_lease("L", 1000.5), "renew_lease: bad argument: 'float' object"),
        (lambda: admin.acquire_lease("L", {0: 1}, 1000), r"acquire_lease: bad argument: buckets are "
                                                         r"common\.model\.TableBucket\(table_id, bucket\), got 0"),
        (lambda: admin.release_lease("L", [0]), "release_lease: bad argument: buckets are"),
    ]:
        with pytest.raises(errors.InvalidRequestError, match=message):
            call()
    admin.close()
    admin.close()
    with pytest.raises(errors.InvalidRequestError, match="this AdminClient is closed"):
        admin.list_tables()
