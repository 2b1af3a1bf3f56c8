"""A coordinator that cannot reach ZooKeeper says so, at once, and the CLI prints it; a lease call whose
outcome is unknown says so. A real ZooKeeper of the test's own (killed, or frozen with SIGSTOP), a real
coordinator in this process, real gRPC on loopback and the real CLI (click's runner)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from typing import Iterator

import grpc
import pytest

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.proto import coordinator_pb2_grpc as pb_grpc
from kvlease.common.tables import Column
from kvlease.ops.local_cluster import ZooKeeperCluster
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.support.snapshot_manifests import commit_snapshot

pytestmark = [pytest.mark.zk, pytest.mark.timeout(180)]

#: A coordinator stuck on its ZooKeeper would answer after this (the service's own wait for its loop).
SERVICE_TIMEOUT = "30s"


@pytest.fixture
def own_zk(kvlease_tmp: str) -> Iterator[ZooKeeperCluster]:
    """A standalone ZooKeeper of this test's own, to kill or freeze (the session's one is shared)."""
    base = tempfile.mkdtemp(prefix="zk-own-", dir=kvlease_tmp)
    try:
        cluster = ZooKeeperCluster.start(base, 1)
        try:
            yield cluster
        finally:
            cluster.stop()  # SIGKILL: a frozen node dies too
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def coordinator(make_config, own_zk):
    """A coordinator on ``own_zk`` (with its admin client): ZooKeeper is started again before it stops."""
    from kvlease.coordinator.server import CoordinatorServer

    def make(session_timeout: str = "4s"):
        config = make_config({"zookeeper.address": own_zk.connect_string, "zookeeper.session-timeout": session_timeout,
                              "client.request-timeout": SERVICE_TIMEOUT})
        server = CoordinatorServer(config).start()
        made.append(server)
        assert server.wait_active(30), "no active coordinator"
        return server, AdminClient([server.address], retry_total_s=30)

    made: list = []
    yield make
    for server in made:
        serving(own_zk)  # a coordinator stops cleanly only while its ZooKeeper answers (kazoo waits for it)
        server.stop()


def serving(zk: ZooKeeperCluster) -> None:
    """``zk`` answers again: thawed if frozen, started again if killed."""
    if zk.alive(0):
        os.kill(zk.nodes[0].pid, signal.SIGCONT)
    else:
        zk.restart(0)


def test_a_coordinator_without_zookeeper_answers_at_once_that_zookeeper_is_unreachable(coordinator, own_zk):
    server, admin = coordinator()
    with admin:
        table = admin.create_table("db.t", [Column("id", "BIGINT")], ["id"], 1)
        commit_snapshot(admin, TableBucket(table.table_id, 0), 1, 10)
        admin.acquire_lease("L", {TableBucket(table.table_id, 0): 1}, 60_000)
        own_zk.kill(0)
        wait_until(lambda: not server.zk.connected, 30, "the coordinator noticed ZooKeeper is gone")

        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.CoordinatorServiceStub(channel)
            calls = {  # a write, a lease write, a read: none waits for ZooKeeper (a call stuck would time out)
                "CreateTable": lambda: stub.CreateTable(pb.CreateTableRequest(
                    database="db", name="t2", columns=[pb.ColumnPb(name="id", type="BIGINT")], primary_key=["id"],
                    buckets=1), timeout=20),
                "RenewKvSnapshotLease": lambda: stub.RenewKvSnapshotLease(pb.RenewKvSnapshotLeaseRequest(
                    lease_id="L", duration_ms=60_000), timeout=20),
                "ListTables": lambda: stub.ListTables(pb.ListTablesRequest(), timeout=20),
            }
            for method, call in calls.items():
                error = call().error
                assert error.code == errors.ErrorCode.ZOOKEEPER_UNAVAILABLE, (method, error)
                assert f"cannot reach ZooKeeper at {own_zk.connect_string}" in error.message, (method, error.message)

        with AdminClient([server.address], retry_total_s=0.5) as brief, \
                pytest.raises(errors.ZooKeeperUnavailableError):  # retried within its budget, then raised as it is
            brief.renew_lease("L", 60_000)

        address = ("--bootstrap", server.address, "--retry-timeout", "1s")
        for args in (("lease", "renew", "L", "--duration", "1m"), ("table", "list"),
                     ("table", "create", "db.t2", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "1")):
            line = assert_one_line_error(run(*address, *args))
            assert f"coordinator {server.address} cannot reach ZooKeeper at {own_zk.connect_string}" in line, line
            assert "is the cluster running" not in line and "gave up after retrying for 1s" in line, line

        serving(own_zk)  # back: the coordinator serves again (the same session, or a new term)
        wait_until(lambda: _serves(admin), 60, "the coordinator serves once ZooKeeper is back")
        assert [t.path for t in admin.list_tables()] == ["db.t"]


def _serves(admin: AdminClient) -> bool:
    try:
        admin.list_tables()
        return True
    except errors.KvLeaseError:
        return False


def test_a_lease_call_sent_but_not_answered_says_its_outcome_is_unknown(coordinator, own_zk):
    """ZooKeeper frozen (SIGSTOP): the coordinator still believes it connected (a long session) and the
    renew's write waits for an answer; the client's deadline passes, every resend too: the CLI says the
    renew may or may not have been applied, not that the cluster is not running."""
    server, admin = coordinator(session_timeout="40s")
    with admin:
        table = admin.create_table("db.t", [Column("id", "BIGINT")], ["id"], 1)
        commit_snapshot(admin, TableBucket(table.table_id, 0), 1, 10)
        admin.acquire_lease("L", {TableBucket(table.table_id, 0): 1}, 60_000)
        os.kill(own_zk.nodes[0].pid, signal.SIGSTOP)
        result = run("--bootstrap", server.address, "--retry-timeout", "2s", "lease", "renew", "L", "--duration", "1m",
                     env={"KVLEASE_CLIENT_REQUEST_TIMEOUT": "1s"})
        line = assert_one_line_error(result)
        assert line.startswith("error: outcome unknown: RenewKvSnapshotLease to coordinator "), line
        assert "may or may not have been applied" in line and "is the cluster running" not in line, line
        serving(own_zk)
