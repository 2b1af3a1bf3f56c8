"""Arrow record batches as the bytes of an Arrow IPC stream, the form rows travel in (docs/row-encoding.md).

:mod:`kvlease.common.codec` re-exports these functions.
"""

from __future__ import annotations

import pyarrow as pa

from kvlease.common.errors import InvalidRowError


def batch_to_ipc(batch: pa.RecordBatch) -> bytes:
    """``batch`` as the bytes of an Arrow IPC stream (schema + one batch)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def ipc_to_batch(data: bytes | pa.Buffer) -> pa.RecordBatch:
    """The batch in an Arrow IPC stream (several are concatenated; none gives an empty batch).

    Raises InvalidRowError when ``data`` is not an Arrow IPC stream.
    """
    try:
        reader = pa.ipc.open_stream(data)
        batches = list(reader)
    except (pa.ArrowException, OSError) as e:
        raise InvalidRowError(f"not an Arrow IPC stream: {e}") from None
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=reader.schema)
    return pa.concat_batches(batches)
