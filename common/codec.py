"""Row codec: Arrow batches <-> RocksDB keys and values, vectorized.

A tablet server stores each row of a primary-key table in RocksDB as
``key = encode_keys(row)`` and ``value = encode_values(row)``; the changelog
keeps the same bytes. Rows travel between client and server as Arrow IPC
RecordBatches (:func:`batch_to_ipc`, :func:`ipc_to_batch`, in :mod:`kvlease.common.arrow_ipc`).

Every encode and decode works on whole columns with numpy and
``pyarrow.compute``: no Python code runs per row except the one conversion
between an Arrow binary array and a ``list[bytes]`` (and ``zlib.crc32`` per key
in :func:`bucket_of_keys`). The layouts are in ``docs/row-encoding.md``; the parts:
keys in :mod:`kvlease.common.codec_keys`, values in :mod:`kvlease.common.codec_values` (nested values:
:mod:`kvlease.common.codec_nested`), Arrow types in :mod:`kvlease.common.codec_types`, Python values in
:mod:`kvlease.common.codec_python`, the safe widenings a written batch may use in
:mod:`kvlease.common.codec_conform`.

Buckets: ``zlib.crc32(encoded key) % num_buckets`` (crc32 is unsigned in
Python 3): stable across processes, versions and platforms (:mod:`kvlease.common.bucketing`); for a table
with a bucket key, the crc32 of the encoded bucket-key columns, a byte prefix of the key
(:meth:`RowCodec.buckets`, :mod:`kvlease.common.bucket_keys`).

Malformed input (client rows, batches) raises :class:`InvalidRowError` naming
the row and column; so do bytes that are not a value or key of this table.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from kvlease.common.errors import InvalidRowError, show
from kvlease.common import codec_arrays as ca
from kvlease.common import codec_python as cp
from kvlease.common.codec_conform import TIMESTAMP_MAX_US, TIMESTAMP_MIN_US, check_values, conform  # noqa: F401
from kvlease.common.bucket_keys import KeyPrefix
from kvlease.common.codec_keys import KeyCodec
from kvlease.common.codec_types import ARROW_TYPES, arrow_type  # noqa: F401 (ARROW_TYPES: re-exported)
from kvlease.common.codec_schemas import SchemaReader, UnknownSchemaError, columns_schema  # noqa: F401
from kvlease.common.codec_values import FORMAT_VERSION, ValueCodec, value_schema_ids  # noqa: F401
from kvlease.common.columns import Column
from kvlease.common.tables import TableInfo
from kvlease.common.types import parse_type
# re-exported: callers import the bucket function and the IPC helpers from here
from kvlease.common.arrow_ipc import batch_to_ipc, ipc_to_batch  # noqa: F401
from kvlease.common.bucketing import bucket_array, bucket_of, bucket_of_keys  # noqa: F401

#: Rows encoded or decoded in one vectorized pass; keeps temporaries in cache-sized pieces.
CHUNK_ROWS = 1 << 16


def arrow_schema(table: TableInfo) -> pa.Schema:
    """The Arrow schema of a full row of ``table`` (every field nullable)."""
    return columns_schema(table.columns)


def key_schema(table: TableInfo) -> pa.Schema:
    """The Arrow schema of ``table``'s primary key, in primary-key order."""
    types = {c.name: c.type for c in table.columns}
    return pa.schema([pa.field(k, arrow_type(types[k])) for k in table.primary_key])


