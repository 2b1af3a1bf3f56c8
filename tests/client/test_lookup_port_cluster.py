"""Lookups over the tablet servers' lookup ports (docs/architecture.md, "The lookup port") against a real
coordinator and tablet servers on ZooKeeper: a client learns each leader's port from a gRPC answer and sends
its lookups there; they answer exactly what lookups over gRPC answer (random, absent, deleted and repeated keys,
single and batch), also while a leader fails over; a port that went stale (nobody there, another server's, an
answer lost) costs one call over gRPC, which names the right one again."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from kvlease.client.table import TableClient
from kvlease.common import config as cfg
from kvlease.common.lookup_frames import ANSWER, LOOKUP, OK, FrameReader, frame, hello
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import Column
from kvlease.common.wire import error_from_pb
from kvlease.tablet.lookup_port import LookupPortCollector
from kvlease.ops.wait import wait_until
from tests.client.test_lookup_port import FakePort, greeted
from tests.support.local_cluster import LocalCluster

pytestmark = pytest.mark.zk

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


@pytest.fixture
def cluster(make_config, tmp_path):
    with LocalCluster(make_config, tmp_path, 2) as c:
        yield c


def rows(ids) -> list[dict]:
    return [{"id": int(i), "v": f"v{i}"} for i in ids]


def leaders(client: TableClient) -> dict[int, str]:
    client.refresh()
    return client.physical.leaders()


def server_at(cluster: LocalCluster, address: str):
    return next(s for s in cluster.tablets.values() if s.address == address)


def answered(cluster: LocalCluster) -> int:
    return sum(s.lookups.answered for s in cluster.tablets.values())


def test_lookups_go_to_the_port_each_leader_names_and_answer_what_grpc_answers(cluster):
    cluster.create_table("db.t", COLUMNS, ["id"], 3)
    plain = cfg.Config({cfg.CLIENT_LOOKUP_PORT.name: False}, env={})
    with TableClient(cluster.admin, "db.t") as fast, TableClient(cluster.admin, "db.t", plain) as grpc_only:
        fast.upsert(rows(range(300)))
        fast.delete(list(range(0, 300, 7)))
        assert grpc_only.router.channels.lookup_ports is None
        ports = fast.router.channels.lookup_ports
        assert fast.lookup([1]) == [{"id": 1, "v": "v1"}]  # over gRPC: its answer names the port
        rng = np.random.default_rng(44)
        before = answered(cluster)
        for _ in range(150):
            keys = [int(k) for k in rng.integers(-5, 310, int(rng.integers(1, 4)))]
            assert fast.lookup(keys) == grpc_only.lookup(keys), keys
        batch = [int(k) for k in rng.integers(-5, 310, 500)]
        assert fast.lookup_batch(batch).equals(grpc_only.lookup_batch(batch))
        for address in set(leaders(fast).values()):
            server = server_at(cluster, address)
            assert ports.port(address) == server.lookups.port
            metrics = {f.name: f.samples[0].value for f in LookupPortCollector(lambda: server.lookups).collect()}
            assert metrics["kvlease_tablet_lookup_port_answers"] == server.lookups.answered > 0
            assert metrics["kvlease_tablet_lookup_port_connections"] >= 1  # the client's, idle now
        assert answered(cluster) - before >= 150  # every single-key lookup of ``fast`` went over a port


def test_a_stale_port_costs_one_call_over_grpc_which_names_the_right_one(cluster):
    cluster.create_table("db.t", COLUMNS, ["id"], 1)
    with TableClient(cluster.admin, "db.t") as client:
        client.upsert(rows(range(10)))
        address = leaders(client)[0]
        right = server_at(cluster, address).lookups.port
        other = next(s for s in cluster.tablets.values() if s.address != address).lookups.port
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            nobody = free.getsockname()[1]
        ports = client.router.channels.lookup_ports

        def lost(sock, reader):  # the HELLO is answered, the lookup's answer never leaves
            greeted(sock, reader)
            reader.read()
            sock.close()
        with FakePort(lost) as losing:
            for stale in (nobody, other, losing.port):
                ports.learn(address, stale)
                before = answered(cluster)
                assert client.lookup([3, 42]) == [{"id": 3, "v": "v3"}, None]
                assert ports.port(address) == right, stale
                assert answered(cluster) == before  # it went over gRPC
                assert client.lookup([4]) == [{"id": 4, "v": "v4"}]
                assert answered(cluster) == before + 1  # and the next over the right port


def test_lookups_over_the_ports_follow_a_leader_that_fails_over(make_config, tmp_path):
    with LocalCluster(make_config, tmp_path, 3) as cluster:
        info = cluster.admin.create_table("db.r", COLUMNS, ["id"], 2, replication_factor=3)
        wait_until(lambda: all(b.leader_address and len(b.isr) == 3
                               for b in cluster.admin.get_table_assignment(info.table_id)[1].values()),
                   30, "every bucket led, its replicas in sync")
        with TableClient(cluster.admin, "db.r", retry_total_s=60) as client:
            client.upsert(rows(range(200)))
            assert client.lookup(list(range(3))) == rows(range(3))
            gone = leaders(client)[0]
            server_id = next(i for i, s in cluster.tablets.items() if s.address == gone)
            cluster.stop_tablet(server_id)
            for key in range(200):
                assert client.lookup([key]) == rows([key])
            now = leaders(client)[0]
            assert now != gone
            assert client.router.channels.lookup_ports.port(now) == server_at(cluster, now).lookups.port


def test_any_bytes_in_a_lookup_frame_get_an_answer_and_the_connection_serves_on(cluster):
    """Random bodies (most no LookupRequest) and random requests (tables, buckets and keys that may not exist,
    offsets that lie) are each answered with a LookupResponse, an error in it or not, and the next frame on the
    same connection is answered too: the real service behind the port, fed what a broken client might send."""
    info = cluster.create_table("db.t", COLUMNS, ["id"], 2)
    with TableClient(cluster.admin, "db.t") as client:
        client.upsert(rows(range(20)))
        address = leaders(client)[0]
    server = server_at(cluster, address)
    rng = np.random.default_rng(45)
    with socket.create_connection(("127.0.0.1", server.lookups.port), timeout=30) as sock:
        sock.sendall(hello(address))
        reader = FrameReader(sock)
        assert reader.read() == (ANSWER, bytes([OK]))
        for i in range(300):
            if i % 2:
                body = rng.bytes(int(rng.integers(0, 64)))
            else:
                body = pb.LookupRequest(table_id=int(rng.choice([info.table_id, 0, 999, -1])),
                                        bucket=int(rng.integers(-1, 4)), key_data=rng.bytes(int(rng.integers(0, 20))),
                                        key_offsets=rng.bytes(int(rng.choice([0, 4, 8, 7])))).SerializeToString()
            sock.sendall(frame(LOOKUP, body))
            kind, answer = reader.read()
            assert kind == ANSWER
            response = pb.LookupResponse.FromString(answer)
            if i % 2 == 0:  # a LookupRequest: the service answered it (random bytes may be one too, or not)
                assert response.lookup_port == server.lookups.port
            if response.HasField("error"):
                assert error_from_pb(response.error) is not None
