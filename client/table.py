"""The table client: writes, lookups and changelog reads on the leaders of a table's buckets.

``TableClient(admin, "db.t")`` asks the coordinator (through the admin client)
for the table and the leader of every bucket, caches both, and talks to the
tablet servers directly, one gRPC channel per server address. Rows travel as
Arrow IPC streams (``docs/row-encoding.md``).

Writes and lookups are split by bucket client-side (``RowCodec.encode_keys``
+ ``bucket_of_keys``, then one Arrow ``take``) and sent as one request per
bucket, in parallel on a small thread pool. There is no atomicity across
buckets: when one bucket fails after others succeeded, the error carries the
buckets that were written in ``details["written"]``.

Routing: ``NOT_LEADER``, ``LEADER_NOT_AVAILABLE`` and an unreachable server
mark the cached assignment stale; the next attempt fetches it again. Every
retriable error (:data:`common.errors.RETRIABLE`) is retried with bounded
exponential backoff and jitter (tenacity) for ``retry_total_s`` in all, then
the last error is raised. Every wire error code becomes its typed exception
(:func:`common.errors.error_for`); a write that timed out raises
:class:`~common.errors.OutcomeUnknownError` and is not retried.

Bad rows raise :class:`~common.errors.InvalidRowError` naming the row and
column before anything is sent (the server checks again and rejects a bad
batch as a whole).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tenacity

from common import config as cfg
from common import errors
from common.proto import tablet_pb2 as pb
from common.proto import tablet_pb2_grpc as pb_grpc
from common.tables import TableInfo
from common.wire import error_from_pb
from common.logentry import ChangeType, decode_entry
from common.codec import RowCodec, batch_to_ipc, bucket_of_keys, ipc_to_batch

MAX_MESSAGE_BYTES = 64 << 20
#: A bucket's part of a write or lookup bigger than this (Arrow bytes) is sent as several requests.
#: An update writes the before- and after-image, so one write's changelog entry stays well under
#: MAX_MESSAGE_BYTES and FetchLog can always return it.
MAX_REQUEST_BYTES = 16 << 20
DEFAULT_RETRY_TOTAL_S = 30.0
DEFAULT_FETCH_BYTES = 1 << 20
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),  # tenacity retries, after refreshing the routing
    # a restarted server is found again within a second, not after gRPC's default backoff (up to 2 min)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_SHORT = {int(ct): ct.short for ct in ChangeType}
#: Errors after which the cached assignment is fetched again before the next attempt.
_REROUTE = (errors.NotLeaderError, errors.LeaderNotAvailableError, errors.NetworkError)


class CommittedSnapshot(NamedTuple):
    bucket: int
    snapshot_id: int
    log_offset: int


@dataclass(frozen=True)
class _Routing:
    generation: int
    table: TableInfo
    leaders: dict  # bucket -> client.admin.BucketLeader


class TableClient:
    """Reads and writes one table; thread-safe. Close it (or use ``with``) to free channels and threads."""

    def __init__(self, admin, table: str | int, config: cfg.Config | None = None, *,
                 retry_total_s: float | None = None, request_timeout_s: float | None = None,
                 snapshot_timeout_s: float = 600.0, parallelism: int = 8,
                 sleep: Callable[[float], None] | None = None) -> None:
        """``admin`` is a :class:`client.admin.AdminClient`; ``table`` a ``DB.NAME`` or a table id."""
        config = config or cfg.Config(env={})
        self.admin = admin
        self._retry_total_s = DEFAULT_RETRY_TOTAL_S if retry_total_s is None else retry_total_s
        self._retry_max_wait_s = config[cfg.CLIENT_RETRY_MAX_WAIT] / 1000.0
        self._timeout_s = request_timeout_s or config[cfg.CLIENT_REQUEST_TIMEOUT] / 1000.0
        self._snapshot_timeout_s = snapshot_timeout_s
        self.scan_batch_bytes = config[cfg.CLIENT_SCANNER_FETCH_MAX_BYTES]
        self._sleep = sleep or tenacity.nap.sleep
        self._parallelism = max(1, parallelism)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._generation = 0
        self._stale = True
        self._routing_now: _Routing | None = None
        table_id = table if isinstance(table, int) else admin.get_table(table).table_id
        self._fetch_routing(table_id)
        self.codec = RowCodec(self.table)

    # -- plumbing ------------------------------------------------------------------------

    @property
    def table(self) -> TableInfo:
        return self._routing_now.table

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            channels, self._channels = list(self._channels.values()), {}
        if pool is not None:
            pool.shutdown(wait=True)
        for channel in channels:
            channel.close()

    def __enter__(self) -> "TableClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetch_routing(self, table_id: int) -> _Routing:
        table, leaders = self.admin.get_table_assignment(table_id)
        with self._lock:
            self._generation += 1
            self._stale = False
            self._routing_now = _Routing(self._generation, table, leaders)
            return self._routing_now

    def _routing(self) -> _Routing:
        """The cached assignment, fetched again first if an attempt marked it stale."""
        with self._lock:
            routing, stale = self._routing_now, self._stale
        return self._fetch_routing(routing.table.table_id) if stale else routing

    def _invalidate(self, routing: _Routing) -> None:
        with self._lock:
            if self._routing_now.generation == routing.generation:
                self._stale = True

    def refresh(self) -> None:
        """Fetch the bucket assignment again now (it is also refreshed on routing errors)."""
        self._fetch_routing(self.table.table_id)

    def leaders(self) -> dict[int, str]:
        """``bucket -> leader address`` as cached ('' while a leader is not live)."""
        return {b: leader.leader_address for b, leader in sorted(self._routing_now.leaders.items())}

    def _stub(self, address: str) -> pb_grpc.TabletServiceStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
                self._channels[address] = channel
        return pb_grpc.TabletServiceStub(channel)

    def _leader(self, routing: _Routing, bucket: int) -> str:
        leader = routing.leaders.get(bucket)
        if leader is None or not leader.leader_address:
            self._invalidate(routing)
            who = "no leader assigned" if leader is None or leader.leader_id < 0 else \
                f"its leader, tablet server {leader.leader_id}, is not live"
            raise errors.LeaderNotAvailableError(f"bucket {bucket} of table {routing.table.path}: {who}",
                                                 bucket=bucket)
        return leader.leader_address

    def _retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(errors.RETRIABLE),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=self._retry_max_wait_s),
            stop=tenacity.stop_before_delay(self._retry_total_s),  # never sleeps past the budget
            sleep=self._sleep, reraise=True)

    def _send(self, routing: _Routing, address: str, method: str, request, *, idempotent: bool,
              timeout_s: float | None = None):
        """One RPC to ``address``; gRPC failures and response errors become typed exceptions."""
        timeout_s = timeout_s or self._timeout_s
        try:
            response = getattr(self._stub(address), method)(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            error = rpc_error(exc, method, address, timeout_s, idempotent)
            if isinstance(error, _REROUTE):
                self._invalidate(routing)
            raise error from None
        error = error_from_pb(response.error)
        if error is not None:
            if isinstance(error, _REROUTE):
                self._invalidate(routing)
            raise error
        return response

    def _call_bucket(self, bucket: int, method: str, request, *, idempotent: bool,
                     timeout_s: float | None = None):
        """``method`` on the leader of ``bucket``, re-routed and retried as the module docstring says."""
        def attempt():
            routing = self._routing()
            return self._send(routing, self._leader(routing, bucket), method, request,
                              idempotent=idempotent, timeout_s=timeout_s)
        return self._retrying()(attempt)

    def _map(self, func: Callable[[Any], Any], items: list) -> list[tuple[Any, BaseException | None]]:
        """``func`` of every item (in parallel when there are several): ``[(result, error)]`` in order."""
        if len(items) <= 1:
            results = []
            for item in items:
                try:
                    results.append((func(item), None))
                except Exception as exc:
                    results.append((None, exc))
            return results
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._parallelism, thread_name_prefix="table-client")
            pool = self._pool
        futures = [pool.submit(func, item) for item in items]
        out = []
        for future in futures:
            error = future.exception()
            out.append((None if error else future.result(), error))
        return out

    # -- splitting by bucket --------------------------------------------------------------------

    def _row_batch(self, rows: Sequence[dict] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        if isinstance(rows, pa.Table):
            rows = _table_to_batch(rows)
        if isinstance(rows, pa.RecordBatch):
            return self.codec.validate(rows)
        return self.codec.to_batch(rows)

    def key_batch(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """Primary-key columns from dicts, tuples (primary-key order), scalars (one-column key), or a batch."""
        if isinstance(keys, pa.Table):
            keys = _table_to_batch(keys)
        if isinstance(keys, pa.RecordBatch):  # checked like rows: names, types, no null key
            return self.codec.validate(keys).select(list(self.table.primary_key))
        pk = self.table.primary_key
        rows = []
        for i, key in enumerate(keys):
            if isinstance(key, dict):
                rows.append(key)
            elif isinstance(key, (tuple, list)):
                if len(key) != len(pk):
                    raise errors.InvalidRowError(f"row {i}: expected {len(pk)} key value(s) "
                                                 f"({', '.join(pk)}), got {len(key)}")
                rows.append(dict(zip(pk, key)))
            elif len(pk) == 1:
                rows.append({pk[0]: key})
            else:
                raise errors.InvalidRowError(f"row {i}: the primary key has {len(pk)} columns "
                                             f"({', '.join(pk)}); give a tuple or a dict, got {key!r}")
        return self.codec.to_batch(rows).select(list(pk))

    def split(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch, np.ndarray]]:
        """``[(bucket, rows of that bucket, their indices in batch)]`` for the buckets that get rows.

        Vectorized: the keys are encoded and hashed once, then one ``take``
        orders the rows by bucket (stable) and each bucket is a zero-copy slice.
        """
        n = self.table.buckets
        if batch.num_rows == 0:
            return []
        if n == 1:
            return [(0, batch, np.arange(batch.num_rows))]
        buckets = np.asarray(bucket_of_keys(self.codec.encode_keys(batch), n), dtype=np.int64)
        order = np.argsort(buckets, kind="stable")
        counts = np.bincount(buckets, minlength=n)
        ordered = batch.take(pa.array(order))
        out, start = [], 0
        for bucket in np.flatnonzero(counts).tolist():
            count = int(counts[bucket])
            out.append((bucket, ordered.slice(start, count), order[start:start + count]))
            start += count
        return out

    # -- writes --------------------------------------------------------------------------------

    def upsert(self, rows: Sequence[dict] | pa.RecordBatch | pa.Table) -> dict[int, tuple[int, int]]:
        """Insert or replace full rows; returns ``{bucket: (base_offset, next_offset)}`` of the changelog."""
        return self._write(self._row_batch(rows), "upserts")

    def delete(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> dict[int, tuple[int, int]]:
        """Delete rows by primary key (missing keys are ignored); offsets like :meth:`upsert`."""
        return self._write(self.key_batch(keys), "deletes")

    def _write(self, batch: pa.RecordBatch, field: str) -> dict[int, tuple[int, int]]:
        parts = self.split(batch)
        table_id = self.table.table_id

        def write_bucket(part) -> tuple[int, int]:
            bucket, rows, _ = part
            offsets = []
            for chunk in _chunks(rows):
                request = pb.PutKvRequest(table_id=table_id, bucket=bucket, **{field: batch_to_ipc(chunk)})
                response = self._call_bucket(bucket, "PutKv", request, idempotent=False)
                offsets.append((response.base_offset, response.next_offset))
            return offsets[0][0], offsets[-1][1]

        results = self._map(write_bucket, parts)
        written = {part[0]: result for part, (result, error) in zip(parts, results) if error is None}
        failed = [(part[0], error) for part, (_, error) in zip(parts, results) if error is not None]
        if failed:
            bucket, error = failed[0]
            if isinstance(error, errors.KvLeaseError):
                error.details.setdefault("bucket", bucket)
                error.details["written"] = written
            raise error
        return written

    # -- reads ---------------------------------------------------------------------------------

    def lookup_batch(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """The rows of ``keys``, one per key in input order (table schema); every column is null
        where the key does not exist (a found row never has a null primary-key column)."""
        key_batch = self.key_batch(keys)
        parts = self.split(key_batch)
        table_id = self.table.table_id

        def lookup_bucket(part) -> tuple[np.ndarray, pa.RecordBatch]:
            bucket, rows, _ = part
            found, batches = [], []
            for chunk in _chunks(rows):
                request = pb.LookupRequest(table_id=table_id, bucket=bucket, keys=batch_to_ipc(chunk))
                response = self._call_bucket(bucket, "Lookup", request, idempotent=True)
                found.append(np.asarray(response.found, dtype=bool))
                if response.rows:
                    batches.append(ipc_to_batch(response.rows))
            return np.concatenate(found), _concat(batches, self.codec.schema)

        results = self._map(lookup_bucket, parts)
        for (result, error) in results:
            if error is not None:
                raise error
        n = key_batch.num_rows
        position = np.zeros(n, dtype=np.int64)  # index into the concatenated found rows
        found_mask = np.zeros(n, dtype=bool)
        found_rows, base = [], 0
        for (bucket, _, indices), (result, _) in zip(parts, results):
            found, rows = result
            if len(found) != len(indices) or int(found.sum()) != rows.num_rows:
                raise errors.UnknownServerError(f"bucket {bucket}: Lookup answered {len(found)} flags and "
                                                f"{rows.num_rows} rows for {len(indices)} keys")
            hit = indices[found]
            found_mask[hit] = True
            position[hit] = base + np.arange(rows.num_rows)
            base += rows.num_rows
            found_rows.append(rows)
        everything = _concat(found_rows, self.codec.schema)
        return everything.take(pa.array(position, mask=~found_mask))

    def lookup(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> list[dict | None]:
        """The row (a dict) of every key, None where it does not exist; aligned with ``keys``."""
        batch = self.lookup_batch(keys)
        found = batch.column(self.table.primary_key[0]).is_valid().to_numpy(zero_copy_only=False)
        rows = batch.to_pylist()
        return [row if hit else None for row, hit in zip(rows, found)]

    def fetch_log_batch(self, bucket: int, from_offset: int,
                        max_bytes: int = DEFAULT_FETCH_BYTES) -> tuple[pa.RecordBatch, int]:
        """``(records, log_end_offset)`` from ``from_offset`` on (at least one entry when there are any).

        ``records`` has ``offset`` (int64), ``change_type`` (int8, see
        :class:`tablet.changelog.ChangeType`) and the table's columns: the row
        of +I/+U, the before-image of -U/-D (the key columns only if a record
        carries no value).
        """
        request = pb.FetchLogRequest(table_id=self.table.table_id, bucket=bucket, from_offset=from_offset,
                                     max_bytes=max_bytes)
        response = self._call_bucket(bucket, "FetchLog", request, idempotent=True)
        entries = [decode_entry(data, from_offset=from_offset).batch for data in response.entries]
        entries = [e for e in entries if e.num_rows]
        if not entries:
            empty = pa.RecordBatch.from_pylist([], schema=self._log_schema())
            return empty, response.log_end_offset
        records = entries[0] if len(entries) == 1 else pa.concat_batches(entries)
        return self._decode_records(records), response.log_end_offset

    def fetch_log(self, bucket: int, from_offset: int,
                  max_bytes: int = DEFAULT_FETCH_BYTES) -> tuple[list[dict], int]:
        """``(records, log_end_offset)``; each record ``{"offset", "change_type" ("+I", "-U", "+U",
        "-D"), "row"}`` (see :meth:`fetch_log_batch` for what ``row`` holds)."""
        batch, end = self.fetch_log_batch(bucket, from_offset, max_bytes)
        if not batch.num_rows:
            return [], end
        offsets = batch.column("offset").to_pylist()
        types = batch.column("change_type").to_pylist()
        rows = batch.select(self.codec.schema.names).to_pylist()
        return [{"offset": offset, "change_type": _SHORT[change_type], "row": row}
                for offset, change_type, row in zip(offsets, types, rows)], end

    def _log_schema(self) -> pa.Schema:
        return pa.schema([pa.field("offset", pa.int64()), pa.field("change_type", pa.int8()),
                          *self.codec.schema])

    def _decode_records(self, records: pa.RecordBatch) -> pa.RecordBatch:
        values = records.column("value")
        if values.null_count == 0:
            rows = self.codec.decode_values(values)
        else:  # records without a value: their key columns, the rest null
            valid = values.is_valid()
            full = self.codec.decode_values(pc.drop_null(values))
            keys = self.codec.decode_keys(pc.filter(records.column("key"), pc.invert(valid)))
            key_rows = pa.RecordBatch.from_arrays(
                [keys.column(f.name) if f.name in keys.schema.names else pa.nulls(keys.num_rows, f.type)
                 for f in self.codec.schema], schema=self.codec.schema)
            mask = valid.to_numpy(zero_copy_only=False)
            index = np.empty(len(mask), dtype=np.int64)
            index[mask] = np.arange(full.num_rows)
            index[~mask] = full.num_rows + np.arange(key_rows.num_rows)
            rows = pa.concat_batches([full, key_rows]).take(pa.array(index))
        return pa.RecordBatch.from_arrays(
            [records.column("offset"), records.column("change_type"), *rows.columns], schema=self._log_schema())

    def list_offsets(self, buckets: Iterable[int] | None = None) -> dict[int, tuple[int, int]]:
        """``{bucket: (earliest, latest)}`` changelog offsets, one request per tablet server."""
        pending = set(range(self.table.buckets) if buckets is None else buckets)
        for bucket in pending:
            if not 0 <= bucket < self.table.buckets:
                raise errors.BucketOutOfRangeError(f"table {self.table.path} has buckets 0..{self.table.buckets - 1}, "
                                                   f"not {bucket}")
        result: dict[int, tuple[int, int]] = {}

        def attempt():
            routing = self._routing()
            for address, group in self._by_leader(routing, pending).items():
                request = pb.ListOffsetsRequest(table_id=self.table.table_id, buckets=group)
                response = self._send(routing, address, "ListOffsets", request, idempotent=True)
                first_error = None
                for o in response.offsets:
                    if o.error.code:
                        first_error = first_error or error_from_pb(o.error)
                    elif o.bucket in pending:
                        result[o.bucket] = (o.earliest, o.latest)
                        pending.discard(o.bucket)
                if first_error is not None:
                    if isinstance(first_error, _REROUTE):
                        self._invalidate(routing)
                    raise first_error
            return result

        return dict(sorted(self._retrying()(attempt).items()))

    def _by_leader(self, routing: _Routing, buckets: Iterable[int]) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {}
        for bucket in sorted(buckets):
            groups.setdefault(self._leader(routing, bucket), []).append(bucket)
        return groups

    def trigger_snapshot(self, wait: bool = True) -> list[CommittedSnapshot]:
        """Snapshot every changed bucket of the table now, on every leader; with ``wait``, returns
        the snapshots committed (buckets unchanged since their last snapshot are skipped)."""
        pending = set(range(self.table.buckets))
        committed: dict[int, CommittedSnapshot] = {}

        def attempt():
            routing = self._routing()
            groups = list(self._by_leader(routing, pending).items())

            def trigger(item):
                address, group = item
                request = pb.TriggerSnapshotRequest(table_id=self.table.table_id, buckets=group, wait=wait)
                return group, self._send(routing, address, "TriggerSnapshot", request, idempotent=True,
                                         timeout_s=self._snapshot_timeout_s)

            first_error = None
            for result, error in self._map(trigger, groups):
                if error is not None:
                    first_error = first_error or error
                    continue
                group, response = result
                for s in response.snapshots:
                    committed[s.bucket.bucket] = CommittedSnapshot(s.bucket.bucket, s.snapshot_id, s.log_offset)
                pending.difference_update(group)
            if first_error is not None:
                raise first_error
            return committed

        return sorted(self._retrying()(attempt).values())


    # -- live scans (tablet/scanner.py) ------------------------------------------------------------

    def scanner(self, bucket: int, *, streaming: bool = False, **options):
        """A scanner of one bucket: :class:`client.scanner.KvBatchScanner` (ScanKv sessions, one request
        in flight) or, with ``streaming``, :class:`client.scanner.KvStreamScanner` (ScanKvStream).
        ``options``: ``limit``, ``batch_size_bytes``, ``start_after_key``, ``resume``, ``decode``.
        Nothing is sent before the first poll; use it with ``with`` or read it to the end."""
        from client.scanner import KvBatchScanner, KvStreamScanner

        if not 0 <= bucket < self.table.buckets:
            raise errors.BucketOutOfRangeError(f"table {self.table.path} has buckets 0..{self.table.buckets - 1}, "
                                               f"not {bucket}")
        return (KvStreamScanner if streaming else KvBatchScanner)(self, self.table, bucket, **options)

    def scan(self, limit: int | None = None, buckets: Iterable[int] | None = None, streaming: bool = False,
             **options):
        """Every live row of the table (or of ``buckets``): a :class:`client.scanner.ScanResult` with
        ``batches`` and ``log_offsets`` ``{bucket: first changelog offset not in the scan}``. See
        :func:`client.scanner.scan_table` (parallel buckets; ``limit`` over the whole table)."""
        from client.scanner import scan_table

        return scan_table(self, limit=limit, buckets=None if buckets is None else list(buckets),
                          streaming=streaming, **options)


# -- helpers ------------------------------------------------------------------------------------


def rpc_error(exc: grpc.RpcError, method: str, address: str, timeout_s: float,
              idempotent: bool) -> errors.KvLeaseError:
    """The typed error for a failed gRPC call to a tablet server."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return errors.NetworkError(f"cannot reach tablet server {address}: UNAVAILABLE", address=address)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if idempotent:
            return errors.NetworkError(f"{method} to tablet server {address} timed out after {timeout_s:g}s",
                                       address=address)
        return errors.OutcomeUnknownError(f"{method} to tablet server {address} timed out after {timeout_s:g}s; "
                                          "it may or may not have been applied", address=address)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.InvalidRequestError(f"{method} to {address}: message too large ({details}); "
                                          "send smaller batches")
    name = code.name if code is not None else "?"
    return errors.UnknownServerError(f"{method} to tablet server {address} failed: {name}: {details}",
                                     address=address)


def _chunks(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``batch`` in slices of at most about :data:`MAX_REQUEST_BYTES` each."""
    size = batch.nbytes
    if size <= MAX_REQUEST_BYTES or batch.num_rows <= 1:
        return [batch]
    pieces = -(-size // MAX_REQUEST_BYTES)
    step = -(-batch.num_rows // pieces)
    return [batch.slice(start, step) for start in range(0, batch.num_rows, step)]


def _concat(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _table_to_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)

