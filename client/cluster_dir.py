"""A local cluster directory (made by ``kvlease cluster start``) as a client sees it: its coordinators."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from common.errors import InvalidRequestError

CLUSTER_FILE = "cluster.json"


def security_settings(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The client's security config keys (dotted) for a cluster.json document; empty if it has no TLS.

    ``kvlease cluster start --secure`` records ``"security": {"ca_file", "cert_file", "key_file",
    "client_auth", "username", "password_file"}`` (the client certificate, not the nodes'; the
    super user's credentials, its password in a file readable by the owner only). An unreadable
    password file is InvalidRequestError naming it.
    """
    sec = doc.get("security") or {}
    if not sec:
        return {}
    settings = {"security.enabled": True, "security.tls.ca-file": sec["ca_file"],
                "security.tls.client-auth": bool(sec.get("client_auth", False))}
    if sec.get("cert_file"):
        settings.update({"security.tls.cert-file": sec["cert_file"], "security.tls.key-file": sec["key_file"]})
    if sec.get("username") and sec.get("password_file"):
        settings.update({"security.username": sec["username"],
                         "security.password": read_password_file(sec["password_file"])})
    return settings


def read_password_file(path: str | os.PathLike[str]) -> str:
    """The password in ``path`` (its first line, without the line end); InvalidRequestError naming the file if
    it cannot be read or is empty (the message never holds the password)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read the password file {path}: {exc.strerror}", path=str(path)) from None
    except UnicodeDecodeError:
        raise InvalidRequestError(f"the password file {path} is not UTF-8 text", path=str(path)) from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise InvalidRequestError(f"the password file {path} is empty", path=str(path))
    return password


def cluster_dir_security(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """:func:`security_settings` of the cluster in ``directory``."""
    return security_settings(read_cluster_file(directory))


def cluster_dir_bootstrap(directory: str | os.PathLike[str]) -> list[str]:
    """The coordinator addresses listed in ``directory/cluster.json``; InvalidRequestError if there are none."""
    doc = read_cluster_file(directory)
    addresses = [c.get("address") for c in doc.get("coordinators", []) if isinstance(c, dict)]
    addresses = [a for a in addresses if a]
    if not addresses:
        raise InvalidRequestError(f"the cluster in {directory} has no coordinators")
    return addresses


def read_cluster_file(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``directory/cluster.json``; InvalidRequestError (saying how to start one) if it is missing
    or unreadable."""
    path = Path(directory) / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidRequestError(f"no cluster in {directory}: {path} not found "
                                  f"(start one with: kvlease cluster start --dir {directory})") from None
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read {path}: {exc}") from None
    return doc
