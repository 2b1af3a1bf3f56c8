"""Random and mutated protobuf requests to every RPC of both services, on a real cluster.

One coordinator and one tablet server (in-process, real ZooKeeper, real gRPC on
loopback) serve a table with rows, committed snapshots and a lease. Hypothesis
builds requests from each method's message descriptor: fields left unset or
filled with values that matter (the real table id, bucket and snapshot ids next
to out-of-range ones, names with a newline, paths that escape their prefix,
huge numbers), and also random bytes and bit-flipped encodings sent raw. Every
call must get a valid answer or a typed error (an ``ErrorPb`` code kvlease
knows, or gRPC's own refusal of bytes that do not decode), never an unhandled
exception or a hang; a call answered with an error must change nothing (the
ZooKeeper tree, the remote files, every bucket's changelog end); and at the end
both servers still serve and the table's rows, snapshots and lease are intact.

Values that would legitimately change the fixture are left out: dropping the
table itself, the coordinator's current epoch in a leadership push (a forged
push with the real epoch is the security issue's: only the cluster's principal
may call), and lease durations short enough to expire during the test (an
expired lease is dropped by the next request naming it, which is a change).
"""

from __future__ import annotations

import os
import random

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlease.client.table import TableClient
from kvlease.common import zkpaths
from kvlease.common.config import Config
from kvlease.common.errors import ErrorCode
from kvlease.common.proto import coordinator_pb2, tablet_pb2
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column
from kvlease.common.zk import make_client
from tests.conftest import TEST_DEFAULTS
from tests.support.local_cluster import LocalCluster
from tests.support.procs import zk_tree

pytestmark = [pytest.mark.zk, pytest.mark.timeout(600)]

EXAMPLES = 12  # per RPC and kind of request (built, then raw bytes)
KNOWN_CODES = {code.value for code in ErrorCode}
HOUR_MS = 3_600_000
INT_RANGES = {
    F.TYPE_INT32: (-2**31, 2**31 - 1), F.TYPE_SINT32: (-2**31, 2**31 - 1), F.TYPE_SFIXED32: (-2**31, 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (-2**63, 2**63 - 1), F.TYPE_SINT64: (-2**63, 2**63 - 1), F.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1),
}


def _methods():
    for module, service in ((coordinator_pb2, "CoordinatorService"), (tablet_pb2, "TabletService")):
        for method in module.DESCRIPTOR.services_by_name[service].methods:
            yield pytest.param(service, method, id=f"{service}.{method.name}")


METHODS = list(_methods())


class Fixture:
    """The cluster, what it holds, and a fingerprint of its state."""

    def __init__(self, make_config, base_dir) -> None:
        self.cluster = LocalCluster(make_config, base_dir, tablets=1)
        self.config = make_config()
        admin = self.cluster.admin
        self.table = self.cluster.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)
        self.tid = self.table.table_id
        with TableClient(admin, "db.t", retry_total_s=10) as client:
            client.upsert([{"id": i, "v": f"v{i}"} for i in range(50)])
            client.trigger_snapshot(wait=True)
            client.upsert([{"id": i, "v": f"w{i}"} for i in range(25)])
            client.trigger_snapshot(wait=True)  # nothing left to snapshot: a valid TriggerSnapshot changes nothing
            self.rows = client.scan().rows
        latest = admin.get_latest_kv_snapshots(self.tid)
        self.snapshots = {tb.bucket: info.snapshot_id for tb, info in latest.items()}
        admin.acquire_lease("held", {tb: info.snapshot_id for tb, info in latest.items()}, HOUR_MS)
        self.epoch = admin.coordinator_info().epoch
        self.tablet = self.cluster.tablets[1]
        self.zk = make_client(self.config)
        self.storage = open_storage(self.config["remote.data.dir"], self.config)
        self.channels = {"CoordinatorService": grpc.insecure_channel(self.cluster.coordinator.address),
                         "TabletService": grpc.insecure_channel(self.tablet.address)}

    def fingerprint(self):
        tree = {path: value for path, value in zk_tree(self.zk).items()
                if not path.startswith(zkpaths.TABLET_SERVERS)}
        offsets = tablet_pb2.ListOffsetsRequest(table_id=self.tid, buckets=[0, 1])
        stub = self.channels["TabletService"].unary_unary(
            _path("TabletService", "ListOffsets"),
            request_serializer=tablet_pb2.ListOffsetsRequest.SerializeToString,
            response_deserializer=tablet_pb2.ListOffsetsResponse.FromString)
        ends = [(o.bucket, o.latest, o.error.code) for o in stub(offsets, timeout=10).offsets]
        return tree, sorted(self.storage.list("")), ends

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.zk.stop()
        self.zk.close()
        self.cluster.close()


