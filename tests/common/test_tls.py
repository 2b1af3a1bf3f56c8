"""TLS on every gRPC port: a round trip over TLS, mutual TLS, plaintext against TLS, bad files, certs."""

from __future__ import annotations

import socket
import time

import grpc
import pytest
from cryptography import x509

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.config import Config, ConfigError
from kvlease.common.tables import Column
from kvlease.common.tls import TlsFiles
from kvlease.ops.local_cluster import certs
from tests.support.local_cluster import LocalCluster


def security(paths: certs.CertPaths, *, client_auth: bool = False, client: bool = False) -> dict:
    cert, key = (paths.client_cert, paths.client_key) if client else (paths.node_cert, paths.node_key)
    # the client authenticates as the cluster's own principal (a super user): these tests are about TLS
    credentials = {"security.username": "kvlease", "security.password": "node-secret"} if client else {}
    return {"security.enabled": True, "security.tls.ca-file": str(paths.ca), "security.tls.cert-file": str(cert),
            "security.tls.key-file": str(key), "security.tls.client-auth": client_auth,
            "security.internal.password": "node-secret", **credentials}


def test_generate_writes_a_ca_and_certificates_for_loopback(tmp_path):
    paths = certs.generate(tmp_path / "certs")
    ca = x509.load_pem_x509_certificate(paths.ca.read_bytes())
    for path in (paths.node_cert, paths.client_cert):
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "localhost" in san.get_values_for_type(x509.DNSName)
        assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert paths.node_key.stat().st_mode & 0o077 == 0  # keys are the owner's only
    tls = TlsFiles.from_config(Config(security(paths), env={}), server=True)
    assert tls.ca == paths.ca.read_bytes() and tls.cert == paths.node_cert.read_bytes()


def test_security_off_means_no_tls_and_no_files_read():
    assert TlsFiles.from_config(Config({"security.tls.ca-file": "/nonexistent"}, env={})) is None


@pytest.mark.parametrize("key", ["security.tls.ca-file", "security.tls.cert-file", "security.tls.key-file"])
def test_a_missing_file_is_a_config_error_naming_key_and_path(tmp_path, key):
    settings = {**security(certs.generate(tmp_path / "certs")), key: str(tmp_path / "missing.pem")}
    with pytest.raises(ConfigError) as info:
        TlsFiles.from_config(Config(settings, env={}), server=True)
    assert key in info.value.message and str(tmp_path / "missing.pem") in info.value.message


def test_a_file_name_the_os_cannot_take_is_a_config_error_naming_key_and_path(tmp_path):
    settings = {**security(certs.generate(tmp_path / "certs")), "security.tls.ca-file": "ca\x00.pem"}
    with pytest.raises(ConfigError) as info:
        TlsFiles.from_config(Config(settings, env={}), server=True)
    assert info.value.message == ("cannot read config key 'security.tls.ca-file' file 'ca\\x00.pem': embedded "
                                  "null byte")


def test_a_server_with_a_missing_cert_refuses_to_start(make_config, tmp_path):
    from kvlease.coordinator.server import CoordinatorServer

    settings = {**security(certs.generate(tmp_path / "certs")), "security.tls.cert-file": str(tmp_path / "no.pem")}
    with pytest.raises(ConfigError, match="security.tls.cert-file"):
        CoordinatorServer(make_config(settings, **{"coordinator.port": 0})).start()


@pytest.fixture
def paths(tmp_path):
    return certs.generate(tmp_path / "certs")


def secure_cluster(make_config, tmp_path, paths, *, client_auth: bool) -> LocalCluster:
    def make(overrides=None, /, **more):
        return make_config({**security(paths, client_auth=client_auth), **(overrides or {})}, **more)
    return LocalCluster(make, tmp_path, 1,
                        client_config=Config(security(paths, client_auth=client_auth, client=True), env={}))


@pytest.mark.parametrize("client_auth", [False, True], ids=["tls", "mutual-tls"])
def test_round_trip_over_tls(make_config, tmp_path, paths, client_auth):
    cluster = secure_cluster(make_config, tmp_path, paths, client_auth=client_auth)
    try:
        cluster.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)
        with TableClient(cluster.admin, "db.t") as table:
            table.upsert([{"id": 1, "v": "one"}, {"id": 2, "v": "two"}])
            assert table.lookup([1, 2, 3]) == [{"id": 1, "v": "one"}, {"id": 2, "v": "two"}, None]
    finally:
        cluster.close()


