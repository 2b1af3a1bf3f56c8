"""The user and ACL stores on a real ZooKeeper, and their watch-driven caches."""

from __future__ import annotations

import pytest

from kvlease.common import zkpaths
from kvlease.common.errors import AlreadyExistsError, AuthenticationFailedError, AuthorizationFailedError, \
    InvalidRequestError, NotFoundError
from kvlease.common.security.acl import AclEntry, Operation, Resource
from kvlease.common.security.acl_store import AclCache, AclStore
from kvlease.common.security.users import UserCache, UserStore
from kvlease.common.security.watched import WatchedDirectory
from kvlease.common.zk import make_client
from kvlease.ops.wait import wait_until

CHEAP = {"n": 2 ** 4, "r": 1, "p": 1}


@pytest.fixture
def other_client(zk_config):
    """A second session: the writer, while the caches watch through ``zk_client``."""
    client = make_client(zk_config)
    try:
        yield client
    finally:
        client.stop()
        client.close()


# --- users ----------------------------------------------------------------------------

def test_users_are_added_listed_and_removed(zk_client):
    store = UserStore(zk_client, **CHEAP)
    assert store.list() == []
    store.add("alice", "pw one!")  # a space and "!" never appear in base64 salt or digest
    store.add("bob", "pw2")
    assert store.list() == ["alice", "bob"]
    data, _ = zk_client.get(zkpaths.user("alice"))
    assert b"pw one!" not in data and b'"algorithm":"scrypt"' in data.replace(b" ", b"")
    with pytest.raises(AlreadyExistsError):
        store.add("alice", "again")
    store.remove("alice")
    assert store.list() == ["bob"]
    with pytest.raises(NotFoundError):
        store.remove("alice")
    with pytest.raises(NotFoundError):
        store.set_password("alice", "x")
    for bad in ("a/b", "alice\n", "", ".."):
        with pytest.raises(InvalidRequestError):
            store.add(bad, "pw")


def test_the_user_cache_follows_adds_password_changes_and_removals(zk_client, other_client):
    store = UserStore(other_client, **CHEAP)
    store.add("alice", "pw1")
    cache = UserCache(zk_client)
    try:
        assert cache.users() == ["alice"]  # loaded at start
        assert cache.authenticate("alice", "pw1") == "User:alice"
        with pytest.raises(AuthenticationFailedError):
            cache.authenticate("alice", "wrong")
        with pytest.raises(AuthenticationFailedError):
            cache.authenticate("bob", "pw2")

        store.add("bob", "pw2")
        assert wait_until(lambda: cache.authenticate("bob", "pw2"), 10, "bob reached the cache",
                          retry_on=(AuthenticationFailedError,)) == "User:bob"

        store.set_password("alice", "pw1b")
        wait_until(lambda: cache.authenticate("alice", "pw1b"), 10, "alice's new password reached the cache",
                   retry_on=(AuthenticationFailedError,))
        with pytest.raises(AuthenticationFailedError):
            cache.authenticate("alice", "pw1")

        store.remove("bob")

        wait_until(lambda: "bob" not in cache.users(), 10, "bob's removal reached the cache")
        with pytest.raises(AuthenticationFailedError):
            cache.authenticate("bob", "pw2")
        assert cache.users() == ["alice"]

        store.add("bob", "pw3")  # the same name again
        wait_until(lambda: cache.authenticate("bob", "pw3"), 10, "bob, added again, reached the cache",
                   retry_on=(AuthenticationFailedError,))
    finally:
        cache.stop()


def test_an_unreadable_user_record_cannot_log_in(zk_client):
    cache = UserCache(zk_client)
    try:
        zk_client.create(zkpaths.user("mallory"), b"not json")
        UserStore(zk_client, **CHEAP).add("carol", "pw")
        wait_until(lambda: cache.authenticate("carol", "pw"), 10, "carol reached the cache",
                   retry_on=(AuthenticationFailedError,))
        with pytest.raises(AuthenticationFailedError):
            cache.authenticate("mallory", "")
        assert "mallory" not in cache.users()
    finally:
        cache.stop()


def test_a_watched_directory_reads_no_zookeeper_per_lookup(zk_client):
    changes = []
    directory = WatchedDirectory(zk_client, "/w", changes.append)
    try:
        zk_client.create("/w/a", b"1")
        wait_until(lambda: directory.snapshot == {"a": b"1"}, 10, "the node's creation mirrored")
        zk_client.set("/w/a", b"2")
        wait_until(lambda: directory.snapshot == {"a": b"2"}, 10, "the node's change mirrored")
        zk_client.delete("/w/a")
        wait_until(lambda: directory.snapshot == {}, 10, "the node's removal mirrored")
        assert changes[-1] == {}
        zk_client.stop()  # no session: the mirror still answers
        assert directory.snapshot == {}
    finally:
        directory.stop()


