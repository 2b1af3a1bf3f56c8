"""Who may do what to the tables this tablet server leads: one check per call, before it acts.

:class:`TableAccess` checks the caller (the call's principal) against the
table of a request's physical table (its ``table_id``'s, or its
``partition_id``'s: a partition's ACLs are its table's) with the server's security
(:mod:`kvlease.common.security.server`): WRITE for PutKv and TriggerSnapshot, READ
for Lookup, FetchLog, ListOffsets and scans. The table is the one the server
already holds for the id (:meth:`kvlease.tablet.replicas.manager.ReplicaManager.table`, no
ZooKeeper read); ACLs come from the security's watched cache.

A physical table this server holds no bucket of is not checked: the handler then
answers what it answers anyone (``NOT_LEADER``, ``TABLE_NOT_EXIST``) and acts
on nothing, since a bucket's table is known before the bucket serves a call
and forgotten only after it stopped. With security off (:data:`OPEN`) a
check is one attribute read.
"""

from __future__ import annotations

import functools

from kvlease.common.security.acl import Operation, Resource
from kvlease.common.security.server import OPEN
from kvlease.tablet.replicas.manager import ReplicaManager

READ, WRITE = Operation.READ, Operation.WRITE


@functools.lru_cache(maxsize=4096)
def table_resource(path: str) -> Resource:
    return Resource.table(path)


class TableAccess:
    def __init__(self, replicas: ReplicaManager, security=OPEN) -> None:
        self.replicas = replicas
        self.security = security  # common.security.server: OPEN or ServerSecurity
        self.enabled = security.enabled

    def principal(self) -> str | None:
        """The caller's principal (None with security off)."""
        return self.security.principal() if self.enabled else None

    def resource(self, physical_id: int) -> Resource | None:
        """The table of the physical table ``physical_id`` (a table's or a partition's id) as an ACL resource;
        None if no bucket of it is held here."""
        table = self.replicas.table(physical_id)
        return None if table is None else table_resource(table.path)

    def check(self, operation: Operation, physical_id: int) -> None:
        """AuthorizationFailedError (naming operation and table) unless the caller may; see the module doc."""
        if not self.enabled:
            return
        resource = self.resource(physical_id)
        if resource is not None:
            self.security.check(operation, resource)
