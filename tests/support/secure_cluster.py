"""A LocalCluster with security on, for the security tests.

TLS on every port (optionally mutual), the cluster's own principal
(``User:kvlease`` with a password from config), one super user ``admin``;
users and ACLs are written straight into ZooKeeper through the stores (cheap
scrypt parameters, so adding users is fast), and clients are made for any
user. Use as a context manager or call ``close``.
"""

from __future__ import annotations

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.common.config import Config
from kvlease.common.security.acl import Operation, Resource
from kvlease.common.security.acl_store import AclStore
from kvlease.common.security.users import UserStore
from kvlease.common.zk import make_client
from kvlease.ops.local_cluster import certs, client_settings, server_settings
from kvlease.ops.wait import wait_until
from tests.support.local_cluster import LocalCluster

INTERNAL_PASSWORD = "cluster-secret"
ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"
CHEAP_HASH = {"n": 2 ** 4, "r": 8, "p": 1}  # scrypt parameters for test users: verifying costs microseconds
ACL_WAIT_S = 10.0  # the ACL caches follow ZooKeeper watches: a grant or revoke lands within this
#: ``wait_until(call, ACL_WAIT_S, what, retry_on=NOT_YET_GRANTED)``: a call is refused until a grant reaches the
#: servers' caches (by a watch)
NOT_YET_GRANTED = (errors.AuthorizationFailedError,)


class SecureCluster:
    def __init__(self, make_config, tmp_path, tablets: int = 1, *, client_auth: bool = False,
                 overrides: dict | None = None) -> None:
        self.paths = certs.generate(tmp_path / "certs")
        self.client_auth = client_auth
        self.settings = {**server_settings(self.paths, INTERNAL_PASSWORD, client_auth=client_auth,
                                           super_users=f"User:{ADMIN}"), **(overrides or {})}
        self.make_config = make_config
        self.zk = make_client(make_config(self.settings))
        self.users = UserStore(self.zk, **CHEAP_HASH)
        self.acls = AclStore(self.zk)
        self.users.add(ADMIN, ADMIN_PASSWORD)
        self._admins: list[AdminClient] = []
        try:
            self.cluster = LocalCluster(lambda o=None, /, **more: make_config({**self.settings, **(o or {})}, **more),
                                        tmp_path, tablets, client_config=self.client_config(ADMIN, ADMIN_PASSWORD))
        except BaseException:
            self.zk.stop()
            self.zk.close()
            raise

    @property
    def admin(self) -> AdminClient:
        """The super user's admin client."""
        return self.cluster.admin

    def client_config(self, user: str | None = None, password: str | None = None, *, tls: bool = True,
                      certificate: bool | None = None) -> Config:
        """A client's Config: TLS (with the client certificate under mutual TLS, or when ``certificate``)
        and ``user``/``password`` if given. ``tls=False``: a plaintext client."""
        settings: dict = {"client.retry.total-timeout": "2s"}
        if tls:
            settings.update(client_settings(self.paths, user, password or "",
                                            certificate=certificate if certificate is not None else self.client_auth))
        return Config(settings, env={})

    def admin_as(self, user: str | None, password: str | None = None, **kwargs) -> AdminClient:
        """An admin client of ``user`` (closed with the cluster)."""
        admin = AdminClient([self.cluster.coordinator.address], self.client_config(user, password, **kwargs),
                            retry_total_s=2)
        self._admins.append(admin)
        return admin

    def add_user(self, name: str, password: str) -> None:
        """Add the user in ZooKeeper and wait until every server's user cache (a watch away) knows it."""
        self.users.add(name, password)
        self._until_servers(lambda security: security.await_user(name, timeout_s=0), f"user {name} known")

    def grant(self, principal: str, operation: str, resource: Resource | str, *, wait: bool = True) -> None:
        """``grant("User:bob", "READ", "db.t")``: a table path, a database name, or a Resource. ``wait``: until
        every server's ACL cache (kept by a ZooKeeper watch) allows it."""
        resource, operation = _resource(resource), Operation.parse(operation)
        self.acls.add(resource, principal, operation)
        if wait:
            self._until_servers(lambda security: security.allowed(operation, resource, principal), "granted")

    def revoke(self, principal: str, operation: str, resource: Resource | str, *, wait: bool = True) -> None:
        resource, operation = _resource(resource), Operation.parse(operation)
        self.acls.remove(resource, principal, operation)
        if wait:
            self._until_servers(lambda security: not security.allowed(operation, resource, principal), "revoked")

    def _until_servers(self, predicate, what: str) -> None:
        servers = [self.cluster.coordinator, *self.cluster.tablets.values()]
        wait_until(lambda: all(predicate(server.security) for server in servers), ACL_WAIT_S, f"{what} on every server")

    def close(self) -> None:
        for admin in self._admins:
            admin.close()
        self.cluster.close()
        self.zk.stop()
        self.zk.close()

    def __enter__(self) -> "SecureCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _resource(resource: Resource | str) -> Resource:
    if isinstance(resource, Resource):
        return resource
    if resource == "cluster":
        return Resource.cluster()
    return Resource.table(resource) if "." in resource else Resource.database(resource)
