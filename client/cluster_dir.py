"""A local cluster directory (made by ``kvlease cluster start``) as a client sees it: its coordinators."""

from __future__ import annotations

import json
import os
from pathlib import Path

from common.errors import InvalidRequestError

CLUSTER_FILE = "cluster.json"


def cluster_dir_bootstrap(directory: str | os.PathLike[str]) -> list[str]:
    """The coordinator addresses listed in ``directory/cluster.json``; InvalidRequestError if there are none."""
    path = Path(directory) / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidRequestError(f"no cluster in {directory}: {path} not found") from None
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read {path}: {exc}") from None
    addresses = [c.get("address") for c in doc.get("coordinators", []) if isinstance(c, dict)]
    addresses = [a for a in addresses if a]
    if not addresses:
        raise InvalidRequestError(f"the cluster in {directory} has no coordinators")
    return addresses