def _path(service: str, method: str) -> str:
    module = coordinator_pb2 if service == "CoordinatorService" else tablet_pb2
    return f"/{module.DESCRIPTOR.services_by_name[service].full_name}/{method}"


@pytest.fixture(scope="module")
def fx(zk_server, kvlease_tmp, tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    root = f"/fuzz-{random.randrange(1 << 40):x}"
    settings_ = {**TEST_DEFAULTS, "zookeeper.address": zk_server.connect_string, "zookeeper.path.root": root,
                 "remote.data.dir": f"file://{base / 'remote'}", "kv.snapshot.interval": "1h"}
    os.makedirs(base / "remote", exist_ok=True)
    fixture = Fixture(lambda overrides=None, /, **more: Config({**settings_, **(overrides or {}), **more}, env={}),
                      base)
    try:
        yield fixture
    finally:
        fixture.close()


# -- building requests ------------------------------------------------------------------------------------


def _named(field, fx: Fixture):
    """Values that matter for a field, by its name; None: no special values."""
    name, tid = field.name, fx.tid
    if name.endswith("table_id"):
        return [tid, tid + 1, 0, -1, 2**62]
    if name in ("bucket", "buckets"):
        return [0, 1, 2, -1, 2**31 - 1]
    if name == "partition_id":
        return [0, 7]
    if name == "snapshot_id":
        return [fx.snapshots.get(0, 1), 0, -1, 10**15]
    if name == "lease_id":
        return ["held", "fuzz", "", "x\n", "../x", "a" * 200]
    if "duration" in name or name.endswith("_ms"):
        return [-1, 0, HOUR_MS, 10**15, 2**63 - 1]
    if "epoch" in name:
        return [v for v in (0, -1, 10**12, 2**63 - 1) if v != fx.epoch]
    if name in ("database", "name", "path", "table", "db"):
        return ["db", "t", "db.t", "", "nl\n", "a" * 300, "x/../y"]
    if "path" in name or name == "files" or name.endswith("_file"):
        return [f"kv/{tid}/0/snap-1/_METADATA", "lease/kv-snapshot/held/1/x.metadata", "../../etc/passwd", "/abs", ""]
    return None


def _scalar(field, fx: Fixture):
    special = _named(field, fx)
    if field.type in INT_RANGES:
        lo, hi = INT_RANGES[field.type]
        generic = st.integers(lo, hi)
        if "duration" in field.name or field.name.endswith("_ms"):  # never short enough to expire in the test
            generic = st.one_of(st.integers(lo, 0), st.integers(HOUR_MS, hi))
        if special:
            return st.one_of(st.sampled_from([v for v in special if isinstance(v, int) and lo <= v <= hi] or [0]),
                             generic)
        return st.one_of(st.integers(-2, 10).filter(lambda v: lo <= v <= hi), generic)
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.floats(allow_nan=True, width=32 if field.type == F.TYPE_FLOAT else 64)
    if field.type == F.TYPE_STRING:
        strings = [v for v in special or [] if isinstance(v, str)]
        return st.one_of(st.sampled_from(strings), st.text(max_size=16)) if strings else st.text(max_size=16)
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == F.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 100))
    raise AssertionError(f"unhandled field type {field.type} of {field.full_name}")


@st.composite
def message(draw, descriptor, fx: Fixture, depth: int = 0):
    from google.protobuf import message_factory

    msg = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if field.type == F.TYPE_MESSAGE:
            if depth >= 3 or not draw(st.booleans()):
                continue
            count = draw(st.integers(0, 3)) if field.is_repeated else 1
            for _ in range(count):
                sub = draw(message(field.message_type, fx, depth + 1))
                if field.is_repeated:
                    getattr(msg, field.name).add().CopyFrom(sub)
                else:
                    getattr(msg, field.name).CopyFrom(sub)
            continue
        if not draw(st.booleans()):
            continue
        if field.is_repeated:
            getattr(msg, field.name).extend(draw(st.lists(_scalar(field, fx), max_size=3)))
        else:
            setattr(msg, field.name, draw(_scalar(field, fx)))
    return msg


