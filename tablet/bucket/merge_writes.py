"""A write through a merge engine or a partial update: the leader's new rows from the before-images.

:class:`MergeWrite` is what :class:`~kvlease.tablet.bucket.writes.BucketWrites` uses instead of its
last-write-wins fast path when the table has a merge engine (common/merge_engine.py), the write is a
partial update, or it retracts: under the write lock, once the before-images are known (RocksDB and the
pre-write buffer), :meth:`MergeWrite.changes` folds the write into them and returns full before and after
images as change records, so followers and rebuilt replicas, which replay the changelog, hold the same
rows. The operations apply in order: upserts, then retracts, then deletes. Keys distinct (the usual
batch): one vectorized step (decode the stored values with the table's codec, fold each column with
:mod:`kvlease.tablet.store.merge_fold`, encode). A key named twice: the operations are cut into runs of
distinct keys, folded one after the other, each seeing the rows the previous left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvlease.common.codec import CHUNK_ROWS, RowCodec
from kvlease.common.errors import InvalidRequestError
from kvlease.common.logentry import SCHEMA, ChangeType
from kvlease.common.limits import MAX_ROW_SIZE_BOUND
from kvlease.common.merge_engine import DeleteBehavior, EngineKind
from kvlease.common.row_expiry import expired_mask
from kvlease.tablet.bucket import write_checks
from kvlease.tablet.store import change_records, merge_fold

_INSERT, _UPDATE_BEFORE, _UPDATE_AFTER, _DELETE = (int(ct) for ct in ChangeType)


def prepare(codec: RowCodec, upserts: pa.RecordBatch | None, retracts: pa.RecordBatch | None,
            deletes: pa.RecordBatch | None, partial: bool, *, max_row_bytes: int = MAX_ROW_SIZE_BOUND,
            now_ms: int = 0) -> tuple["MergeWrite", pa.Array, list[bytes]]:
    """The write checked (rows by the codec; a retract needs the aggregation engine; deletes as the engine's
    delete behaviour says: refused, dropped or kept), its keys in operation order (binary array and list)."""
    table = codec.table
    engine = table.merge_engine
    if retracts is not None and (engine is None or engine.kind is not EngineKind.AGGREGATION):
        raise InvalidRequestError(f"table {table.path} cannot take a retract: it needs the aggregation merge "
                                  f"engine, it has {engine.kind.value if engine else 'none'}")
    if deletes is not None and engine is not None and deletes.num_rows:
        if engine.deletes is DeleteBehavior.DISABLE:
            raise InvalidRequestError(f"table {table.path} refuses deletes: its merge engine is {engine.describe()}")
        if engine.deletes is DeleteBehavior.IGNORE:
            deletes = None
    up = codec.validate(upserts) if upserts is not None else None
    ret = codec.validate(retracts) if retracts is not None else None
    written = frozenset(upserts.schema.names) if partial and upserts is not None else None
    parts = [codec.encode_key_array(b) for b in (up, ret, deletes) if b is not None and b.num_rows]
    keys = pa.concat_arrays(parts) if len(parts) > 1 else parts[0] if parts else pa.array([], pa.binary())
    merge = MergeWrite(codec, up, ret, 0 if deletes is None else deletes.num_rows, written, max_row_bytes, now_ms)
    return merge, keys, keys.to_pylist()


def check_sizes(codec: RowCodec, max_row_bytes: int, put_keys: list[bytes], put_values: list[bytes]) -> None:
    """RecordTooLargeError for a row the engine made over ``table.max-row-size`` (a listagg grows)."""
    if put_keys:
        write_checks.check_row_sizes(codec, max_row_bytes, pa.array(put_keys, pa.binary()),
                                     pa.array(put_values, pa.binary()))


@dataclass(frozen=True)
class MergeWrite:
    """One write's operations: ``upserts`` and ``retracts`` validated full rows (None: none), ``written`` the
    columns a partial update names (None: every column), ``n_deletes`` keys to delete after them."""
    codec: RowCodec
    upserts: pa.RecordBatch | None
    retracts: pa.RecordBatch | None
    n_deletes: int
    written: frozenset[str] | None = None
    #: ``table.max-row-size``: a row the engine makes longer is refused (a listagg grows).
    max_row_bytes: int = MAX_ROW_SIZE_BOUND
    #: The leader's clock: a stored row its table's row TTL expired is folded as a missing one.
    now_ms: int = 0

    def changes(self, key_list: list[bytes], keys: pa.Array, olds: pa.Array):
        """``(records, put keys, put values, deleted keys)``: the change records and the RocksDB effects of the
        write, given each key's stored value ``olds`` (null where missing), keys in operation order."""
        if change_records.increasing(keys) or len(set(key_list)) == len(key_list):
            news, changed = self._step(keys, olds, 0, len(key_list))
            effects = _effects(keys, olds, news, changed)
        else:
            effects = self._in_runs(key_list, keys, olds)
        check_sizes(self.codec, self.max_row_bytes, effects[1], effects[2])
        return effects

    def _in_runs(self, key_list: list[bytes], keys: pa.Array, olds: pa.Array):
        state = dict(zip(key_list, olds.to_pylist()))  # the first one of each key: its stored value
        original = dict(state)
        parts = []
        start = 0
        while start < len(key_list):
            seen, end = set(), start
            while end < len(key_list) and key_list[end] not in seen:
                seen.add(key_list[end])
                end += 1
            run_olds = pa.array([state[k] for k in key_list[start:end]], pa.binary())
            run_keys = keys.slice(start, end - start)
            news, changed = self._step(run_keys, run_olds, start, end)
            parts.append(_records(run_keys, run_olds, news, changed))
            state.update(zip(key_list[start:end], news.to_pylist()))
            start = end
        records = pa.concat_batches(parts)
        put_keys = [k for k, v in state.items() if v is not None and v != original[k]]
        gone = [k for k, v in state.items() if v is None and original[k] is not None]
        return records, put_keys, [state[k] for k in put_keys], gone

    def _step(self, keys: pa.Array, olds: pa.Array, start: int, end: int) -> tuple[pa.Array, np.ndarray]:
        """The values after operations ``start:end`` (distinct keys) and which changed."""
        n_up = 0 if self.upserts is None else self.upserts.num_rows
        n_ret = 0 if self.retracts is None else self.retracts.num_rows
        present = olds.is_valid().to_numpy(zero_copy_only=False)  # stored: a delete removes it
        existed = present  # stored and live: what the engine folds into
        stored = self._decode(olds, existed)
        if self.codec.table.row_ttl is not None:  # an expired row not deleted yet is folded as a missing one
            expired = present & expired_mask(self.codec.table.row_ttl, stored, self.now_ms)
            if expired.any():
                existed = present & ~expired
                stored = self._decode(pc.if_else(pa.array(existed), olds, pa.nulls(len(olds), pa.binary())),
                                      existed)
        changed = np.zeros(end - start, bool)
        key = self.codec.table.primary_key
        engine = self.codec.table.merge_engine
        pieces = []  # (offset in the run, rows after, changed)
        up = (max(start, 0), min(end, n_up))
        if up[0] < up[1]:
            rows = self.upserts.slice(up[0], up[1] - up[0])
            at = slice(up[0] - start, up[1] - start)
            written = self.written if self.written is not None else rows.schema.names
            after, ch = merge_fold.fold_upserts(engine, key, stored[at], existed[at], rows, written)
            pieces.append((at, after, ch))
        ret = (max(start, n_up), min(end, n_up + n_ret))
        if ret[0] < ret[1]:
            rows = self.retracts.slice(ret[0] - n_up, ret[1] - ret[0])
            at = slice(ret[0] - start, ret[1] - start)
            after, ch = merge_fold.fold_retracts(engine, key, stored[at], existed[at], rows)
            pieces.append((at, after, ch))
        dels = (max(start, n_up + n_ret), end)
        parts = []
        for at, after, ch in pieces:
            parts.append(pc.if_else(pa.array(ch), self._encode(after), olds.slice(at.start, at.stop - at.start)))
            changed[at] = ch
        if dels[0] < dels[1]:
            at = slice(dels[0] - start, dels[1] - start)
            changed[at] = present[at]
            parts.append(pa.nulls(at.stop - at.start, pa.binary()))
        news = pa.concat_arrays(parts) if len(parts) > 1 else parts[0] if parts else olds
        return news, changed

    def _decode(self, olds: pa.Array, existed: np.ndarray) -> pa.RecordBatch:
        """The stored rows as the table's current columns, aligned with ``olds`` (all null where missing)."""
        schema = self.codec.values.schema
        where = np.flatnonzero(existed)
        if not len(where):
            return pa.RecordBatch.from_arrays([pa.nulls(len(olds), f.type) for f in schema], schema=schema)
        if len(where) == len(olds):  # every key has its row (an update pass): aligned already
            return pa.RecordBatch.from_arrays(self.codec.decode_values(olds).columns, schema=schema)
        decoded = self.codec.decode_values(olds.filter(pa.array(existed)))
        decoded = pa.RecordBatch.from_arrays(decoded.columns, schema=schema)
        index = np.full(len(olds), -1, np.int64)
        index[where] = np.arange(len(where))
        return decoded.take(pa.array(index, mask=index < 0))

    def _encode(self, rows: pa.RecordBatch) -> pa.Array:
        rows = pa.RecordBatch.from_arrays(rows.columns, schema=self.codec.values.schema)
        if rows.num_rows <= CHUNK_ROWS:
            return self.codec.values.encode(rows)
        return pa.concat_arrays([self.codec.values.encode(rows.slice(s, CHUNK_ROWS))
                                 for s in range(0, rows.num_rows, CHUNK_ROWS)])


