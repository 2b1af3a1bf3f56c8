"""The user store (``/security/users/{name}`` holds the user's password-hash record) and its watched cache."""

from __future__ import annotations

import json
import logging

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from kvlease.common import zkpaths
from kvlease.common.errors import AlreadyExistsError, NotFoundError
from kvlease.common.security.authn import Authenticator, check_user_name
from kvlease.common.security.passwords import PasswordHash, hash_password
from kvlease.common.security.watched import WatchedDirectory

log = logging.getLogger(__name__)


class UserStore:
    """Add, remove, list users and change passwords in ZooKeeper (each a single write)."""

    def __init__(self, zk: KazooClient, **hash_params: int) -> None:
        self._zk = zk
        self._hash_params = hash_params  # scrypt n/r/p overrides (tests use cheap ones)
        zk.ensure_path(zkpaths.USERS)

    def _record(self, password: str) -> bytes:
        return json.dumps(hash_password(password, **self._hash_params).to_json()).encode()

    def add(self, name: str, password: str) -> None:
        check_user_name(name)
        try:
            self._zk.create(zkpaths.user(name), self._record(password))
        except NodeExistsError:
            raise AlreadyExistsError(f"user {name!r} already exists", user=name) from None

    def set_password(self, name: str, password: str) -> None:
        check_user_name(name)
        try:
            self._zk.set(zkpaths.user(name), self._record(password))
        except NoNodeError:
            raise NotFoundError(f"user {name!r} does not exist", user=name) from None

    def remove(self, name: str) -> None:
        check_user_name(name)
        try:
            self._zk.delete(zkpaths.user(name))
        except NoNodeError:
            raise NotFoundError(f"user {name!r} does not exist", user=name) from None

    def list(self) -> list[str]:
        return sorted(self._zk.get_children(zkpaths.USERS))

    def record(self, name: str) -> PasswordHash | None:
        """The user's stored password record; None if there is no such user (or it is unreadable)."""
        check_user_name(name)
        try:
            data, _ = self._zk.get(zkpaths.user(name))
        except NoNodeError:
            return None
        return parse_record(data)


def parse_record(data: bytes) -> PasswordHash | None:
    """A user node's record; None (logged) if it is unreadable, so that user cannot log in."""
    try:
        return PasswordHash.from_json(json.loads(data.decode()))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        log.warning("unreadable password record (the user cannot authenticate): %s", exc)
        return None


class UserCache:
    """Every user's record, mirrored from ZooKeeper by watches; :meth:`authenticate` does no ZooKeeper read."""

    def __init__(self, zk: KazooClient) -> None:
        self._records: dict[str, PasswordHash] = {}
        self._authenticator = Authenticator(lambda name: self._records.get(name))
        self._dir = WatchedDirectory(zk, zkpaths.USERS, self._changed)
        self._changed(self._dir.snapshot)

    def _changed(self, snapshot) -> None:
        records = {name: record for name, data in snapshot.items() if (record := parse_record(data)) is not None}
        self._records = records  # one reference swap; readers see the old or the new dict

    def users(self) -> list[str]:
        return sorted(self._records)

    def authenticate(self, user: str | None, password: str | None) -> str:
        """The principal (``User:alice``) or AuthenticationFailedError."""
        return self._authenticator.authenticate(user, password)

    def stop(self) -> None:
        self._dir.stop()
