"""Salted password hashes: a self-describing record (algorithm, parameters, salt, hash) and a constant-time check.

Pure: no ZooKeeper, no clock. The salt comes from ``os.urandom`` unless a test
passes one. The record is what a user's ZooKeeper node holds (as JSON).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

ALGORITHM = "scrypt"
#: scrypt cost parameters for new hashes (RFC 7914's interactive-login values); stored with each hash.
DEFAULT_N, DEFAULT_R, DEFAULT_P = 2 ** 14, 8, 1
SALT_BYTES = 16
HASH_BYTES = 32


@dataclass(frozen=True)
class PasswordHash:
    """One stored password: verify a candidate with :func:`verify`."""

    salt: bytes
    digest: bytes
    n: int = DEFAULT_N
    r: int = DEFAULT_R
    p: int = DEFAULT_P
    algorithm: str = ALGORITHM

    def to_json(self) -> dict:
        return {"algorithm": self.algorithm, "n": self.n, "r": self.r, "p": self.p,
                "salt": base64.b64encode(self.salt).decode(), "hash": base64.b64encode(self.digest).decode()}

    @classmethod
    def from_json(cls, data: dict) -> "PasswordHash":
        if data.get("algorithm") != ALGORITHM:
            raise ValueError(f"unknown password-hash algorithm {data.get('algorithm')!r}")
        return cls(salt=base64.b64decode(data["salt"]), digest=base64.b64decode(data["hash"]),
                   n=int(data["n"]), r=int(data["r"]), p=int(data["p"]))


def _derive(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024 * 1024, dklen=length)


def hash_password(password: str, *, salt: bytes | None = None, n: int = DEFAULT_N, r: int = DEFAULT_R,
                  p: int = DEFAULT_P) -> PasswordHash:
    """A new record for ``password`` with a random salt (or ``salt``) and these scrypt parameters."""
    if not password:
        raise ValueError("a password must not be empty")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return PasswordHash(salt=salt, digest=_derive(password, salt, n, r, p, HASH_BYTES), n=n, r=r, p=p)


def verify(record: PasswordHash, password: str) -> bool:
    """Whether ``password`` matches ``record`` (the comparison takes the same time wherever they differ)."""
    candidate = _derive(password, record.salt, record.n, record.r, record.p, len(record.digest))
    return hmac.compare_digest(candidate, record.digest)
