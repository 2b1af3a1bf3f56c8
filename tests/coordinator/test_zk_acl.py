"""ZooKeeper digest ACLs (``security.zookeeper.digest``) on a real ZooKeeper: a cluster works with them,
and nobody without the digest can read or change its nodes."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, Permissions, make_digest_acl_credential

from kvlease.client.table import TableClient
from kvlease.common import zkpaths
from kvlease.common.config import Config, ConfigError
from kvlease.common.model import TableBucket
from kvlease.common.security.users import UserStore
from kvlease.common.tables import Column
from kvlease.common.zk import make_client
from tests.support.local_cluster import LocalCluster

DIGEST = "kvlease-zk:zk-pass-Qx7"
COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING")]


def raw_client(zk_server, zk_root: str, auth: str | None = None) -> KazooClient:
    """A kazoo client on the test's chroot that does not go through make_client: no digest, or ``auth``."""
    client = KazooClient(hosts=zk_server.connect_string + zk_root, timeout=4,
                         auth_data=[("digest", auth)] if auth else None)
    client.start(timeout=10)
    return client


@pytest.fixture
def outsiders(zk_server, zk_root):
    clients = []

    def make(auth: str | None = None) -> KazooClient:
        clients.append(raw_client(zk_server, zk_root, auth))
        return clients[-1]

    yield make
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def digest_cluster(make_config, tmp_path):
    cluster = LocalCluster(lambda o=None, /, **more: make_config({"security.zookeeper.digest": DIGEST, **(o or {})},
                                                                  **more), tmp_path, 1)
    try:
        yield cluster
    finally:
        cluster.close()


def every_node(client: KazooClient, path: str = "/") -> list[str]:
    found = [path]
    for name in client.get_children(path):
        found.extend(every_node(client, f"{path.rstrip('/')}/{name}"))
    return found


def test_a_cluster_with_the_digest_works_and_its_nodes_are_closed_to_others(digest_cluster, make_config, outsiders):
    c = digest_cluster
    table = c.create_table("db.t", COLUMNS, ["id"], 2)
    with TableClient(c.admin, "db.t") as client:
        client.upsert([{"id": i, "v": f"v{i}"} for i in range(100)])
        snapshots = client.trigger_snapshot(wait=True)
        assert client.lookup([7]) == [{"id": 7, "v": "v7"}]
    c.admin.acquire_lease("reader", {TableBucket(table.table_id, s.bucket): s.snapshot_id for s in snapshots},
                          60_000)
    assert [lease.lease_id for lease in c.admin.list_leases()] == ["reader"]

    # every node under the chroot (the chroot itself included) carries the digest-only ACL
    mine = make_client(make_config({"security.zookeeper.digest": DIGEST}))
    try:
        UserStore(mine, n=2 ** 4, r=8, p=1).add("alice", "alice-pw")
        nodes = every_node(mine)
        assert zkpaths.ACTIVE in nodes and len(nodes) > 10
        owner = "digest", make_digest_acl_credential(*DIGEST.split(":", 1))
        for path in nodes:
            acls, _ = mine.get_acls(path)
            assert [(a.id.scheme, a.id.id, a.perms) for a in acls] == [(*owner, Permissions.ALL)], path
        active = mine.get(zkpaths.ACTIVE)[0]
        users = mine.get_children("/security/users")
    finally:
        mine.stop()
        mine.close()
    assert users == ["alice"]

    for outsider in (outsiders(), outsiders("kvlease-zk:wrong-password"), outsiders("intruder:x")):
        for attempt in (lambda: outsider.set(zkpaths.ACTIVE, b"{}"),
                        lambda: outsider.delete(zkpaths.ACTIVE),
                        lambda: outsider.create("/tables/evil", b""),
                        lambda: outsider.create("/security/users/mallory", b"{}"),
                        lambda: outsider.set("/security/users/alice", b"{}"),
                        lambda: outsider.get("/security/users/alice"),
                        lambda: outsider.get_children("/security/users"),
                        lambda: outsider.get(zkpaths.ACTIVE),
                        lambda: outsider.set_acls("/", OPEN_ACL_UNSAFE),
                        lambda: outsider.create("/evil", b"")):
            with pytest.raises(NoAuthError):
                attempt()
    # nothing changed: the cluster still serves
    mine = make_client(make_config({"security.zookeeper.digest": DIGEST}))
    try:
        assert mine.get(zkpaths.ACTIVE)[0] == active
    finally:
        mine.stop()
        mine.close()
    assert c.admin.get_table("db.t").table_id == table.table_id


@pytest.mark.parametrize("digest", ["", "kvlease-zk:wrong-password", "someone-else:zk-pass-Qx7"])
def test_a_process_without_the_right_digest_fails_at_start_naming_the_key(digest_cluster, make_config, tmp_path,
                                                                          digest):
    from kvlease.coordinator.server import CoordinatorServer
    from kvlease.tablet.server import TabletServer

    with pytest.raises(ConfigError, match=r"ZooKeeper refused .*: check security\.zookeeper\.digest") as exc:
        make_client(make_config({"security.zookeeper.digest": digest}))
    assert "zk-pass" not in str(exc.value) and "wrong-password" not in str(exc.value)
    for server in (CoordinatorServer(make_config({"security.zookeeper.digest": digest})),
                   TabletServer(make_config({"security.zookeeper.digest": digest, "tablet.id": 9,
                                             "tablet.data-dir": str(tmp_path / "t9")}))):
        try:
            with pytest.raises(ConfigError, match="security.zookeeper.digest"):
                server.start()
        finally:
            server.stop()


def test_a_tree_made_before_the_digest_is_secured_by_the_first_process_that_has_it(make_config, outsiders):
    legacy = make_client(make_config())  # no digest: ZooKeeper's open ACL
    try:
        legacy.ensure_path("/tables/db/t")
        legacy.create("/coordinators/active", b"{}", makepath=True)
    finally:
        legacy.stop()
        legacy.close()
    anyone = outsiders()
    assert anyone.get_acls("/tables/db/t")[0] == OPEN_ACL_UNSAFE

    secured = make_client(make_config({"security.zookeeper.digest": DIGEST}))
    try:
        assert secured.get("/coordinators/active")[0] == b"{}"
    finally:
        secured.stop()
        secured.close()
    for path in ("/tables/db/t", "/tables", "/coordinators/active", "/"):
        with pytest.raises(NoAuthError):
            anyone.set(path, b"x")
        with pytest.raises(NoAuthError):
            anyone.get_acls(path)
    with pytest.raises(ConfigError, match="security.zookeeper.digest"):
        make_client(make_config())  # the tree is no longer open


def test_a_malformed_digest_is_a_config_error_naming_the_key_without_the_value():
    for value in ("no-colon-secret", ":only-a-password"):
        with pytest.raises(ConfigError, match="security.zookeeper.digest") as exc:
            Config({"security.zookeeper.digest": value}, env={})
        assert value not in str(exc.value)
    assert Config({"security.zookeeper.digest": "u:p:with:colons"}, env={})["security.zookeeper.digest"]
