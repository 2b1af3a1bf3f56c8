"""The coordinator's SecurityService: users and ACLs administered over gRPC, so that changing them is authorized.

Only the active coordinator serves it; a standby answers ``NOT_COORDINATOR``
with the active address, as :class:`kvlease.coordinator.service.CoordinatorService`
does, so the admin client's failover works unchanged. Users and ACLs are not
the coordinator's state: a handler writes ZooKeeper through the stores (one
node per write; ACL nodes compare-and-set) and every process's caches pick
the change up by their watches. Nothing goes through the event loop.

Who may (security on; with security off everyone may, so that users and ACLs
can be prepared before it is turned on):

- users (add, remove, list): ``ALTER`` on the cluster; adding or removing a
  super user (``security.super-users``) also needs the caller to be one;
- adding or removing an ACL entry: ``ALTER`` on its resource (``ALTER`` on the
  table's database or on the cluster covers a table);
- listing ACLs: a caller sees the entries of the resources it may ``ALTER``
  (those it administers) and the entries that name itself or ``User:*`` (what
  it may do), nothing else. A filter naming a resource the caller may not even
  ``DESCRIBE`` is ``AUTHORIZATION_FAILED``.

Every call is safe to resend after a lost answer: AddUser of an existing user
with the same password answers ``created=false`` (the stored record is
verified), with another password ``USER_ALREADY_EXISTS``; RemoveUser of a
missing user answers ``removed=false``; AddAcl and RemoveAcl answer false when
nothing changed. Passwords are never logged nor put in an error message.
"""

from __future__ import annotations

import logging
from typing import Callable

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

from kvlease.common import errors
from kvlease.common.proto import security_pb2 as pb
from kvlease.common.proto import security_pb2_grpc as pb_grpc
from kvlease.common.security.acl import WILDCARD_PRINCIPAL, AclBinding, Operation, Resource
from kvlease.common.security.acl_store import AclStore
from kvlease.common.security.authn import check_user_name
from kvlease.common.security.passwords import verify
from kvlease.common.security.server import OPEN
from kvlease.common.security.users import UserStore
from kvlease.common.security.wire import binding_from_pb, binding_to_pb, resource_of
from kvlease.common.wire import error_pb

log = logging.getLogger(__name__)

#: ZooKeeper failures after which a write may or may not have happened (the client resends: every call is retry-safe).
_UNCERTAIN = (ConnectionLoss, SessionExpiredError, OperationTimeoutError)


