"""Reading a KV snapshot from Python: its files fetched from remote storage, its rows decoded.

Lease the snapshot first (:meth:`kvlease.client.admin.AdminClient.acquire_lease`): a snapshot nothing leases may be
deleted as soon as newer ones are committed, and its read then fails with StorageError/StorageNotFound.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import pyarrow as pa

from kvlease.common.codec import RowCodec
from kvlease.common.kvsnapshot import download, open_read_only, scan_read_options
from kvlease.common.model import SnapshotHandle
from kvlease.common.row_expiry import live_rows
from kvlease.common.storage import RemoteStorage
from kvlease.common.tables import TableInfo


def read_snapshot(admin, handle: SnapshotHandle, *, table: TableInfo | None = None,
                  storage: RemoteStorage | None = None) -> pa.Table:
    """The rows of the snapshot ``handle`` (its bucket as of ``handle.log_offset``), in primary-key order.

    ``admin`` (an :class:`~kvlease.client.admin.AdminClient`) names the table (unless ``table`` is given) and the
    remote storage (unless ``storage`` is); S3 credentials come from this process's environment. A table
    with a row TTL's rows expired now (this process's clock) are left out. The files
    go to a temp dir that is removed before this returns. The whole bucket is held in memory.
    """
    table = table or admin.get_table_by_id(handle.bucket.table_id)
    storage = storage or admin.coordinator_info().remote_storage()
    codec = RowCodec(table)
    target = tempfile.mkdtemp(prefix="kvlease-snapshot-")
    try:
        download(storage, handle, f"{target}/db")
        db = open_read_only(f"{target}/db")
        try:
            values = list(db.values(read_opt=scan_read_options()))
        finally:
            db.close()
    finally:
        shutil.rmtree(target, ignore_errors=True)
    batch = live_rows(table.row_ttl, codec.decode_values(pa.array(values, pa.binary())), int(time.time() * 1000))
    return pa.Table.from_batches([batch], schema=batch.schema)
