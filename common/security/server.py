"""One server process's security: who is calling (authentication) and what they may do (authorization).

:func:`server_security` gives :data:`OPEN` when ``security.enabled`` is false
(every check passes, no interceptor, no ZooKeeper watch) and a
:class:`ServerSecurity` otherwise. Services call ``check`` / ``allowed`` with
the operation and resource of each request; the caller is the call's
principal (:func:`~kvlease.common.security.grpc_auth.current_principal`), so a check
is a few dictionary reads: users and ACLs are mirrored from ZooKeeper by
watches (:class:`~kvlease.common.security.users.UserCache`,
:class:`~kvlease.common.security.acl_store.AclCache`), never read per request.

The cluster's own principal (``security.internal.username``) authenticates
with ``security.internal.password`` from config (not a ZooKeeper user: it
cannot be removed or re-passworded by an admin), or under mutual TLS with a
certificate whose common name is that user. It alone may make internal calls,
and it is a super user.
"""

from __future__ import annotations

import hmac
import time
from typing import Iterable

from kazoo.client import KazooClient

from kvlease.common import config as cfg
from kvlease.common.errors import AuthenticationFailedError, AuthorizationFailedError
from kvlease.common.security.acl import Authorizer, Operation, Resource, check_principal
from kvlease.common.security.acl_store import AclCache
from kvlease.common.security.authn import check_user_name, principal_of
from kvlease.common.security.grpc_auth import AuthenticatingInterceptor, current_principal
from kvlease.common.security.users import UserCache


def super_users(config: cfg.Config) -> tuple[str, ...]:
    """``security.super-users`` as principals (a bare user name means ``User:<name>``); ConfigError if malformed."""
    found = []
    for item in (part.strip() for part in config[cfg.SUPER_USERS].split(",")):
        if not item:
            continue
        principal = item if ":" in item else principal_of(item)
        try:
            found.append(check_principal(principal, wildcard=False))
        except Exception as exc:  # InvalidRequestError: say which key
            raise cfg.ConfigError(f"config key {cfg.SUPER_USERS.name!r}: {exc}", key=cfg.SUPER_USERS.name) from None
    return tuple(found)


class OpenSecurity:
    """Security off: everyone may do everything."""

    enabled = False

    def interceptors(self, internal_methods: Iterable[str] = ()) -> list:
        return []

    def start(self, zk: KazooClient) -> None:
        pass

    def stop(self) -> None:
        pass

    def principal(self) -> str | None:
        return None

    def await_user(self, name: str, present: bool = True, timeout_s: float = 5.0) -> bool:
        return True

    def allowed(self, operation: Operation, resource: Resource, principal: str | None = None) -> bool:
        return True

    def check(self, operation: Operation, resource: Resource, principal: str | None = None) -> None:
        pass

    def check_may_manage_user(self, name: str) -> None:
        pass


OPEN = OpenSecurity()


class ServerSecurity:
    """Security on: authenticate every call, authorize every operation (see the module doc)."""

    enabled = True

    def __init__(self, config: cfg.Config) -> None:
        self.internal_user = check_user_name(config[cfg.INTERNAL_USERNAME])
        self.internal_principal = principal_of(self.internal_user)
        self._internal_password = config[cfg.INTERNAL_PASSWORD].encode()
        self._certificates = bool(config[cfg.TLS_CLIENT_AUTH])
        if not self._internal_password and not self._certificates:
            raise cfg.ConfigError(
                f"security.enabled is true but config key {cfg.INTERNAL_PASSWORD.name!r} is not set (env "
                f"{cfg.INTERNAL_PASSWORD.env_var}): the cluster's processes cannot authenticate to each other "
                "(set it, the same everywhere, or use mutual TLS)", key=cfg.INTERNAL_PASSWORD.name)
        self._super_users = super_users(config) + (self.internal_principal,)
        self._users: UserCache | None = None
        self._acls: AclCache | None = None

    def start(self, zk: KazooClient) -> None:
        """Mirror users and ACLs from ZooKeeper (before the gRPC server starts serving)."""
        self._users = UserCache(zk)
        self._acls = AclCache(zk, self._super_users)

    def stop(self) -> None:
        for cache in (self._users, self._acls):
            if cache is not None:
                cache.stop()

    # -- authentication ------------------------------------------------------------------

    def interceptors(self, internal_methods: Iterable[str] = ()) -> list:
        """The gRPC server interceptors: authenticate every call; ``internal_methods`` only for the cluster."""
        return [AuthenticatingInterceptor(self.authenticate, internal=internal_methods,
                                          is_internal=self.is_internal)]

    def is_internal(self, principal: str | None) -> bool:
        return principal == self.internal_principal

    def authenticate(self, user: str | None, password: str | None, certificate_name: str | None = None) -> str:
        """The caller's principal; AuthenticationFailedError for a wrong password, an unknown user or none at all."""
        if user == self.internal_user:
            if self._internal_password and password is not None and hmac.compare_digest(
                    password.encode(), self._internal_password):
                return self.internal_principal
            raise AuthenticationFailedError(f"authentication failed for user {user!r}", user=user)
        if user:
            if self._users is None:
                raise AuthenticationFailedError("authentication is not ready yet")
            return self._users.authenticate(user, password)
        if certificate_name and self._certificates:
            return principal_of(certificate_name)
        raise AuthenticationFailedError("authentication failed: the call carries no username/password"
                                        + ("" if self._certificates else " (set security.username and "
                                                                          "security.password, or --user)"))

    def await_user(self, name: str, present: bool = True, timeout_s: float = 5.0) -> bool:
        """Wait (bounded) until this process's user cache has (or no longer has) ``name``: a user added
        through this server can log in here as soon as the call that added it returns."""
        deadline = time.monotonic() + timeout_s
        while (self._users is not None and (name in self._users.users()) != present
               and time.monotonic() < deadline):
            time.sleep(0.01)
        return self._users is None or (name in self._users.users()) == present

    # -- authorization -------------------------------------------------------------------

    def principal(self) -> str | None:
        return current_principal()

    @property
    def authorizer(self) -> Authorizer:
        return self._acls.authorizer if self._acls is not None else Authorizer({}, self._super_users)

    def allowed(self, operation: Operation, resource: Resource, principal: str | None = None) -> bool:
        principal = principal or current_principal()
        return principal is not None and self.authorizer.allowed(principal, operation, resource)

    def check(self, operation: Operation, resource: Resource, principal: str | None = None) -> None:
        """None if the caller (or ``principal``) may; else AuthorizationFailedError naming operation and resource."""
        self.authorizer.check(principal or current_principal() or "<unauthenticated>", operation, resource)

    def check_may_manage_user(self, name: str) -> None:
        """Only a super user may add or remove a super user: else ``ALTER`` on the cluster would let a user
        remove the operator's account, create it again with a password of its own and log in as it."""
        caller = current_principal() or "<unauthenticated>"
        if principal_of(name) in self._super_users and caller not in self._super_users:
            raise AuthorizationFailedError(
                f"{caller} may not add or remove user {name!r}: it is a super user (security.super-users), "
                f"and only a super user may", principal=caller, user=name)


def server_security(config: cfg.Config) -> OpenSecurity | ServerSecurity:
    return ServerSecurity(config) if config[cfg.SECURITY_ENABLED] else OPEN
