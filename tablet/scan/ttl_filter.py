"""Live scans of a table with a row TTL: the rows of a batch that have expired are left out (common/row_ttl.py).

A scan's batch holds encoded values (``tablet/scan/batch.py``); for a table
with a row TTL they are decoded here, judged against the server's clock
(:func:`kvlease.common.row_expiry.expired_mask`) and the expired ones dropped
before the batch goes on the wire, so a scan never returns a row the
background deleter (``tablet/expiry.py``) has not deleted yet. The batch's
``last_key`` stays the last key *read*, so a scan resumes after the rows it
skipped. Tables without a TTL are not touched (:func:`ttl_filter` is None).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pyarrow as pa

from kvlease.common.codec import RowCodec
from kvlease.common.row_expiry import expired_mask
from kvlease.tablet.scan.batch import Batch


def ttl_filter(codec: RowCodec, clock_ms: Callable[[], int] | None = None
               ) -> Callable[[Batch, int | None], Batch] | None:
    """The filter of ``codec``'s table's scans (None: the table has no row TTL): ``keep(batch, max_rows)``
    (the cap the batch was read with). A batch that lost rows and had been cut by its cap says it has more,
    so a scan with a limit asks again for the rows the expired ones took the place of."""
    ttl = codec.table.row_ttl
    if ttl is None:
        return None
    clock = clock_ms or (lambda: int(time.time() * 1000))

    def keep(batch: Batch, max_rows: int | None = None) -> Batch:
        if not batch.count:
            return batch
        values = pa.Array.from_buffers(pa.binary(), batch.count,
                                       [None, pa.py_buffer(np.ascontiguousarray(batch.offsets, np.int32)),
                                        pa.py_buffer(b"".join(batch.chunks))])
        expired = expired_mask(ttl, codec.decode_values(values), clock())
        if not expired.any():
            return batch
        live = values.filter(pa.array(~expired))
        offsets = np.frombuffer(live.buffers()[1], np.int32)[live.offset:live.offset + len(live) + 1]
        data = live.buffers()[2]
        start, end = int(offsets[0]), int(offsets[-1])
        chunk = data.slice(start, end - start).to_pybytes() if data is not None else b""  # the live bytes only
        more = batch.has_more or (max_rows is not None and batch.count >= max_rows)
        return Batch([chunk] if chunk else [], (offsets - start).astype(np.int32), batch.last_key, more)

    return keep
