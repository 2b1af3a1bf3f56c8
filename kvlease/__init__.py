"""kvlease's Python API: ``import kvlease; with kvlease.connect(cluster=DIR) as kv: kv.table("db.t")``.

:func:`connect` (see :mod:`kvlease.client.connect`) finds the cluster as the ``kvlease`` CLI does (``cluster=``,
``bootstrap=``, else ``KVLEASE_BOOTSTRAP`` / ``KVLEASE_CLUSTER``) and returns a :class:`Connection` with
``.admin`` (:class:`AdminClient`: tables, snapshots, leases, users, ACLs) and ``.table(name)``
(:class:`TableClient`: writes, lookups, scans, the changelog). The same names are importable from the
``client`` package's modules; this package only gathers them.
"""

import kvlease.client  # noqa: F401  (first: it settles gRPC's fork setting before anything imports grpc)
from kvlease.client.admin import AcquireResult, AdminClient, ReleaseResult, SnapshotInfo
from kvlease.client.connect import Connection, connect
from kvlease.client.log_position import LogPosition
from kvlease.client.snapshot_read import read_snapshot
from kvlease.client.table import TableClient
from kvlease.common import errors
from kvlease.common.errors import KvLeaseError
from kvlease.common.model import Lease, SnapshotHandle, TableBucket
from kvlease.common.tables import Column, TableInfo

__all__ = ["AcquireResult", "AdminClient", "Column", "Connection", "KvLeaseError", "Lease", "LogPosition",
           "ReleaseResult", "SnapshotHandle", "SnapshotInfo", "TableBucket", "TableClient", "TableInfo", "connect",
           "errors", "read_snapshot"]