def test_mutual_tls_refuses_a_client_without_a_certificate(make_config, tmp_path, paths):
    from kvlease.client.transport import TlsMismatchError

    cluster = secure_cluster(make_config, tmp_path, paths, client_auth=True)
    try:
        no_cert = Config({"security.enabled": True, "security.tls.ca-file": str(paths.ca)}, env={})
        tls = TlsFiles.from_config(no_cert)
        assert tls.cert is None
        with AdminClient([cluster.coordinator.address], no_cert, retry_total_s=30, request_timeout_s=5) as admin:
            start = time.monotonic()
            with pytest.raises(TlsMismatchError) as info:
                admin.list_tables()
            assert time.monotonic() - start < 5  # told at once, not after 30 s of "is it a TLS mismatch?"
        assert "it requires a client certificate (mutual TLS) and this client has none" in info.value.message
        assert "--cert-file" in info.value.message and "--key-file" in info.value.message
        # with one it is served
        assert cluster.admin.list_tables() == []
    finally:
        cluster.close()


def test_tls_without_client_auth_serves_a_client_without_a_certificate(make_config, tmp_path, paths):
    """The probe for a missing client certificate does not misread a TLS server that takes any client."""
    from kvlease.client.transport import tls_mismatch
    from kvlease.coordinator.server import CoordinatorServer

    server = CoordinatorServer(make_config(security(paths), **{"coordinator.port": 0})).start()
    try:
        assert tls_mismatch(server.address, client_tls=True, client_cert=False) is None
        no_cert = Config({"security.enabled": True, "security.tls.ca-file": str(paths.ca),
                          "security.username": "kvlease", "security.password": "node-secret"}, env={})
        with AdminClient([server.address], no_cert, retry_total_s=5) as admin:
            assert admin.list_tables() == []
    finally:
        server.stop()


@pytest.mark.parametrize("client_auth", [False, True], ids=["tls", "mutual-tls"])
def test_a_plaintext_client_against_tls_is_told_at_once_not_after_its_retries(make_config, tmp_path, paths,
                                                                               client_auth):
    from kvlease.client.transport import TlsMismatchError
    from kvlease.coordinator.server import CoordinatorServer

    server = CoordinatorServer(make_config(security(paths, client_auth=client_auth),
                                           **{"coordinator.port": 0})).start()
    try:
        with AdminClient([server.address], retry_total_s=30, request_timeout_s=5) as admin:
            start = time.monotonic()
            with pytest.raises(TlsMismatchError) as info:
                admin.list_tables()
            assert time.monotonic() - start < 5  # not the 30 s of retries a network error gets
        assert "it speaks TLS and this client does not" in info.value.message, info.value.message
        assert server.address in info.value.message
    finally:
        server.stop()


def test_a_tls_client_against_a_plaintext_coordinator_is_told_at_once(make_config, tmp_path, paths):
    from kvlease.client.transport import TlsMismatchError
    from kvlease.coordinator.server import CoordinatorServer

    server = CoordinatorServer(make_config(**{"coordinator.port": 0})).start()
    try:
        client_config = Config(security(paths, client=True), env={})
        with AdminClient([server.address], client_config, retry_total_s=30, request_timeout_s=5) as admin:
            start = time.monotonic()
            with pytest.raises(TlsMismatchError, match="it does not speak TLS and this client does"):
                admin.list_tables()
            assert time.monotonic() - start < 5
    finally:
        server.stop()


def test_a_client_with_another_clusters_ca_is_told_at_once(make_config, tmp_path, paths):
    from kvlease.client.transport import TlsMismatchError
    from kvlease.coordinator.server import CoordinatorServer

    other = certs.generate(tmp_path / "other-certs")
    server = CoordinatorServer(make_config(security(paths), **{"coordinator.port": 0})).start()
    try:
        client_config = Config({**security(paths, client=True), "security.tls.ca-file": str(other.ca)}, env={})
        with AdminClient([server.address], client_config, retry_total_s=30, request_timeout_s=5) as admin:
            start = time.monotonic()
            with pytest.raises(TlsMismatchError, match="its certificate does not verify against this client's CA"):
                admin.list_tables()
            assert time.monotonic() - start < 5  # not the 30 s of retries a network error gets
    finally:
        server.stop()


