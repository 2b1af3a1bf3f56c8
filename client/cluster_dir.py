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
    "client_auth"}`` (the client certificate, not the nodes').
    """
    sec = doc.get("security") or {}
    if not sec:
        return {}
    settings = {"security.enabled": True, "security.tls.ca-file": sec["ca_file"],
                "security.tls.client-auth": bool(sec.get("client_auth", False))}
    if sec.get("cert_file"):
        settings.update({"security.tls.cert-file": sec["cert_file"], "security.tls.key-file": sec["key_file"]})
    return settings


def cluster_dir_security(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """:func:`security_settings` of the cluster in ``directory``."""
    return security_settings(_load(directory))


def cluster_dir_bootstrap(directory: str | os.PathLike[str]) -> list[str]:
    """The coordinator addresses listed in ``directory/cluster.json``; InvalidRequestError if there are none."""
    doc = _load(directory)
    addresses = [c.get("address") for c in doc.get("coordinators", []) if isinstance(c, dict)]
    addresses = [a for a in addresses if a]
    if not addresses:
        raise InvalidRequestError(f"the cluster in {directory} has no coordinators")
    return addresses


def _load(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidRequestError(f"no cluster in {directory}: {path} not found") from None
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read {path}: {exc}") from None
    return doc
