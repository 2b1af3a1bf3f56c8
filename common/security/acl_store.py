"""The ACL store (``/security/acls/{type}/{name}`` holds a JSON list of entries) and its watched cache.

Writes are compare-and-set on the node's version (retried on a concurrent
change), so two admins adding entries to one resource both land.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from kvlease.common import zkpaths
from kvlease.common.errors import InvalidRequestError
from kvlease.common.security.acl import AclEntry, Authorizer, Operation, Resource, ResourceType
from kvlease.common.security.watched import WatchedDirectory

log = logging.getLogger(__name__)


def encode(entries: Iterable[AclEntry]) -> bytes:
    return json.dumps([entry.to_json() for entry in sorted(set(entries))], separators=(",", ":")).encode()


def decode(data: bytes) -> frozenset[AclEntry]:
    return frozenset(AclEntry.from_json(item) for item in json.loads(data.decode() or "[]"))


class AclStore:
    def __init__(self, zk: KazooClient) -> None:
        self._zk = zk
        for kind in ResourceType:
            zk.ensure_path(zkpaths.acl_type(kind.value))

    def get(self, resource: Resource) -> frozenset[AclEntry]:
        try:
            data, _ = self._zk.get(zkpaths.acl(resource.type.value, resource.name))
        except NoNodeError:
            return frozenset()
        return decode(data)

    def list(self) -> dict[Resource, frozenset[AclEntry]]:
        found = {}
        for kind in ResourceType:
            for name in self._zk.get_children(zkpaths.acl_type(kind.value)):
                entries = self.get(Resource(kind, name))
                if entries:
                    found[Resource(kind, name)] = entries
        return found

    def add(self, resource: Resource, principal: str, operation: Operation) -> bool:
        """Grant; False if the entry was already there."""
        entry = AclEntry(principal, operation)
        return self._update(resource, lambda entries: entries | {entry})

    def remove(self, resource: Resource, principal: str, operation: Operation) -> bool:
        """Revoke; False if there was no such entry. A resource's last entry removes its node."""
        entry = AclEntry(principal, operation)
        return self._update(resource, lambda entries: entries - {entry})

    def _update(self, resource: Resource, change) -> bool:
        path = zkpaths.acl(resource.type.value, resource.name)
        while True:
            try:
                data, stat = self._zk.get(path)
            except NoNodeError:
                entries, version = frozenset(), None
            else:
                entries, version = decode(data), stat.version
            new = change(entries)
            if new == entries:
                return False
            try:
                if version is None:
                    self._zk.create(path, encode(new))
                elif new:
                    self._zk.set(path, encode(new), version=version)
                else:
                    self._zk.delete(path, version=version)
                return True
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # changed under us: read again


class AclCache:
    """Every ACL, mirrored from ZooKeeper by watches; ``check`` reads only memory.

    Each change builds a new :class:`Authorizer` (pure) and swaps it in.
    """

    def __init__(self, zk: KazooClient, super_users: Iterable[str] = ()) -> None:
        self._super_users = tuple(super_users)
        self._lock = threading.Lock()
        self._by_type: dict[ResourceType, dict[str, bytes]] = {kind: {} for kind in ResourceType}
        self.authorizer = Authorizer({}, self._super_users)
        self._dirs = [WatchedDirectory(zk, zkpaths.acl_type(kind.value), self._changed_for(kind))
                      for kind in ResourceType]
        for kind, directory in zip(ResourceType, self._dirs):
            self._changed_for(kind)(directory.snapshot)

    def _changed_for(self, kind: ResourceType):
        def changed(snapshot) -> None:
            with self._lock:
                self._by_type[kind] = dict(snapshot)
                acls = {}
                for rtype, nodes in self._by_type.items():
                    for name, data in nodes.items():
                        try:
                            acls[Resource(rtype, name)] = decode(data)
                        except (ValueError, KeyError, TypeError, InvalidRequestError) as exc:
                            log.warning("unreadable ACL node %s/%s ignored (grants nothing): %s",
                                        rtype.value, name, exc)
                self.authorizer = Authorizer(acls, self._super_users)
        return changed

    def check(self, principal: str, operation: Operation, resource: Resource) -> None:
        self.authorizer.check(principal, operation, resource)

    def stop(self) -> None:
        for directory in self._dirs:
            directory.stop()