def test_a_key_that_is_not_the_certificates_is_a_config_error(paths, tmp_path):
    other = certs.generate(tmp_path / "other-certs")
    for key in (other.client_key, paths.ca):  # another pair's key; a file with no key at all
        settings = {**security(paths, client=True), "security.tls.key-file": str(key)}
        with pytest.raises(ConfigError, match=f"{key} is not the unencrypted private key of the certificate"):
            TlsFiles.from_config(Config(settings, env={}))
    assert TlsFiles.from_config(Config(security(paths, client=True), env={})).key is not None


def test_the_tls_probe_cannot_tell_where_nothing_listens():
    from kvlease.client.transport import tls_mismatch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert tls_mismatch(f"127.0.0.1:{port}", client_tls=False) is None  # refused: a network error, retried
    assert tls_mismatch(f"127.0.0.1:{port}", client_tls=True) is None


def test_cli_tls_options_turn_tls_on_and_a_missing_file_is_named(tmp_path):
    from tests.support.cli_runner import assert_one_line_error, run

    missing = str(tmp_path / "nope.pem")
    line = assert_one_line_error(run("--bootstrap", "127.0.0.1:1", "--ca-file", missing, "table", "list"))
    assert "security.tls.ca-file" in line and missing in line
    line = assert_one_line_error(run("--bootstrap", "127.0.0.1:1", "table", "list", env={"KVLEASE_CA_FILE": missing}))
    assert missing in line


def test_a_cluster_dir_names_its_client_certificate(tmp_path):
    import json

    from kvlease.client.cluster_dir import cluster_dir_security
    from kvlease.ops.cli.app import State

    paths = certs.generate(tmp_path / "certs")
    (tmp_path / "cluster.json").write_text(json.dumps({
        "coordinators": [{"address": "127.0.0.1:1"}],
        "security": {"ca_file": str(paths.ca), "cert_file": str(paths.client_cert),
                     "key_file": str(paths.client_key), "client_auth": True}}))
    settings = cluster_dir_security(tmp_path)
    assert settings["security.enabled"] and settings["security.tls.cert-file"] == str(paths.client_cert)
    tls = TlsFiles.from_config(State(cluster=str(tmp_path)).config())
    assert tls.client_auth and tls.cert == paths.client_cert.read_bytes()
    (tmp_path / "cluster.json").write_text(json.dumps({"coordinators": [{"address": "127.0.0.1:1"}]}))
    assert cluster_dir_security(tmp_path) == {}


class _Failed(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return self._details


def test_a_stream_whose_server_went_away_is_not_called_a_tls_mismatch():
    """A QA walkthrough killed a tablet server mid-stream on a plaintext cluster and was asked 'is it a
    TLS mismatch?'; a connection closed at once (a plaintext client against TLS) still is."""
    from kvlease.client.transport import rpc_error

    broke = rpc_error(_Failed("Stream removed (Socket closed)"), "ScanKvStream", "127.0.0.1:9", timeout_s=None,
                      idempotent=True)
    assert isinstance(broke, errors.NetworkError) and "TLS" not in broke.message, broke.message
    refused = rpc_error(_Failed("failed to connect; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Socket closed"),
                        "Lookup", "127.0.0.1:9", timeout_s=None, idempotent=True)
    assert "is it a TLS mismatch?" in refused.message, refused.message


class _Cancelled(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.CANCELLED

    def details(self):
        return "CANCELLED"


@pytest.mark.unit
@pytest.mark.parametrize("idempotent, expected", [(True, errors.NetworkError), (False, errors.OutcomeUnknownError)])
def test_a_call_cancelled_by_a_stopping_server_is_retriable_or_of_unknown_outcome(idempotent, expected):
    """A gRPC server that stops answers CANCELLED to calls reaching it then: a transport failure, retried
    when the call is idempotent, else one that may have been applied; never UnknownServerError."""
    from kvlease.client.transport import rpc_error

    error = rpc_error(_Cancelled(), "PutKv", "127.0.0.1:9", timeout_s=5.0, idempotent=idempotent)
    assert type(error) is expected and "cancelled by the server" in error.message