def _wrecks_the_fixture(method: str, request, fx: Fixture) -> bool:
    """A valid request that would change what the other examples rely on (see the module docstring)."""
    if method == "DropTable":
        return (getattr(request, "table_id", None) == fx.tid or getattr(request, "name", "") == "t"
                or getattr(request, "path", "") == "db.t")
    return method in ("DropKvSnapshotLease", "ReleaseKvSnapshotLease") and request.lease_id == "held"


# -- calling ---------------------------------------------------------------------------------------------


def _call(fx: Fixture, service: str, method, payload: bytes) -> str:
    """Send ``payload`` raw; returns "ok" or "error" (typed), fails on anything else."""
    channel = fx.channels[service]
    response_class = _response_class(method)
    kwargs = dict(request_serializer=lambda b: b, response_deserializer=response_class.FromString)
    try:
        if method.server_streaming:
            responses = list(channel.unary_stream(_path(service, method.name), **kwargs)(payload, timeout=20))
        else:
            responses = [channel.unary_unary(_path(service, method.name), **kwargs)(payload, timeout=20)]
    except grpc.RpcError as exc:
        refused = exc.code() == grpc.StatusCode.INTERNAL and "deserializ" in (exc.details() or "").lower()
        assert refused or exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (
            f"{method.name}: gRPC {exc.code().name}: {exc.details()} (an unhandled failure)")
        return "error"
    outcome = "ok"
    for response in responses:
        if response.HasField("error") and response.error.code:
            assert response.error.code in KNOWN_CODES, f"{method.name}: unknown error code {response.error.code}"
            assert response.error.message, f"{method.name}: error {response.error.code} without a message"
            outcome = "error"
    return outcome


def _response_class(method):
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(method.output_type)


def _check(fx: Fixture, service: str, method, payload: bytes) -> None:
    before = fx.fingerprint()
    outcome = _call(fx, service, method, payload)
    if outcome == "error":
        assert fx.fingerprint() == before, f"{method.name} answered an error but changed the cluster"


def _assert_intact(fx: Fixture) -> None:
    admin = fx.cluster.admin
    assert admin.coordinator_info().active
    latest = admin.get_latest_kv_snapshots(fx.tid)
    assert {tb.bucket: info.snapshot_id for tb, info in latest.items()} == fx.snapshots
    assert {tb.bucket for tb in admin.describe_lease("held").buckets} == {0, 1}
    with TableClient(admin, "db.t", retry_total_s=10) as client:
        assert sorted(client.scan().rows, key=lambda r: r["id"]) == sorted(fx.rows, key=lambda r: r["id"])


# -- the tests -------------------------------------------------------------------------------------------


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@pytest.mark.parametrize("service, method", METHODS)
def test_built_requests_get_an_answer_or_a_typed_error_and_errors_change_nothing(fx, service, method):
    @FUZZ
    @given(data=st.data())
    def run(data):
        request = data.draw(message(method.input_type, fx))
        if _wrecks_the_fixture(method.name, request, fx):
            return
        _check(fx, service, method, request.SerializeToString())

    run()
    _assert_intact(fx)


@pytest.mark.parametrize("service, method", METHODS)
def test_random_and_mutated_bytes_are_refused_or_answered(fx, service, method):
    @FUZZ
    @given(data=st.data())
    def run(data):
        if data.draw(st.booleans()):
            payload = data.draw(st.binary(max_size=200))
        else:  # a built request with some bytes flipped
            payload = bytearray(data.draw(message(method.input_type, fx)).SerializeToString())
            for _ in range(data.draw(st.integers(1, 4)) if payload else 0):
                payload[data.draw(st.integers(0, len(payload) - 1))] ^= data.draw(st.integers(1, 255))
            payload = bytes(payload)
        try:
            request = method.input_type._concrete_class.FromString(payload)
        except Exception:
            request = None
        if request is not None and _wrecks_the_fixture(method.name, request, fx):
            return
        _check(fx, service, method, payload)

    run()
    _assert_intact(fx)