class SecurityService(pb_grpc.SecurityServiceServicer):
    def __init__(self, server, security=OPEN, internal_user: str = "") -> None:
        self.server = server  # coordinator.server.CoordinatorServer: serving_loop() and zk
        self.security = security  # common.security.server: OPEN or ServerSecurity
        self.internal_user = internal_user  # the cluster's own principal's name: never a ZooKeeper user
        self._users: UserStore | None = None
        self._acls: AclStore | None = None

    @property
    def users(self) -> UserStore:
        if self._users is None:  # the server's ZooKeeper client exists only once it started
            self._users = UserStore(self.server.zk)
        return self._users

    @property
    def acls(self) -> AclStore:
        if self._acls is None:
            self._acls = AclStore(self.server.zk)
        return self._acls

    def _answer(self, method: str, response_cls, run: Callable[[], dict]):
        """``run()`` on the active coordinator gives the response's fields; every error is answered in band."""
        try:
            self.server.serving_loop()  # NOT_COORDINATOR (with the active address) on a standby
            return response_cls(**run())
        except errors.KvLeaseError as exc:
            return response_cls(error=error_pb(exc))
        except _UNCERTAIN as exc:
            return response_cls(error=error_pb(errors.OutcomeUnknownError(
                f"{method}: ZooKeeper did not answer ({type(exc).__name__}); it may or may not have been applied")))
        except Exception as exc:  # a bug: answer it, do not kill the call (the request is not logged: a password)
            log.exception("%s failed", method)
            return response_cls(error=error_pb(errors.UnknownServerError(
                f"internal error in {method}: {type(exc).__name__}")))

    def _caller(self) -> str:
        return self.security.principal() or "<anonymous>"

    # -- users ---------------------------------------------------------------------------

    def _user_name(self, name: str) -> str:
        check_user_name(name)
        if name == self.internal_user:
            raise errors.InvalidRequestError(f"user name {name!r} is the cluster's own principal "
                                             "(security.internal.username): it is not a ZooKeeper user", user=name)
        return name

    def AddUser(self, request, context):
        def run():
            name = self._user_name(request.name)
            if not request.password:
                raise errors.InvalidRequestError("a password must not be empty", user=name)
            if any(c < " " or c == "\x7f" for c in request.password):
                raise errors.InvalidRequestError("a password must not contain control characters (a newline, a "
                                                 "tab, …): a password file or --password-stdin gives one line",
                                                 user=name)
            self.security.check(Operation.ALTER, Resource.cluster())
            self.security.check_may_manage_user(name)
            created = self._add_user(name, request.password)
            self.security.await_user(name)  # it can log in here once this call returns
            if created:
                log.info("user %s added by %s", name, self._caller())
            return {"created": created}
        return self._answer("AddUser", pb.AddUserResponse, run)

    def _add_user(self, name: str, password: str) -> bool:
        for _attempt in range(3):  # the user may be removed between our create and our read
            try:
                self.users.add(name, password)
                return True
            except errors.AlreadyExistsError:
                record = self.users.record(name)
            if record is None:
                continue
            if verify(record, password):
                return False  # a resent request: it is there as asked
            raise errors.UserAlreadyExistsError(
                f"user {name!r} already exists (with another password); remove it first to change its password",
                user=name)
        raise errors.OutcomeUnknownError(f"user {name!r} kept changing while it was added; try again", user=name)

    def RemoveUser(self, request, context):
        def run():
            name = self._user_name(request.name)
            self.security.check(Operation.ALTER, Resource.cluster())
            self.security.check_may_manage_user(name)
            try:
                self.users.remove(name)
            except errors.NotFoundError:
                return {"removed": False}
            self.security.await_user(name, present=False)  # refused here once this call returns
            log.info("user %s removed by %s", name, self._caller())
            return {"removed": True}
        return self._answer("RemoveUser", pb.RemoveUserResponse, run)

    def ListUsers(self, request, context):
        def run():
            self.security.check(Operation.ALTER, Resource.cluster())
            return {"names": self.users.list()}
        return self._answer("ListUsers", pb.ListUsersResponse, run)

    # -- ACLs ----------------------------------------------------------------------------

    def AddAcl(self, request, context):
        def run():
            acl = binding_from_pb(request.entry)
            self.security.check(Operation.ALTER, acl.resource)
            added = self.acls.add(acl.resource, acl.principal, acl.operation)
            if added:
                log.info("ACL added on %s: %s %s (by %s)", acl.resource, acl.principal, acl.operation.value,
                         self._caller())
            return {"added": added}
        return self._answer("AddAcl", pb.AddAclResponse, run)

    def RemoveAcl(self, request, context):
        def run():
            acl = binding_from_pb(request.entry)
            self.security.check(Operation.ALTER, acl.resource)
            removed = self.acls.remove(acl.resource, acl.principal, acl.operation)
            if removed:
                log.info("ACL removed on %s: %s %s (by %s)", acl.resource, acl.principal, acl.operation.value,
                         self._caller())
            return {"removed": removed}
        return self._answer("RemoveAcl", pb.RemoveAclResponse, run)

    def ListAcls(self, request, context):
        def run():
            if request.resource_type:
                resource = resource_of(request.resource_type, request.resource_name)
                self.security.check(Operation.DESCRIBE, resource)
                found = {resource: self.acls.get(resource)}
            else:
                found = self.acls.list()
            caller = self.security.principal()
            visible = []
            for resource, entries in found.items():
                administers = self.security.allowed(Operation.ALTER, resource)
                visible.extend(AclBinding(resource, entry.principal, entry.operation) for entry in entries
                               if administers or entry.principal in (caller, WILDCARD_PRINCIPAL))
            return {"entries": [binding_to_pb(binding) for binding in sorted(visible)]}
        return self._answer("ListAcls", pb.ListAclsResponse, run)