def _effects(keys: pa.Array, olds: pa.Array, news: pa.Array, changed: np.ndarray):
    records = _records(keys, olds, news, changed)
    put = changed & news.is_valid().to_numpy(zero_copy_only=False)
    gone = changed & ~put & olds.is_valid().to_numpy(zero_copy_only=False)
    if put.all():
        return records, keys.to_pylist(), news.to_pylist(), []
    mask_put, mask_gone = pa.array(put), pa.array(gone)
    return (records, keys.filter(mask_put).to_pylist(), news.filter(mask_put).to_pylist(),
            keys.filter(mask_gone).to_pylist())


def _records(keys: pa.Array, olds: pa.Array, news: pa.Array, changed: np.ndarray) -> pa.RecordBatch:
    """+I, -U/+U and -D of the changed keys, vectorized (a key with neither an old nor a new row: none)."""
    old_ok = olds.is_valid().to_numpy(zero_copy_only=False)
    new_ok = news.is_valid().to_numpy(zero_copy_only=False)
    counts = changed * (old_ok.astype(np.int64) + new_ok)
    rows = np.repeat(np.arange(len(keys)), counts)
    first = np.ones(len(rows), bool)
    first[1:] = rows[1:] != rows[:-1]
    take_old = first & old_ok[rows]
    types = np.where(take_old, np.where(new_ok[rows], _UPDATE_BEFORE, _DELETE),
                     np.where(old_ok[rows], _UPDATE_AFTER, _INSERT)).astype(np.int8)
    sources = np.where(take_old, rows, len(keys) + rows)
    values = pa.concat_arrays([olds, news]).take(pa.array(sources))
    return pa.RecordBatch.from_arrays([pa.array(types), keys.take(pa.array(rows)), values], schema=SCHEMA)
