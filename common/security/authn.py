"""Authentication: credentials -> principal, against a user lookup. Pure (the lookup is passed in).

A scrypt check costs tens of milliseconds, and every gRPC call carries the
credentials, so a successful check is remembered: per user, a keyed digest
(HMAC with a per-process random key) of the password that matched *that*
record. A changed or removed user's record no longer matches, so the memo
cannot outlive a password change. A failed check is never remembered.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
from typing import Callable

from kvlease.common.errors import AuthenticationFailedError, InvalidRequestError, show
from kvlease.common.security.passwords import PasswordHash, hash_password, verify

#: A user name; always used with fullmatch (``$`` would also match before a final newline).
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]{0,127}")
USER_PREFIX = "User:"


def check_user_name(name: str) -> str:
    """``name`` if it is a valid user name, else InvalidRequestError."""
    if not isinstance(name, str) or not USER_NAME.fullmatch(name):
        raise InvalidRequestError(f"invalid user name {show(name)}: letters, digits, _ . @ -, starting with a letter or _,"
                                  f" at most 128", user=str(name))
    return name


def principal_of(user: str) -> str:
    """The principal of a user: ``User:alice``."""
    return USER_PREFIX + user


class Authenticator:
    """``authenticate(user, password) -> principal``; ``lookup(user)`` gives the user's record or None."""

    def __init__(self, lookup: Callable[[str], PasswordHash | None], *, key: bytes | None = None) -> None:
        self._lookup = lookup
        self._key = os.urandom(32) if key is None else key
        self._memo: dict[str, tuple[PasswordHash, bytes]] = {}
        self._lock = threading.Lock()
        # Unknown users cost one scrypt too, so timing does not say which names exist.
        self._dummy = hash_password("not a password", salt=b"\0" * 16)

    def authenticate(self, user: str | None, password: str | None) -> str:
        if not user or password is None:
            raise AuthenticationFailedError("authentication failed: the call carries no username/password")
        record = self._lookup(user) if USER_NAME.fullmatch(user) else None
        if record is None:
            verify(self._dummy, password)
            raise AuthenticationFailedError(f"authentication failed for user {show(user)}", user=user)
        keyed = hmac.new(self._key, password.encode(), hashlib.sha256).digest()
        with self._lock:
            memo = self._memo.get(user)
        if memo is not None and memo[0] == record and hmac.compare_digest(memo[1], keyed):
            return principal_of(user)
        if not verify(record, password):
            raise AuthenticationFailedError(f"authentication failed for user {show(user)}", user=user)
        with self._lock:
            self._memo[user] = (record, keyed)
        return principal_of(user)
