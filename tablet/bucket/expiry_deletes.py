"""The conditional delete of row TTL: delete a key only if its current row is still expired.

The expiry deleter (``tablet/expiry.py``) finds expired rows in a snapshot,
unlocked; by the time its delete takes the bucket's write lock a client may
have written the key again (a refresh). :class:`ExpiredOnly` is the
condition :meth:`kvlease.tablet.bucket.writes.BucketWrites.write` applies
under the lock, to the keys' current values (their before-images, through the
pre-write buffer on a replicated bucket): only the keys whose value is still
expired at ``now_ms`` are deleted, so a refreshed row is kept. It also marks
the records of a ``--ttl-changelog none`` table: -D records without a
before-image, which the change feed skips (``client/log_records.py``) and
every replica applies as deletes (docs/changelog.md, "Row TTL").
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kvlease.common.codec import RowCodec
from kvlease.common.logentry import SCHEMA
from kvlease.common.row_expiry import expired_mask
from kvlease.common.row_ttl import RowTtl
from kvlease.tablet.store import change_records


class ExpiredOnly:
    """The condition of one expiry delete: ``ttl`` of ``codec``'s table, judged at ``now_ms``."""

    def __init__(self, codec: RowCodec, ttl: RowTtl, now_ms: int) -> None:
        self.codec = codec
        self.ttl = ttl
        self.now_ms = now_ms

    def changes(self, key_list: list[bytes], keys: pa.Array, olds: pa.Array):
        """``(records, put keys, put values, deleted keys)`` of deleting the keys still expired (``olds``: their
        current values), records marked (:meth:`mark`)."""
        keys, olds = self.narrow(keys, olds)
        records, put_keys, put_values, gone = change_records.changes_in_order(keys.to_pylist(), [], olds.to_pylist())
        return self.mark(records), put_keys, put_values, gone

    def narrow(self, keys: pa.Array, olds: pa.Array) -> tuple[pa.Array, pa.Array]:
        """``(keys, olds)`` of the keys whose current value (``olds``, null: missing) is expired now."""
        keep = np.zeros(len(olds), bool)
        present = np.flatnonzero(olds.is_valid().to_numpy(zero_copy_only=False))
        if len(present):
            rows = self.codec.decode_values(olds.take(pa.array(present)))
            keep[present] = expired_mask(self.ttl, rows, self.now_ms)
        mask = pa.array(keep)
        return keys.filter(mask), olds.filter(mask)

    def mark(self, records: pa.RecordBatch) -> pa.RecordBatch:
        """The delete's change records as they go to the changelog: as they are, or (``--ttl-changelog none``)
        without their before-images."""
        if not self.ttl.hidden or not records.num_rows:
            return records
        return pa.RecordBatch.from_arrays([records.column(0), records.column(1),
                                           pa.nulls(records.num_rows, pa.binary())], schema=SCHEMA)
