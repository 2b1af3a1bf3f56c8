"""The security part of the admin client: users and ACLs, through the active coordinator's SecurityService.

:class:`SecurityAdmin` calls the SecurityService (with security on, each call
needs ALTER on the cluster or resource). It is built on a coordinator call
(:meth:`kvlease.client.coordinator_caller.CoordinatorCaller.call`: the active
coordinator, retries, errors), told whether that caller uses TLS and which
addresses it was given; :class:`kvlease.client.admin.AdminClient` owns one and
delegates ``add_user`` … ``list_acls`` to it.
"""

from __future__ import annotations

from typing import Sequence

from kvlease.common import errors
from kvlease.common.proto import security_pb2 as security_pb
from kvlease.common.proto import security_pb2_grpc as security_pb_grpc
from kvlease.common.security.acl import AclBinding, Operation, Resource
from kvlease.common.security.wire import binding_from_pb, binding_to_pb, resource_fields
from kvlease.client.bootstrap import is_loopback
from kvlease.client.coordinator_caller import CoordinatorCall


class SecurityAdmin:
    """Users and ACLs; a part of :class:`kvlease.client.admin.AdminClient` (``admin.add_user(...)``)."""

    def __init__(self, call: CoordinatorCall, *, tls: bool, bootstrap: Sequence[str]) -> None:
        """``call``: sends a coordinator call; ``tls``: whether it travels over TLS; ``bootstrap``: the
        coordinator addresses it was given (a password is sent without TLS only to loopback addresses)."""
        self._call = call
        self._tls = tls
        self._bootstrap = list(bootstrap)

    def _security(self, method: str, request):
        return self._call(method, request, security_pb_grpc.SecurityServiceStub)

    def add_user(self, name: str, password: str) -> bool:
        """Add a user; False if it exists already with this password (a resent call).
        UserAlreadyExistsError if it exists with another one. Without TLS the password would travel in
        the clear: refused (InvalidRequestError) unless every bootstrap address is this machine's loopback
        (users prepared on a plaintext local cluster before security is turned on)."""
        if not self._tls and not all(is_loopback(address) for address in self._bootstrap):
            raise errors.InvalidRequestError(
                f"user {errors.show(name)}: a password is only sent over TLS, and {', '.join(self._bootstrap)} is reached "
                "without it: add users over TLS (security.tls.* / --ca-file), or from the coordinator's machine "
                "through its loopback address", user=name)
        return self._security("AddUser", security_pb.AddUserRequest(name=name, password=password)).created

    def remove_user(self, name: str) -> bool:
        """Remove a user; False if there was none."""
        return self._security("RemoveUser", security_pb.RemoveUserRequest(name=name)).removed

    def list_users(self) -> list[str]:
        """The user names (never their passwords)."""
        return list(self._security("ListUsers", security_pb.ListUsersRequest()).names)

    def add_acl(self, resource: Resource, principal: str, operation: Operation | str) -> bool:
        """Grant ``principal`` (``User:bob``, ``User:*``) ``operation`` on ``resource``; False if it had it."""
        entry = binding_to_pb(AclBinding(resource, principal, Operation.parse(operation)))
        return self._security("AddAcl", security_pb.AddAclRequest(entry=entry)).added

    def remove_acl(self, resource: Resource, principal: str, operation: Operation | str) -> bool:
        """Revoke the entry; False if there was no such entry."""
        entry = binding_to_pb(AclBinding(resource, principal, Operation.parse(operation)))
        return self._security("RemoveAcl", security_pb.RemoveAclRequest(entry=entry)).removed

    def list_acls(self, resource: Resource | None = None) -> list[AclBinding]:
        """The entries this caller may see (of ``resource`` only, if given): those of the resources it
        may ALTER, and those naming itself or ``User:*``."""
        request = security_pb.ListAclsRequest(**(resource_fields(resource) if resource is not None else {}))
        return [binding_from_pb(entry) for entry in self._security("ListAcls", request).entries]
