"""kvlease's Python API: ``import kvlease; with kvlease.connect(cluster=DIR) as kv: kv.table("db.t")``.

:func:`connect` (see :mod:`kvlease.client.connect`) finds the cluster as the ``kvlease`` CLI does (``cluster=``,
``bootstrap=``, else ``KVLEASE_BOOTSTRAP`` / ``KVLEASE_CLUSTER``) and returns a :class:`Connection` with
``.admin`` (:class:`AdminClient`: tables, snapshots, leases, users, ACLs) and ``.table(name)``
(:class:`TableClient`: writes, lookups, scans, the changelog). The same names are importable from the
``kvlease.client`` package's modules; this package only gathers them.

``kvlease`` is also the one top-level package of the installed distribution: ``kvlease.client``,
``kvlease.common``, ``kvlease.coordinator``, ``kvlease.tablet``, ``kvlease.leases``,
``kvlease.spark_source`` and ``kvlease.ops`` (docs/architecture.md, "Code layers"). In the repository they
are the top-level folders beside this one; the wheel maps them under ``kvlease/`` (``setup.py``), and in a
source checkout this package's path takes in the repository's root so the same imports work unbuilt.
The API names load on first use (PEP 562), so a process that imports ``kvlease.tablet`` or the CLI does
not load the client for them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if (_ROOT / "setup.py").is_file() and (_ROOT / "tablet" / "__init__.py").is_file():  # a source checkout
    __path__.append(str(_ROOT))  # type: ignore[name-defined]  # noqa: F821  (a package's __path__)

#: name -> the module that defines it
_EXPORTS = {
    "AcquireResult": "kvlease.client.admin", "AdminClient": "kvlease.client.admin",
    "ReleaseResult": "kvlease.client.admin", "SnapshotInfo": "kvlease.client.admin",
    "Connection": "kvlease.client.connect", "connect": "kvlease.client.connect",
    "LogPosition": "kvlease.client.log_position", "read_snapshot": "kvlease.client.snapshot_read",
    "TableClient": "kvlease.client.table", "KvLeaseError": "kvlease.common.errors",
    "Lease": "kvlease.common.model", "SnapshotHandle": "kvlease.common.model", "TableBucket": "kvlease.common.model",
    "Column": "kvlease.common.tables", "TableInfo": "kvlease.common.tables",
}
#: name -> the module it is
_MODULES = {"errors": "kvlease.common.errors"}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS and name not in _MODULES:
        raise AttributeError(f"module 'kvlease' has no attribute {name!r}")
    importlib.import_module("kvlease.client")  # first: it settles gRPC's fork setting before anything imports grpc
    value = (importlib.import_module(_MODULES[name]) if name in _MODULES
             else getattr(importlib.import_module(_EXPORTS[name]), name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
