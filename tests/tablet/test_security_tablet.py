"""Per-RPC authorization on the tablet server, on a real SecureCluster (ZooKeeper, gRPC over TLS).

WRITE on the table for PutKv (put and delete) and TriggerSnapshot; READ for Lookup, PrefixLookup, FetchLog,
ListOffsets, ScanKv and ScanKvStream. A denied call is AUTHORIZATION_FAILED naming the operation and the table,
and changes nothing (checked through the super user). A scanner belongs to the principal that opened it; a
revoked READ stops its continuation. UpdateLeadership is the cluster's own.

One SecureCluster for the module; each test has its own tables and users. Clients of a user are
TableClients (its real path) and, for one exact call, raw tablet stubs over TLS with its credentials.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from pathlib import Path

import grpc
import pytest

from kvlease.client.table import TableClient
from kvlease.client.transport import Channels
from kvlease.common import errors
from kvlease.common.config import Config
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.common.tables import Column
from kvlease.common.codec import batch_to_ipc
from kvlease.common.security.acl import Operation, Resource
from kvlease.common.tls import TlsFiles
from kvlease.common.wire import error_from_pb
from kvlease.ops.wait import wait_until
from tests.conftest import TEST_DEFAULTS
from tests.support.secure_cluster import ACL_WAIT_S, ADMIN, ADMIN_PASSWORD, NOT_YET_GRANTED, SecureCluster

pytestmark = pytest.mark.timeout(120)

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]
ROWS = [{"id": i, "v": f"v{i}"} for i in range(1, 21)]
AUTHZ = errors.ErrorCode.AUTHORIZATION_FAILED
AUTHN = errors.ErrorCode.AUTHENTICATION_FAILED


# -- the cluster, tables, users -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sc(zk_server, kvlease_tmp):
    base = Path(tempfile.mkdtemp(prefix="sec-tablet-", dir=kvlease_tmp))
    settings = {**TEST_DEFAULTS, "zookeeper.address": zk_server.connect_string,
                "zookeeper.path.root": f"/sec-tablet-{uuid.uuid4().hex[:8]}",
                "remote.data.dir": f"file://{base / 'remote'}"}
    (base / "remote").mkdir()

    def make_config(overrides=None, /, **more):
        return Config({**settings, **(overrides or {}), **more}, env={})

    cluster = SecureCluster(make_config, base, tablets=1)
    try:
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def table(sc):
    """A fresh table ``<db>.t`` (its own database) with :data:`ROWS`, written by the super user."""
    path = f"d{uuid.uuid4().hex[:8]}.t"
    sc.cluster.create_table(path, COLUMNS, ["id"], 2)
    with TableClient(sc.admin, path, retry_total_s=10) as client:
        client.upsert(ROWS)
    return path


@pytest.fixture
def make_user(sc, stubs):
    """``make_user(*grants) -> (name, password)``: a fresh user, once the coordinator and the tablet server
    know it (their user caches follow ZooKeeper watches); grants are ``(operation, resource)``, not waited for."""
    def make(*grants):
        name, password = f"u{uuid.uuid4().hex[:8]}", "pw-" + uuid.uuid4().hex[:6]
        sc.add_user(name, password)
        for operation, resource in grants:
            sc.grant(f"User:{name}", operation, resource)
        stub, admin = stubs(name, password), sc.admin_as(name, password)

        def known() -> bool:
            try:
                if stub.ListOffsets(pb.ListOffsetsRequest(table_id=0), timeout=10).error.code == AUTHN:
                    return False
            except grpc.RpcError as exc:  # a connection that failed (a TLS handshake cut short under load) tells
                if exc.code() != grpc.StatusCode.UNAVAILABLE:  # nothing yet: asked again, as the client library would
                    raise
                return False
            try:
                admin.list_tablet_servers()
            except errors.AuthenticationFailedError:
                return False
            except errors.KvLeaseError:  # authenticated, whatever else the answer is
                pass
            return True
        wait_until(known, ACL_WAIT_S, f"user {name} known to the servers")
        return name, password
    return make


@pytest.fixture
def clients(sc):
    """``clients(user, table) -> TableClient`` of that user (closed after the test)."""
    made = []

    def make(user, path):
        client = TableClient(sc.admin_as(*user), path, retry_total_s=2)
        made.append(client)
        return client
    yield make
    for client in made:
        client.close()


@pytest.fixture
def stubs(sc):
    """TLS stubs with credentials, one channel per user: the one ``make_user`` saw answered (a new one's handshake
    may be cut short under load)."""
    made: dict[tuple, Channels] = {}

    def make(user=None, password=None):
        if (user, password) not in made:
            made[user, password] = Channels(tls=TlsFiles.from_config(sc.client_config()),
                                            credentials=None if user is None else (user, password))
        return made[user, password].stub(sc.cluster.tablets[1].address, pb_grpc.TabletServiceStub)
    yield make
    for channels in made.values():
        channels.close()


def denied(call, operation: str, path: str) -> errors.AuthorizationFailedError:
    with pytest.raises(errors.AuthorizationFailedError) as info:
        call()
    assert f"may not {operation} table {path}" in str(info.value), info.value
    return info.value


def state(sc, path):
    """What a denied call must not change: rows, log offsets, committed snapshots (read by the super user)."""
    with TableClient(sc.admin, path, retry_total_s=10) as client:
        rows = client.lookup([r["id"] for r in ROWS] + [999])
        offsets = client.list_offsets()
        snapshots = sorted((s.bucket.bucket, s.snapshot_id) for s in sc.admin.list_kv_snapshots(client.table.table_id))
    return rows, offsets, snapshots


def add_rows(sc, path, n=300):
    """More rows, so that a scan of one row per batch outlasts an ACL change reaching the cache."""
    with TableClient(sc.admin, path, retry_total_s=10) as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(1000, 1000 + n)])


def open_scanners(sc) -> int:
    return sc.cluster.tablets[1].scans.counts()[0]


def raise_for(response):
    error = error_from_pb(response.error)
    if error is not None:
        raise error
    return response


# -- every RPC, a user without any ACL --------------------------------------------------------------------


def _requests(table_id: int, codec_batches):
    upserts, keys = codec_batches
    return {
        "put": ("PutKv", pb.PutKvRequest(table_id=table_id, bucket=0, upserts=upserts), "WRITE"),
        "delete": ("PutKv", pb.PutKvRequest(table_id=table_id, bucket=0, deletes=keys), "WRITE"),
        "trigger snapshot": ("TriggerSnapshot", pb.TriggerSnapshotRequest(table_id=table_id, wait=True), "WRITE"),
        "lookup": ("Lookup", pb.LookupRequest(table_id=table_id, bucket=0, keys=keys), "READ"),
        "prefix lookup": ("PrefixLookup", pb.PrefixLookupRequest(table_id=table_id, bucket=0, prefixes=keys), "READ"),
        "fetch log": ("FetchLog", pb.FetchLogRequest(table_id=table_id, bucket=0, from_offset=0, max_bytes=1 << 20),
                      "READ"),
        "list offsets": ("ListOffsets", pb.ListOffsetsRequest(table_id=table_id, buckets=[0, 1]), "READ"),
        "scan": ("ScanKv", pb.ScanKvRequest(bucket_scan_req=pb.BucketScanReqPb(table_id=table_id, bucket=0),
                                            batch_size_bytes=1), "READ"),
        "scan stream": ("ScanKvStream", pb.ScanKvStreamRequest(
            bucket_scan_req=pb.BucketScanReqPb(table_id=table_id, bucket=0), batch_size_bytes=1), "READ"),
    }


def _call(stub, method, request):
    if method == "ScanKvStream":
        responses = list(stub.ScanKvStream(request, timeout=10))
        assert len(responses) == 1, responses  # the refusal is the stream's only message
        return responses[0]
    return getattr(stub, method)(request, timeout=10)


def _batches(sc, path):
    """``(table_id, (rows, keys))``: Arrow IPC a put and a delete send (refused before they are read)."""
    with TableClient(sc.admin, path, retry_total_s=10) as client:
        rows = client.codec.to_batch([{"id": 1, "v": "changed"}, {"id": 500, "v": "new"}])
        return client.table.table_id, (batch_to_ipc(rows), batch_to_ipc(client.key_batch([1, 2, 3])))


def test_every_rpc_is_denied_to_a_user_without_acls_naming_operation_and_table_and_changes_nothing(
        sc, table, make_user, stubs):
    table_id, batches = _batches(sc, table)
    stub = stubs(*make_user())
    before = state(sc, table)
    for what, (method, request, operation) in _requests(table_id, batches).items():
        response = _call(stub, method, request)
        assert response.error.code == AUTHZ, (what, response)
        assert f"may not {operation} table {table}" in response.error.message, (what, response.error.message)
    assert state(sc, table) == before
    assert open_scanners(sc) == 0


# -- reads need READ, writes need WRITE (the user's TableClient) ------------------------------------------


def test_reads_are_denied_without_read_and_allowed_with_it(sc, table, make_user, clients):
    user = make_user(("WRITE", table))  # may write (and describe the table), not read
    client = clients(user, table)
    denied(lambda: client.lookup([1]), "READ", table)
    denied(lambda: client.fetch_log(0, 0), "READ", table)
    denied(lambda: client.list_offsets(), "READ", table)
    denied(lambda: client.scan(), "READ", table)
    denied(lambda: client.scan(streaming=True), "READ", table)
    with client.scanner(0) as scanner:
        denied(scanner.poll, "READ", table)
    assert open_scanners(sc) == 0

    sc.grant(f"User:{user[0]}", "READ", table)
    assert wait_until(lambda: client.lookup([1, 999]), ACL_WAIT_S, "a lookup once READ was granted",
                      retry_on=NOT_YET_GRANTED) == [ROWS[0], None]
    offsets = client.list_offsets()
    assert sum(latest for _earliest, latest in offsets.values()) > 0
    records, _end = client.fetch_log(0, 0)
    assert records and all(r["change_type"] == "+I" for r in records)
    assert sorted(r["id"] for r in client.scan().rows) == [r["id"] for r in ROWS]
    assert sorted(r["id"] for r in client.scan(streaming=True).rows) == [r["id"] for r in ROWS]
    assert open_scanners(sc) == 0


def test_writes_are_denied_without_write_and_change_nothing_and_allowed_with_it(sc, table, make_user, clients):
    user = make_user(("READ", table))  # may read, not write
    client = clients(user, table)
    before = state(sc, table)
    denied(lambda: client.upsert([{"id": 1, "v": "changed"}, {"id": 500, "v": "new"}]), "WRITE", table)
    denied(lambda: client.delete([1, 2]), "WRITE", table)
    denied(lambda: client.trigger_snapshot(), "WRITE", table)
    assert state(sc, table) == before  # rows, offsets and snapshots as they were

    sc.grant(f"User:{user[0]}", "WRITE", table)
    wait_until(lambda: client.upsert([{"id": 1, "v": "changed"}]), ACL_WAIT_S, "a write once WRITE was granted",
               retry_on=NOT_YET_GRANTED)
    client.delete([2])
    assert client.lookup([1, 2, 3]) == [{"id": 1, "v": "changed"}, None, ROWS[2]]
    committed = client.trigger_snapshot()
    assert {s.bucket for s in committed} == {0, 1}
    assert len(sc.admin.list_kv_snapshots(client.table.table_id)) == 2


# -- what a grant covers --------------------------------------------------------------------------------


def test_grants_on_the_database_and_the_cluster_cover_the_table(sc, table, make_user, clients):
    db = table.split(".")[0]
    reader = clients(make_user(("READ", db)), table)
    assert wait_until(lambda: reader.lookup([1]), ACL_WAIT_S, "a lookup under the database's grant",
                      retry_on=NOT_YET_GRANTED) == [ROWS[0]]
    denied(lambda: reader.upsert([{"id": 1, "v": "x"}]), "WRITE", table)

    writer = clients(make_user(("WRITE", "cluster")), table)
    wait_until(lambda: writer.upsert([{"id": 700, "v": "by cluster grant"}]), ACL_WAIT_S,
               "a write under the cluster's grant", retry_on=NOT_YET_GRANTED)
    denied(lambda: writer.lookup([700]), "READ", table)
    assert reader.lookup([700]) == [{"id": 700, "v": "by cluster grant"}]


def test_a_wildcard_grant_covers_every_user_of_that_table_only(sc, table, make_user, clients):
    other = f"d{uuid.uuid4().hex[:8]}.t"
    sc.cluster.create_table(other, COLUMNS, ["id"], 1)
    sc.grant("User:*", "READ", table)
    user = make_user(("WRITE", other))
    assert wait_until(lambda: clients(user, table).lookup([3]), ACL_WAIT_S, "a lookup under the wildcard grant",
                      retry_on=NOT_YET_GRANTED) == [ROWS[2]]
    denied(lambda: clients(user, other).lookup([3]), "READ", other)


# -- authentication --------------------------------------------------------------------------------------


@pytest.mark.parametrize("credentials", ["wrong password", "unknown user", "none"])
def test_bad_credentials_are_authentication_failed_and_change_nothing(sc, table, make_user, stubs, credentials):
    name, password = make_user(("ALL", table))
    user = {"wrong password": (name, "not-" + password), "unknown user": ("nobody" + name, password),
            "none": (None, None)}[credentials]
    stub = stubs(*user)
    table_id, batches = _batches(sc, table)
    before = state(sc, table)
    for what, (method, request, _operation) in _requests(table_id, batches).items():
        response = _call(stub, method, request)
        assert response.error.code == AUTHN, (what, response)
        assert "authentication failed" in response.error.message
    assert state(sc, table) == before
    assert open_scanners(sc) == 0


def test_a_plaintext_client_against_the_tls_server_gets_a_clear_network_error(sc, table):
    with TableClient(sc.admin, table, retry_total_s=0.5) as client:
        client.router.channels.close()
        client.router.channels = Channels()  # plaintext, no credentials
        with pytest.raises(errors.NetworkError) as info:
            client.lookup([1])
    message = str(info.value)
    assert "TLS" in message and sc.cluster.tablets[1].address in message, message
    assert "Traceback" not in message and len(message.splitlines()) == 1


# -- internal calls -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["user with ALL on the cluster", "super user"])
def test_a_forged_update_leadership_is_refused_and_the_table_keeps_its_data(sc, table, make_user, stubs, who):
    user = make_user(("ALL", "cluster")) if who.startswith("user") else (ADMIN, ADMIN_PASSWORD)
    with TableClient(sc.admin, table, retry_total_s=10) as client:
        table_id = client.table.table_id
    before = state(sc, table)
    response = stubs(*user).UpdateLeadership(
        pb.UpdateLeadershipRequest(coordinator_epoch=2 ** 40, buckets=[], dropped_tables=[table_id]), timeout=10)
    assert response.error.code == AUTHZ, response
    assert "UpdateLeadership" in response.error.message and "cluster's own principal" in response.error.message
    tablet = sc.cluster.tablets[1]
    assert tablet.replicas.table(table_id) is not None and tablet.replicas.coordinator_epoch < 2 ** 40
    assert state(sc, table) == before


def test_a_replica_fetch_by_a_user_is_refused_and_reads_nothing(sc, table, make_user, stubs):
    """Followers' fetches read every entry, also those not committed: the cluster's own principal only."""
    user = make_user(("ALL", "cluster"))
    with TableClient(sc.admin, table, retry_total_s=10) as client:
        table_id = client.table.table_id
    response = stubs(*user).ReplicaFetch(pb.ReplicaFetchRequest(replica_id=2, buckets=[pb.ReplicaFetchBucketPb(
        table_id=table_id, bucket=0, max_bytes=1 << 20)]), timeout=10)
    assert response.error.code == AUTHZ, response
    assert "ReplicaFetch" in response.error.message and "cluster's own principal" in response.error.message
    assert not response.buckets


# -- scanner sessions ----------------------------------------------------------------------------------------


def _open_scan(stub, table_id, bucket=0):
    response = raise_for(stub.ScanKv(pb.ScanKvRequest(
        bucket_scan_req=pb.BucketScanReqPb(table_id=table_id, bucket=bucket), batch_size_bytes=1), timeout=10))
    assert response.has_more_results and response.record_count == 1  # one row per batch
    return response.scanner_id


def _next(stub, sid, call):
    return stub.ScanKv(pb.ScanKvRequest(scanner_id=sid, call_seq_id=call, batch_size_bytes=1), timeout=10)


def _close(stub, sid):
    return stub.ScanKv(pb.ScanKvRequest(scanner_id=sid, close_scanner=True), timeout=10)


def test_a_scanner_belongs_to_its_opener(sc, table, make_user, stubs):
    table_id = sc.admin.get_table(table).table_id
    alice, bob = stubs(*make_user(("READ", table))), stubs(*make_user(("READ", table)))
    sid = wait_until(lambda: _open_scan(alice, table_id), ACL_WAIT_S, "alice opens a scan", retry_on=NOT_YET_GRANTED)
    first = raise_for(_next(alice, sid, 0))

    for response in (_next(bob, sid, 1), _next(bob, sid, 0), _close(bob, sid)):  # next, replay, close
        assert response.error.code == AUTHZ, response
        assert f"scanner {sid.hex()} of table {table}" in response.error.message
        assert "another principal opened it" in response.error.message
    assert open_scanners(sc) == 1

    assert raise_for(_next(alice, sid, 0)).records == first.records  # the owner's replay still works
    call, rows = 1, 2
    while True:
        response = raise_for(_next(alice, sid, call))
        rows += response.record_count
        if not response.has_more_results:
            break
        call += 1
    assert open_scanners(sc) == 0
    # the finished session's last batch: replayed to its owner, refused to anyone else
    assert raise_for(_next(alice, sid, call)).records == response.records
    assert _next(bob, sid, call).error.code == AUTHZ
    with TableClient(sc.admin, table, retry_total_s=10) as client:
        assert rows == sum(b.num_rows for b in client.scan(buckets=[0]).batches)


def test_a_revoked_read_stops_a_scan_which_its_owner_can_still_close(sc, table, make_user, stubs):
    table_id = sc.admin.get_table(table).table_id
    add_rows(sc, table)
    name, password = make_user(("READ", table))
    alice = stubs(name, password)
    sid = wait_until(lambda: _open_scan(alice, table_id), ACL_WAIT_S, "alice opens a scan", retry_on=NOT_YET_GRANTED)
    sc.revoke(f"User:{name}", "READ", table)

    call = 0

    def refused():  # the scan goes on, a batch a call, until the tablet server's cache has the revoke
        nonlocal call
        response = _next(alice, sid, call)
        if response.error.code == AUTHZ:
            return response
        assert response.has_more_results, response
        call += 1
        return None
    response = wait_until(refused, ACL_WAIT_S, "the revoke refuses alice's next batch", interval_s=0)
    assert f"may not READ table {table}" in response.error.message
    assert open_scanners(sc) == 1  # refused, not ended: the session is as it was

    sc.grant(f"User:{name}", "READ", table)  # read again: the session goes on where it was
    assert wait_until(lambda: raise_for(_next(alice, sid, call)), ACL_WAIT_S, "alice's next batch once granted again",
                      retry_on=NOT_YET_GRANTED).record_count == 1
    sc.revoke(f"User:{name}", "READ", table)
    assert raise_for(_close(alice, sid)).has_more_results is False  # closing needs no READ
    assert open_scanners(sc) == 0


def test_a_revoked_read_stops_the_clients_scanners(sc, table, make_user, clients, monkeypatch):
    name, password = make_user(("READ", table))
    client = clients((name, password), table)
    cache = sc.cluster.tablets[1].security  # the tablet server's watched ACL cache (in-process)
    readable = lambda: cache.allowed(Operation.READ, Resource.table(table), f"User:{name}")  # noqa: E731
    scans, gate = sc.cluster.tablets[1].scans, threading.Event()
    # no batch past the first is read before the revoke is in the cache (else all may be sent before it)
    monkeypatch.setattr(scans, "_continue", lambda *a, take=scans._continue: (gate.wait(ACL_WAIT_S), take(*a))[1])
    for streaming in (False, True):
        gate.clear()
        sc.grant(f"User:{name}", "READ", table)
        wait_until(readable, ACL_WAIT_S, "the grant reached the tablet server")
        with client.scanner(0, streaming=streaming, batch_size_bytes=1) as scanner:
            assert wait_until(scanner.poll, ACL_WAIT_S, "the first batch", retry_on=NOT_YET_GRANTED).num_rows == 1
            sc.revoke(f"User:{name}", "READ", table)
            wait_until(lambda: not readable(), ACL_WAIT_S, "the revoke reached the tablet server")
            gate.set()  # a batch whose READ was checked before the revoke may still come; none after it
            with pytest.raises(errors.AuthorizationFailedError, match=f"may not READ table {table}") as info:
                wait_until(lambda: scanner.poll() is None, ACL_WAIT_S, "the scan refused", interval_s=0)
            assert "lost after" in info.value.message and "resume" not in info.value.message  # none would help
    wait_until(lambda: open_scanners(sc) == 0, ACL_WAIT_S, "the sessions freed")  # once each call ended