class RowCodec:
    """Encodes and decodes the rows of one table; see the module docstring for the layouts."""

    def __init__(self, table: TableInfo, schema_id: int | None = None, *, read_as: Sequence[Column] | None = None,
                 refresh: Callable[[], TableInfo] | None = None) -> None:
        """``read_as``: the columns rows are read as (default: the table's; a reader that keeps an earlier
        schema passes that one's); ``refresh``: the table read again, for a row of a schema id the table
        does not know yet (common/codec_schemas.py)."""
        self.table = table
        #: The schema id the values it writes carry (rows of every other schema id are read through
        #: :attr:`reader`).
        self.schema_id = schema_id if schema_id is not None else table.schema_id
        target = tuple(read_as) if read_as is not None else table.columns
        #: The Arrow schema of the rows it reads (of the columns it writes: ``values.schema``).
        self.schema = columns_schema(target)
        self.reader = SchemaReader(table, target, self.schema, refresh)
        #: True when it reads rows as the table's columns and writes the table's schema id: a value of that
        #: id decodes straight into a row read, no projection (:mod:`kvlease.common.codec_lean` relies on it).
        self.reads_own_schema = target == table.columns and self.schema_id == table.schema_id
        self.key_schema = key_schema(table)
        self._types = {c.name: c.type for c in table.columns}
        self._names = [c.name for c in table.columns]
        self._name_set = frozenset(self._names)
        self._key_set = frozenset(table.primary_key)
        self.keys = KeyCodec(tuple(next(c for c in table.columns if c.name == k) for k in table.primary_key),
                             self.key_schema)
        self.values = ValueCodec(table.columns, self.schema if self.reads_own_schema else columns_schema(table.columns),
                                 self.schema_id)
        #: The length of every encoded key when all primary-key columns are fixed-width, else None.
        self.key_width = self.keys.width
        #: Cuts a key's bucket-key bytes out (common/bucket_keys.py); None: the whole key picks the bucket.
        self.bucket_prefix = (KeyPrefix([lay.key_width if lay.fixed else None for lay in self.keys.layouts],
                                        len(table.bucket_key)) if table.bucket_key else None)

    def bucket_keys(self, keys: list[bytes]) -> list[bytes]:
        """The bytes of encoded ``keys`` that pick their bucket: the encoded bucket-key columns (a byte prefix
        of each key), or the whole key for a table without a bucket key."""
        return keys if self.bucket_prefix is None else self.bucket_prefix.cut(keys)

    def buckets(self, keys: list[bytes]) -> np.ndarray:
        """The bucket of each encoded key (numpy ``uint64``): ``crc32(bucket_keys(keys)) % buckets``."""
        return bucket_array(self.bucket_keys(keys), self.table.buckets)

    # ---- client side -------------------------------------------------------

    def to_batch(self, rows: Sequence[dict]) -> pa.RecordBatch:
        """Python rows -> a batch of the table's schema; missing non-key columns are null.

        What each type takes is in :mod:`kvlease.common.codec_python` (TIMESTAMP: a ``datetime``, naive = UTC,
        or int microseconds since the epoch; DECIMAL: ``Decimal``, ``int`` or ``str``, never a float; …).
        Raises InvalidRowError naming the first bad row and column: unknown column, missing or null primary
        key, value of the wrong type or out of range.
        """
        rows = list(rows)
        if not all(issubclass(t, dict) for t in set(map(type, rows))):
            i = next(i for i, row in enumerate(rows) if not isinstance(row, dict))
            raise InvalidRowError(f"row {i}: expected a dict of column -> value, got {show(rows[i])}")
        unknown = set().union(*rows) - self._name_set
        if unknown:
            i, name = next((i, k) for i, r in enumerate(rows) for k in r if k not in self._name_set)
            raise InvalidRowError(f"row {i}, column {show(name)}: unknown column (table {self.table.path} has "
                                  f"{', '.join(self._names)})")
        columns = ([row.get(name) for row in rows] for name in self._names)  # one column's list at a time
        arrays = self._arrays(self._names, columns, lambda i, name: name not in rows[i])
        return pa.RecordBatch.from_arrays(arrays, schema=self.values.schema)

    def keys_to_batch(self, columns: Sequence[list]) -> pa.RecordBatch:
        """Primary-key values, one list per key column in primary-key order -> a batch of the key schema;
        checked as :meth:`to_batch` checks the key columns of rows (a None is ``primary key is null``)."""
        arrays = self._arrays(list(self.table.primary_key), columns, lambda i, name: False)
        return pa.RecordBatch.from_arrays(arrays, schema=self.key_schema)

    def columns_to_batch(self, names: Sequence[str], columns: Sequence[list]) -> pa.RecordBatch:
        """Values of some key columns (``names``, e.g. the bucket key), one list per column -> a batch of them,
        checked as :meth:`keys_to_batch` checks key columns."""
        arrays = self._arrays(list(names), columns, lambda i, name: False)
        return pa.RecordBatch.from_arrays(arrays, schema=self.key_schema_of(names))

    def checked_key_columns(self, batch: pa.RecordBatch, names: Sequence[str]) -> pa.RecordBatch:
        """The key columns ``names`` of an Arrow batch, checked as :meth:`encode_keys` checks key columns."""
        required = frozenset(names)
        return pa.RecordBatch.from_arrays(self._columns(batch, list(names), required),
                                          schema=self.key_schema_of(names))

    def key_schema_of(self, names: Sequence[str]) -> pa.Schema:
        """The Arrow schema of key columns ``names`` (a leading part of :attr:`key_schema`)."""
        return pa.schema([self.key_schema.field(name) for name in names])

    def _arrays(self, names: list[str], columns: Iterable[list],
                missing: Callable[[int, str], bool]) -> list[pa.Array]:
        """Each column of Python values as an Arrow array of its type; InvalidRowError naming the earliest bad
        row of any column. ``missing(i, name)``: row ``i`` lacks column ``name`` (else its None was given)."""
        arrays, errors = [], []  # errors: (row, message) of each column's first bad value
        for name, values in zip(names, columns):
            type_ = self._types[name]
            bad = cp.first_bad_type(values, type_, nullable=name not in self._key_set)
            if bad is None:
                try:
                    arrays.append(cp.to_array(values, type_))
                    continue
                except cp.CONVERSION_ERRORS:
                    bad = len(values)
            errors.append(self._first_error(name, values, bad, missing))
        if errors:
            raise InvalidRowError(min(errors)[1])
        return arrays

    def _first_error(self, name: str, values: list, bad: int,
                     missing: Callable[[int, str], bool]) -> tuple[int, str]:
        """``(row, message)`` of a column's first bad value: ``bad`` is the first of a type the column does not
        take (``len(values)`` if Arrow refused them all), but an earlier one may be out of range."""
        type_ = self._types[name]
        error = cp.first_unconvertible(values[:bad], name, type_)
        if error is None and bad == len(values):
            error = (0, f"column {name!r}: cannot convert the values to {type_}")
        elif error is None and values[bad] is None:
            why = "is missing" if missing(bad, name) else "is null"
            error = (bad, f"row {bad}, column {name!r}: primary key {why}")
        elif error is None:
            error = (bad, f"row {bad}, column {name!r}: expected {type_}, got {show(values[bad])}")
        return error

    # ---- server side -------------------------------------------------------

    def validate(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A client's batch, checked and reordered to the table's schema.

        Columns may come in any order; missing non-key columns become null.
        Types must match exactly (no implicit casts). Raises InvalidRowError for
        a duplicate, unknown or missing primary-key column, a wrong type, or a
        null primary key (naming the first such row).
        """
        arrays = self._columns(batch, self._names, required=self._key_set)
        return pa.RecordBatch.from_arrays(arrays, schema=self.values.schema)

    def encode(self, batch: pa.RecordBatch) -> tuple[list[bytes], list[bytes]]:
        """(keys, values) of a client's batch, after :meth:`validate`."""
        batch = self.validate(batch)
        keys = batch.select(list(self.table.primary_key))
        return _chunked(self._encode_keys, keys), _chunked(self._encode_values, batch)

    def encode_arrays(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        """Like :meth:`encode` but as two Arrow binary arrays: no Python object per row."""
        batch = self.validate(batch)
        keys = batch.select(list(self.table.primary_key))
        return _chunked_array(self._encode_key_array, keys), _chunked_array(self._encode_value_array, batch)

    def encode_key_array(self, batch: pa.RecordBatch) -> pa.Array:
        """Like :meth:`encode_keys` but as an Arrow binary array."""
        return _chunked_array(self._encode_key_array, self._key_batch(batch))

    def encode_keys(self, batch: pa.RecordBatch) -> list[bytes]:
        """The order-preserving keys of a full-row or key-only batch."""
        return _chunked(self._encode_keys, self._key_batch(batch))

    def encode_checked_keys(self, batch: pa.RecordBatch) -> list[bytes]:
        """:meth:`encode_keys` of a batch this codec made or checked (:meth:`to_batch`, :meth:`keys_to_batch`,
        :meth:`validate`), not checked again: the table client's one pass (:mod:`kvlease.client.table_input`)."""
        return _chunked(self._encode_keys, batch.select(list(self.table.primary_key)))

    def encode_checked_key_array(self, batch: pa.RecordBatch) -> pa.Array:
        """:meth:`encode_checked_keys` as an Arrow binary array."""
        return _chunked_array(self._encode_key_array, batch.select(list(self.table.primary_key)))

    def encode_values(self, batch: pa.RecordBatch) -> list[bytes]:
        """The stored values (full rows) of a batch; validated like :meth:`validate`."""
        return _chunked(self._encode_values, self.validate(batch))

    def decode_values(self, values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.RecordBatch:
        """Full rows (the columns read: the table's, or ``read_as``) from stored values of any schema id of
        the table; InvalidRowError if one is malformed."""
        return _decode_chunked(self._decode_values, ca.binary_array(values, "value"), self.schema)

    def _decode_values(self, array: pa.Array, base: int) -> pa.RecordBatch:
        if not self.reads_own_schema:
            return self.reader.read(array, value_schema_ids(array), base)
        return self.values.decode(array, base, self.reader.read)

    def decode_keys(self, keys: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.RecordBatch:
        """Primary-key columns (key schema) from encoded keys; InvalidRowError if one is malformed."""
        return _decode_chunked(self.keys.decode, ca.binary_array(keys, "key"), self.key_schema)

    # ---- internals ---------------------------------------------------------

    def _columns(self, batch: pa.RecordBatch, names: list[str], required: frozenset[str]) -> list[pa.Array]:
        """``batch``'s columns named ``names`` (null if absent and not required), checked."""
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidRowError(f"expected an Arrow RecordBatch, got {type(batch).__name__}")
        given = batch.schema.names
        for name in given:
            if given.count(name) > 1:
                raise InvalidRowError(f"column {show(name)} appears more than once")
            if name not in self._name_set:
                raise InvalidRowError(f"column {show(name)}: unknown column (table {self.table.path} has "
                                      f"{', '.join(self._names)})")
        arrays = []
        for name in names:
            type_ = self._types[name]
            if name not in given:
                if name in required:
                    raise InvalidRowError(f"column {name!r}: primary key column is missing")
                arrays.append(pa.nulls(batch.num_rows, arrow_type(type_)))
                continue
            array = conform(batch.column(name), name, type_)
            if name in self._key_set and array.null_count:
                i = ca.first(np.asarray(array.is_null()))
                raise InvalidRowError(f"row {i}, column {name!r}: primary key is null")
            check_values(array, name, parse_type(type_))
            arrays.append(array)
        return arrays

    def _key_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The primary-key columns of a full-row or key-only batch, checked."""
        keys = list(self.table.primary_key)
        return pa.RecordBatch.from_arrays(self._columns(batch, keys, self._key_set), schema=self.key_schema)

    def _encode_keys(self, keys: pa.RecordBatch) -> list[bytes]:
        return self.keys.encode_list(keys)

    def _encode_key_array(self, keys: pa.RecordBatch) -> pa.Array:
        return self.keys.encode_array(keys)

    def _encode_values(self, batch: pa.RecordBatch) -> list[bytes]:
        return ca.to_list(self.values.encode(batch))

    def _encode_value_array(self, batch: pa.RecordBatch) -> pa.Array:
        return self.values.encode(batch)


# ---- helpers: chunks --------------------------------------------------------

def _chunked(encode: Callable[[pa.RecordBatch], list[bytes]], batch: pa.RecordBatch) -> list[bytes]:
    """``encode`` applied to slices of ``CHUNK_ROWS`` rows (bounded temporaries, no 2 GiB offsets)."""
    if batch.num_rows <= CHUNK_ROWS:
        return encode(batch) if batch.num_rows else []
    out: list[bytes] = []
    for start in range(0, batch.num_rows, CHUNK_ROWS):
        out += encode(batch.slice(start, CHUNK_ROWS))
    return out


def _chunked_array(encode: Callable[[pa.RecordBatch], pa.Array], batch: pa.RecordBatch) -> pa.Array:
    """Like :func:`_chunked` for encoders that return a binary array (the pieces concatenated)."""
    if batch.num_rows <= CHUNK_ROWS:
        return encode(batch) if batch.num_rows else pa.array([], pa.binary())
    return pa.concat_arrays([encode(batch.slice(start, CHUNK_ROWS))
                             for start in range(0, batch.num_rows, CHUNK_ROWS)])


def _decode_chunked(decode: Callable[[pa.Array, int], pa.RecordBatch], array: pa.Array,
                    schema: pa.Schema) -> pa.RecordBatch:
    if not len(array):
        return pa.RecordBatch.from_pylist([], schema=schema)
    if len(array) <= CHUNK_ROWS:
        return decode(array, 0)
    return pa.concat_batches([decode(array.slice(start, CHUNK_ROWS), start)
                              for start in range(0, len(array), CHUNK_ROWS)])