# --- ACLs ----------------------------------------------------------------------------

T, DB, CLUSTER = Resource.table("db.t"), Resource.database("db"), Resource.cluster()


def test_acl_entries_are_added_listed_and_removed(zk_client):
    store = AclStore(zk_client)
    assert store.list() == {}
    assert store.add(T, "User:alice", Operation.READ) is True
    assert store.add(T, "User:alice", Operation.READ) is False  # already there
    assert store.add(T, "User:*", Operation.DESCRIBE) is True
    assert store.add(T, "User:alice", Operation.WRITE) is True  # a second operation of one principal
    assert store.remove(T, "User:alice", Operation.WRITE) is True
    assert store.add(CLUSTER, "User:ops", Operation.ALL) is True
    assert store.list() == {
        T: {AclEntry("User:alice", Operation.READ), AclEntry("User:*", Operation.DESCRIBE)},
        CLUSTER: {AclEntry("User:ops", Operation.ALL)},
    }
    assert zk_client.exists(zkpaths.acl("table", "db.t"))
    assert store.remove(T, "User:alice", Operation.WRITE) is False
    assert store.remove(T, "User:alice", Operation.READ) is True
    assert store.remove(T, "User:*", Operation.DESCRIBE) is True
    assert not zk_client.exists(zkpaths.acl("table", "db.t"))  # the last entry takes the node with it
    with pytest.raises(InvalidRequestError):
        store.add(T, "alice", Operation.READ)


def test_concurrent_adds_to_one_resource_both_land(zk_client, other_client):
    a, b = AclStore(zk_client), AclStore(other_client)
    a.add(DB, "User:a", Operation.READ)
    original_get = zk_client.get

    def racing_get(path, *args, **kwargs):  # b writes between a's read and a's write, once
        result = original_get(path, *args, **kwargs)
        if path == zkpaths.acl("database", "db") and not racing_get.done:
            racing_get.done = True
            b.add(DB, "User:b", Operation.WRITE)
        return result
    racing_get.done = False
    zk_client.get = racing_get
    try:
        assert a.add(DB, "User:c", Operation.DROP) is True
    finally:
        del zk_client.get
    assert AclStore(zk_client).get(DB) == {AclEntry("User:a", Operation.READ), AclEntry("User:b", Operation.WRITE),
                                           AclEntry("User:c", Operation.DROP)}


def test_the_acl_cache_follows_grants_and_revocations(zk_client, other_client):
    store = AclStore(other_client)
    store.add(T, "User:alice", Operation.READ)
    cache = AclCache(zk_client, super_users=["User:root"])
    try:
        cache.check("User:alice", Operation.READ, T)  # loaded at start
        cache.check("User:root", Operation.DROP, CLUSTER)
        with pytest.raises(AuthorizationFailedError, match="WRITE"):
            cache.check("User:alice", Operation.WRITE, T)

        store.add(DB, "User:alice", Operation.WRITE)  # a database grant covers the table
        wait_until(lambda: cache.authorizer.allowed("User:alice", Operation.WRITE, T), 10,
                   "the database grant reached the cache")
        cache.check("User:alice", Operation.WRITE, T)

        store.remove(T, "User:alice", Operation.READ)

        wait_until(lambda: not cache.authorizer.allowed("User:alice", Operation.READ, T), 10,
                   "the revoke reached the cache")
        with pytest.raises(AuthorizationFailedError, match="READ table db.t"):
            cache.check("User:alice", Operation.READ, T)
        cache.check("User:alice", Operation.DESCRIBE, T)  # still implied by the database WRITE

        store.add(CLUSTER, "User:*", Operation.READ)
        wait_until(lambda: cache.authorizer.allowed("User:bob", Operation.READ, Resource.table("x.y")), 10,
                   "the wildcard cluster grant reached the cache")
        cache.check("User:bob", Operation.READ, Resource.table("x.y"))
    finally:
        cache.stop()


def test_an_unreadable_acl_node_grants_nothing(zk_client):
    cache = AclCache(zk_client)
    try:
        zk_client.create(zkpaths.acl("table", "db.bad"), b'[{"principal":"User:x","operation":"FLY"}]')
        AclStore(zk_client).add(T, "User:x", Operation.READ)
        wait_until(lambda: cache.authorizer.allowed("User:x", Operation.READ, T), 10, "the grant reached the cache")
        cache.check("User:x", Operation.READ, T)
        with pytest.raises(AuthorizationFailedError):
            cache.check("User:x", Operation.DESCRIBE, Resource.table("db.bad"))
    finally:
        cache.stop()
