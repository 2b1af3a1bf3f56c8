"""The authentication interceptors over real gRPC on loopback (a tiny server, no cluster)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from kvlease.common.errors import ErrorCode
from kvlease.common.proto import coordinator_pb2 as pb, coordinator_pb2_grpc as pb_grpc
from kvlease.common.proto import tablet_pb2 as tpb, tablet_pb2_grpc as tpb_grpc
from kvlease.common.security import passwords
from kvlease.common.security.authn import Authenticator
from kvlease.common.security.grpc_auth import AuthenticatingInterceptor, current_principal, with_credentials

pytestmark = pytest.mark.unit

USERS = {"alice": passwords.hash_password("wonderland", n=16, r=1, p=1)}
RAW = "/test.Raw/Echo"  # a method outside the kvlease protos: its response has no error field


class Coordinator(pb_grpc.CoordinatorServiceServicer):
    calls = 0

    def CoordinatorInfo(self, request, context):
        Coordinator.calls += 1
        return pb.CoordinatorInfoResponse(address=current_principal() or "<none>")


class Tablet(tpb_grpc.TabletServiceServicer):
    def ScanKvStream(self, request, context):
        for _ in range(3):  # the principal is read while gRPC iterates, after the handler returned
            yield tpb.ScanKvResponse(scanner_id=(current_principal() or "<none>").encode())


@pytest.fixture
def address():
    authenticator = Authenticator(USERS.get)
    server = grpc.server(ThreadPoolExecutor(4), interceptors=[
        AuthenticatingInterceptor(lambda user, password, _cert: authenticator.authenticate(user, password),
                                  exempt=["/kvlease.CoordinatorService/ListTables"])])
    pb_grpc.add_CoordinatorServiceServicer_to_server(Coordinator(), server)
    tpb_grpc.add_TabletServiceServicer_to_server(Tablet(), server)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Raw", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def channel(address):
    channels = []

    def make(*credentials):
        ch = grpc.insecure_channel(address)
        channels.append(ch)
        return with_credentials(ch, *credentials) if credentials else ch
    yield make
    for ch in channels:
        ch.close()


def test_valid_credentials_reach_the_handler_with_the_principal(channel):
    stub = pb_grpc.CoordinatorServiceStub(channel("alice", "wonderland"))
    for _ in range(2):
        response = stub.CoordinatorInfo(pb.CoordinatorInfoRequest(), timeout=10)
        assert response.error.code == 0 and response.address == "User:alice"


def test_a_streaming_handler_sees_the_principal_on_every_message(channel):
    stub = tpb_grpc.TabletServiceStub(channel("alice", "wonderland"))
    responses = list(stub.ScanKvStream(tpb.ScanKvStreamRequest(), timeout=10))
    assert [r.scanner_id for r in responses] == [b"User:alice"] * 3 and not any(r.error.code for r in responses)


@pytest.mark.parametrize("credentials", [(), ("alice", "wrong"), ("bob", "wonderland"), ("../alice", "wonderland")],
                         ids=["none", "wrong-password", "unknown-user", "bad-name"])
def test_bad_credentials_are_answered_in_band_and_the_handler_does_not_run(channel, credentials):
    before = Coordinator.calls
    response = pb_grpc.CoordinatorServiceStub(channel(*credentials)).CoordinatorInfo(
        pb.CoordinatorInfoRequest(), timeout=10)
    assert response.error.code == ErrorCode.AUTHENTICATION_FAILED
    assert "authentication failed" in response.error.message and "wonderland" not in response.error.message
    assert Coordinator.calls == before

    stream = list(tpb_grpc.TabletServiceStub(channel(*credentials)).ScanKvStream(tpb.ScanKvStreamRequest(), timeout=10))
    assert [r.error.code for r in stream] == [ErrorCode.AUTHENTICATION_FAILED]


def test_a_method_without_an_error_field_is_aborted_unauthenticated(channel):
    echo = channel("alice", "wrong").unary_unary(RAW)
    with pytest.raises(grpc.RpcError) as info:
        echo(b"hi", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert channel("alice", "wonderland").unary_unary(RAW)(b"hi", timeout=10) == b"hi"


def test_exempt_methods_need_no_credentials_and_carry_no_principal(channel):
    with pytest.raises(grpc.RpcError) as info:  # the handler ran: the base servicer's UNIMPLEMENTED
        pb_grpc.CoordinatorServiceStub(channel()).ListTables(pb.ListTablesRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_client_helper_replaces_credentials_already_in_the_metadata(channel):
    stub = pb_grpc.CoordinatorServiceStub(channel("alice", "wonderland"))
    response = stub.CoordinatorInfo(pb.CoordinatorInfoRequest(), metadata=[("username", "bob"), ("password", "x")],
                                    timeout=10)
    assert response.address == "User:alice"
