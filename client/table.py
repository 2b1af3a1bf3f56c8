"""The table client: writes, lookups and changelog reads on the leaders of a table's buckets.

``TableClient(admin, "db.t")`` asks the coordinator (through the admin client)
for the table and the leader of every bucket, caches both, and talks to the
tablet servers directly, one gRPC channel per server address. Rows travel as
Arrow IPC streams (``docs/row-encoding.md``).

Writes and lookups are split by bucket client-side, in the one pass of
:mod:`kvlease.client.table_input` (the input checked and converted, its keys encoded
and hashed once, then one Arrow ``take``), and sent as one request per
bucket, in parallel on a small thread pool. There is no atomicity across
buckets: when one bucket fails after others succeeded, the error carries the
buckets that were written in ``details["written"]`` and how many rows of each
bucket were acknowledged (a failed bucket's first requests too) in
``details["written_rows"]``.

Routing: ``NOT_LEADER``, ``FENCED_LEADER_EPOCH``, ``LEADER_NOT_AVAILABLE`` and an
unreachable server mark the cached assignment stale; the next attempt fetches it
again (a write carries the leader epoch it was routed by, so a deposed leader
refuses it instead of writing). Every
retriable error (:data:`kvlease.common.errors.RETRIABLE`) is retried with bounded
exponential backoff and jitter (tenacity) for ``retry_total_s`` in all, then
the last error is raised. Every wire error code becomes its typed exception
(:func:`kvlease.common.errors.error_for`). Writes are idempotent (:mod:`kvlease.client.idempotent`:
a writer id and a batch number per bucket), so a write that timed out is
retried like a read and applied once.

Bad rows raise :class:`~kvlease.common.errors.InvalidRowError` naming the row and
column before anything is sent (:mod:`kvlease.client.table_input`) (the server checks again and rejects a bad
batch as a whole).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence

import grpc
import numpy as np
import pyarrow as pa
import tenacity

from kvlease.client.idempotent import Writers
from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import TableInfo
from kvlease.common.wire import error_from_pb
from kvlease.common.logentry import LogEntry, decode_entry
from kvlease.common.codec import RowCodec
from kvlease.client.log_offsets import LogOffsets
from kvlease.client.log_position import LogPosition
from kvlease.client.log_records import decode_records, entry_records, log_rows, log_schema
from kvlease.client.partitioned_table import PartitionedWrites
from kvlease.client.partitions_admin import find_partition
from kvlease.client.routing import REROUTE, BucketRouter, Routing
from kvlease.client.scanner import KvBatchScanner
from kvlease.client.snapshot_trigger import COMMITTED, CommittedSnapshot, raise_failed, trigger_snapshots
from kvlease.client.stream_scanner import KvStreamScanner
from kvlease.client import lean_lookup, point_lookup, prefix_lookup, table_input, table_writes
from kvlease.client.table_writes import MAX_REQUEST_BYTES  # noqa: F401 (re-exported)
from kvlease.client.table_scan import scan_table
from kvlease.client.leader_watch import call_watching
from kvlease.client.transport import RetryPolicy, arguments, rpc_error

DEFAULT_RETRY_TOTAL_S = 30.0
DEFAULT_FETCH_BYTES = 1 << 20


class TableClient(LogOffsets):
    """Reads and writes one table; thread-safe. Close it (or use ``with``) to free channels and threads."""

    def __init__(self, admin, table: str | int, config: cfg.Config | None = None, *,
                 retry_total_s: float | None = None, request_timeout_s: float | None = None,
                 snapshot_timeout_s: float = 600.0, parallelism: int = 8,
                 sleep: Callable[[float], None] | None = None, partition: str | TableInfo | None = None,
                 create_partitions: bool = True, read_as: tuple | None = None, packed_lookups: bool = True) -> None:
        """``admin`` is a :class:`kvlease.client.admin.AdminClient`; ``table`` a ``DB.NAME`` or a table id.
        Of a partitioned table (docs/partitions.md): without ``partition`` the client writes and looks up
        rows of every partition (``create_partitions``: a write to a partition that does not exist creates
        it); with ``partition`` (its name) it reads and writes that partition's buckets, as a table's. Rows
        of any schema are read as its schema when opened, or as ``read_as`` (docs/schemas.md). ``packed_lookups``:
        lookups send encoded keys and decode the stored values answered (client/point_lookup.py; False: Arrow IPC
        both ways, the plain form, which a client with ``read_as`` always uses, and one whose table's schema
        changed since it was opened, from its first answer read as the newer schema on)."""
        config = config or cfg.Config(env={})
        self.admin = admin
        self.retry = RetryPolicy(DEFAULT_RETRY_TOTAL_S if retry_total_s is None else retry_total_s,
                                 config[cfg.CLIENT_RETRY_MAX_WAIT] / 1000.0, sleep or tenacity.nap.sleep)
        self.timeout_s = request_timeout_s or config[cfg.CLIENT_REQUEST_TIMEOUT] / 1000.0
        self.snapshot_timeout_s = snapshot_timeout_s
        self.scan_batch_bytes = config[cfg.CLIENT_SCANNER_FETCH_MAX_BYTES]
        self._parallelism = max(1, parallelism)
        self._lock = threading.Lock()
        self._closed = False
        self._pool: ThreadPoolExecutor | None = None
        self._writers = Writers()  # idempotent writes: a writer id and batch numbers per bucket
        self._options = dict(config=config, retry_total_s=retry_total_s, request_timeout_s=request_timeout_s,
                             snapshot_timeout_s=snapshot_timeout_s, parallelism=parallelism, sleep=sleep,
                             packed_lookups=packed_lookups)
        self.packed_lookups = packed_lookups and read_as is None
        info = partition if isinstance(partition, TableInfo) else (
            admin.get_table_by_id(table) if isinstance(table, int) else admin.get_table(table))
        self.partitions: PartitionedWrites | None = None  # a partitioned table's, opened without a partition
        self.router: BucketRouter | None = None
        self._read_as = read_as
        if info.partitioned and partition is None:
            self._table, self.codec = info, self._codec(info)
            self.partitions = PartitionedWrites(admin, info, self.codec, self._partition_client, create_partitions)
            return
        if isinstance(partition, str):
            info = find_partition(admin, info, partition)
        elif partition is not None and not info.partitioned:
            raise errors.InvalidRequestError(f"table {info.path} is not partitioned", table=info.path)
        self.router = BucketRouter(admin, info.table_id, info.partition_id,
                                   lookup_ports=config[cfg.CLIENT_LOOKUP_PORT])
        self.codec = self._codec(self.table)

    def _codec(self, info: TableInfo) -> RowCodec:
        """The codec of ``info``'s rows; a row of a schema it does not know makes it ask for the table again."""
        def latest() -> TableInfo:
            table = self.admin.get_table_by_id(info.table_id)
            return table if info.partition_id is None else table.of_partition(info.partition_id, info.partition_name)

        return RowCodec(info, read_as=self._read_as, refresh=latest)

    def _partition_client(self, view: TableInfo) -> "TableClient":
        return TableClient(self.admin, view.table_id, partition=view, read_as=self._read_as, **self._options)

    # -- plumbing ------------------------------------------------------------------------

    @property
    def table(self) -> TableInfo:
        """The table (columns, primary key, buckets; a partition's view when opened on one), as the
        coordinator last described it."""
        return self._table if self.router is None else self.router.table

    @property
    def physical(self) -> BucketRouter:
        """The bucket router; InvalidRequestError for a partitioned table opened without a partition."""
        if self.router is None:
            raise errors.InvalidRequestError(
                f"table {self.table.path} is partitioned: reading its buckets (changelog, scans, snapshots, "
                f"offsets) needs a partition, e.g. TableClient(admin, {self.table.path!r}, partition='NAME') "
                f"(kvlease partition list {self.table.path})", table=self.table.path)
        return self.router

    def close(self) -> None:
        """Close its thread pool and channels (idempotent); a call after it is InvalidRequestError."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self.partitions is not None:
            self.partitions.close()
        if self.router is not None:
            self.router.channels.close()

    def _check_open(self) -> None:
        if self._closed:  # else a call would open channels (and a pool) that nothing closes again
            raise errors.InvalidRequestError(f"this TableClient of {self.table.path} is closed")

    def __enter__(self) -> "TableClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self) -> None:
        """Fetch the bucket assignment again now (it is also refreshed on routing errors)."""
        self.physical.refresh()

    def leaders(self) -> dict[int, str]:
        """``bucket -> leader address`` as cached ('' while a leader is not live)."""
        return self.physical.leaders()

    def send(self, routing: Routing, address: str, method: str, request, *, idempotent: bool,
             timeout_s: float | None = None, buckets: Sequence[int] = (), long_poll: bool = False):
        """One RPC to ``address``; gRPC failures and response errors become typed exceptions. ``buckets``: the
        buckets it goes to ``address`` as their leader for: it is given up (NotLeaderError) once the coordinator
        names another leader of one of them (client/leader_watch.py; an idempotent call only; ``long_poll``: the
        server may hold it until near its deadline)."""
        self._check_open()
        router = self.physical
        timeout_s = timeout_s or self.timeout_s
        call = getattr(router.stub(address), method)
        ports = router.channels.lookup_ports if method == "Lookup" and buckets else None  # client/lookup_port.py

        def moved() -> bool:
            return router.moved(address, buckets)

        def where() -> str:
            return f"tablet server {address}, the leader of bucket(s) {list(buckets)}"
        try:
            response = None if ports is None else ports.call(address, request, timeout_s, moved, where)
            if response is None and buckets and idempotent:
                response = call_watching(call, request, timeout_s, moved, long_poll=long_poll, where=where())
            elif response is None:
                response = call(request, timeout=timeout_s)
            if ports is not None:
                ports.learn(address, response.lookup_port)
        except (errors.NotLeaderError, errors.NetworkError):  # given up on a leader; the port's timeout
            router.stale(routing)
            raise
        except grpc.RpcError as exc:
            error = rpc_error(exc, method, address, timeout_s=timeout_s, idempotent=idempotent)
            if isinstance(error, REROUTE):
                router.stale(routing)
            raise error from None
        error = error_from_pb(response.error)
        if error is not None:
            if isinstance(error, REROUTE):
                router.stale(routing)
            raise error
        return response

    def _call_bucket(self, bucket: int, method: str, request, *, idempotent: bool,
                     timeout_s: float | None = None, fenced: bool = False, watch: Callable | None = None,
                     long_poll: bool = False):
        """``method`` on the leader of ``bucket``, re-routed and retried as the module docstring says;
        ``fenced``: every attempt's request carries the leader epoch of the routing it goes by;
        ``watch`` wraps every attempt (:meth:`kvlease.client.idempotent.BucketWriter.watch`)."""
        router = self.physical
        router.check_bucket(bucket)  # else a bucket the table lacks is "no leader" until the retries end

        def attempt():
            routing = router.routing()
            address = router.leader(routing, bucket)
            if fenced:
                request.leader_epoch = router.leader_epoch(routing, bucket)
            return self.send(routing, address, method, request, idempotent=idempotent, timeout_s=timeout_s,
                             buckets=(bucket,), long_poll=long_poll)
        return self.retry.call(attempt if watch is None else watch(attempt))

    def map_parallel(self, func: Callable[[Any], Any], items: list) -> list[tuple[Any, BaseException | None]]:
        """``func`` of every item, in parallel on the client's pool when there are several (at most
        ``parallelism`` at a time): ``[(result, error)]`` in the order of ``items``."""
        if len(items) <= 1:
            results = []
            for item in items:
                try:
                    results.append((func(item), None))
                except Exception as exc:
                    results.append((None, exc))
            return results
        with self._lock:
            self._check_open()
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
        return table_input.row_batch(self.codec, rows)

    def key_batch(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """Primary-key columns from dicts, tuples (primary-key order), scalars (one-column key), or a batch."""
        return table_input.key_batch(self.codec, keys)

    def split(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch, np.ndarray]]:
        """``[(bucket, rows of that bucket, their indices in batch)]`` for the buckets that get rows
        (see :func:`kvlease.client.table_input.split`)."""
        return table_input.split(self.codec, batch)

    # -- writes --------------------------------------------------------------------------------

    def upsert(self, rows: Sequence[dict] | pa.RecordBatch | pa.Table, *, partial: bool = False
               ) -> dict[Any, tuple[int, int]]:
        """Insert or replace rows; returns ``{bucket: (base_offset, next_offset)}`` of the changelog (of a
        partitioned table: ``{(partition, bucket): …}``; several runs of a partial update: the last run's).
        A full row's missing columns are null; with ``partial``, a row's columns not given keep their values
        (a new key: null): a dict's missing key is not written, its ``None`` is a null; an Arrow batch's
        columns are the ones written (docs/merge-engines.md). A table's merge engine decides what a write to
        an existing key does."""
        if partial:
            written: dict = {}
            for batch in table_writes.partial_batches(self.codec, rows):
                written.update(self._write_batch(batch, "upserts", partial=True))
            return written
        if self.partitions is not None:
            return self.partitions.write(table_input.row_batch(self.codec, rows), "upserts")
        return table_writes.write_parts(self, table_input.rows_by_bucket(self.codec, rows), "upserts")

    def retract(self, rows: Sequence[dict] | pa.RecordBatch | pa.Table) -> dict[Any, tuple[int, int]]:
        """Take rows' values back out of an aggregation table (sum: subtracted, product: divided, last_value:
        cleared; a null or missing column: nothing); offsets like :meth:`upsert`. InvalidRequestError on a
        table without the aggregation merge engine, InvalidRowError for a column whose function keeps no
        history (max, min, first_value, listagg, bool_*) (docs/merge-engines.md, "Retract")."""
        return self._write_batch(table_input.row_batch(self.codec, rows), "retracts")

    def delete(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> dict[Any, tuple[int, int]]:
        """Delete rows by primary key (missing keys are ignored; a merge engine's delete behaviour may ignore
        or refuse them); offsets like :meth:`upsert`."""
        if self.partitions is not None:
            return self.partitions.write(table_input.key_batch(self.codec, keys), "deletes")
        return table_writes.write_parts(self, table_input.keys_by_bucket(self.codec, keys), "deletes")

    def _write_batch(self, batch: pa.RecordBatch, field: str, partial: bool = False) -> dict[Any, tuple[int, int]]:
        """A checked batch sent as ``field`` (of a partitioned table: through its partitions' clients)."""
        if self.partitions is not None:
            return self.partitions.write(batch, field, partial=partial)
        return table_writes.write_parts(self, table_input.split_checked(self.codec, batch), field, partial)

    # -- reads ---------------------------------------------------------------------------------

    def lookup_batch(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """The rows of ``keys``, one per key in input order (table schema); every column is null
        where the key does not exist (a found row never has a null primary-key column)
        (client/point_lookup.py)."""
        if self.partitions is not None:
            return self.partitions.lookup_batch(table_input.key_batch(self.codec, keys))
        return point_lookup.lookup_batch(self, keys, packed=self.packed_lookups)

    def lookup_prefix_batch(self, prefixes: Any) -> pa.RecordBatch:
        """Every row whose key starts with one of ``prefixes`` (values of the table's bucket key: dicts, tuples,
        bare values of a one-column bucket key, or an Arrow batch), prefix by prefix (client/prefix_lookup.py)."""
        return prefix_lookup.lookup_prefix_batch(self, prefixes)

    def lookup_prefix(self, prefixes: Any) -> list[dict]:
        """:meth:`lookup_prefix_batch` as dicts."""
        return self.lookup_prefix_batch(prefixes).to_pylist()

    def lookup(self, keys: Sequence[Any] | pa.RecordBatch | pa.Table) -> list[dict | None]:
        """The row (a dict) of every key, None where it does not exist; aligned with ``keys``. A few keys
        of one bucket go without Arrow (client/lean_lookup.py), with the same answer."""
        rows = lean_lookup.lookup(self, keys)
        if rows is not None:
            return rows
        batch = self.lookup_batch(keys)
        found = batch.column(self.table.primary_key[0]).is_valid().to_numpy(zero_copy_only=False)
        rows = batch.to_pylist()
        return [row if hit else None for row, hit in zip(rows, found)]

    def fetch_log_batch(self, bucket: int, from_offset: int, max_bytes: int = DEFAULT_FETCH_BYTES,
                        last_fetched_epoch: int | None = None, max_wait_ms: int = 0) -> tuple[pa.RecordBatch, int]:
        """``(records, log_end_offset)`` from ``from_offset`` on (at least one entry when there are any).

        ``records`` is in :func:`kvlease.client.log_records.log_schema`: ``offset``
        (int64), ``change_type`` (int8, see :class:`kvlease.common.logentry.ChangeType`),
        ``timestamp`` (int64 ms since the epoch, the append time of the
        record's changelog entry; null for entries older than format version
        2), then the table's columns: the row of +I/+U, the before-image of
        -U/-D (the key columns only if a record carries no value).
        ``last_fetched_epoch``, ``max_wait_ms``: see :meth:`fetch_log_entries`.
        """
        entries, end = self.fetch_log_entries(bucket, from_offset, max_bytes, last_fetched_epoch, max_wait_ms)
        return self._log_batch(entries), end

    def _log_batch(self, entries: list[LogEntry]) -> pa.RecordBatch:
        batches = [b for b in (entry_records(e) for e in entries) if b.num_rows]
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=log_schema(self.codec))
        return decode_records(self.codec, batches[0] if len(batches) == 1 else pa.concat_batches(batches))

    def fetch_log(self, bucket: int, from_offset: int, max_bytes: int = DEFAULT_FETCH_BYTES,
                  last_fetched_epoch: int | None = None, max_wait_ms: int = 0) -> tuple[list[dict], int]:
        """``(records, log_end_offset)``; each record ``{"offset", "change_type" ("+I", "-U", "+U",
        "-D"), "timestamp" (int ms since the epoch, or None for an entry older than format version
        2), "row"}`` (see :meth:`fetch_log_batch` for what ``row`` holds; :meth:`fetch_log_entries` for
        ``last_fetched_epoch`` and ``max_wait_ms``; :meth:`fetch_log_from` keeps the epoch for you)."""
        batch, end = self.fetch_log_batch(bucket, from_offset, max_bytes, last_fetched_epoch, max_wait_ms)
        return log_rows(batch), end

    def fetch_log_from(self, bucket: int, position: LogPosition, max_bytes: int = DEFAULT_FETCH_BYTES,
                       max_wait_ms: int = 0) -> tuple[list[dict], int, LogPosition]:
        """:meth:`fetch_log` from ``position`` (:class:`kvlease.client.log_position.LogPosition`), fenced by its
        epoch: ``(records, log_end_offset, the position after them)``. DataLostError if offsets read
        before ``position`` were lost and are reused (not retried). ``max_wait_ms``: see :meth:`fetch_log_entries`."""
        entries, end = self.fetch_log_entries(bucket, position.offset, max_bytes, position.epoch, max_wait_ms)
        return log_rows(self._log_batch(entries)), end, position.after(entries)

    def fetch_log_entries(self, bucket: int, from_offset: int, max_bytes: int = DEFAULT_FETCH_BYTES,
                          last_fetched_epoch: int | None = None, max_wait_ms: int = 0) -> tuple[list[LogEntry], int]:
        """``(entries, log_end_offset)``: the changelog entries from ``from_offset`` on as they are stored
        (raw keys and values; records below ``from_offset`` dropped), at least one when there are any.
        ``last_fetched_epoch``: the leader epoch of the entry just below ``from_offset`` as this reader
        read it (the previous answer's last entry's ``leader_epoch``): DataLostError, not retried, if
        the bucket's log no longer holds it there (``client/log_position.py``). None: not checked.
        ``max_wait_ms`` > 0: a long poll: with nothing committed at or above ``from_offset`` yet, the leader
        answers as soon as something is (or after that long, with no entries); the same answer as without it,
        only sooner than polling (``tablet/log/waits.py``; at most 30 s). The call's deadline is past the wait;
        while it waits, the coordinator is asked every second whether the leader moved (then NotLeaderError, and
        the retry goes to the new leader: client/leader_watch.py)."""
        with arguments("fetch_log"):
            if max_wait_ms < 0:
                raise errors.InvalidRequestError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
            request = pb.FetchLogRequest(table_id=self.table.table_id, partition_id=self.table.partition_id,
                                         bucket=bucket, from_offset=from_offset, max_bytes=max_bytes,
                                         last_fetched_epoch=last_fetched_epoch, max_wait_ms=max_wait_ms)
        timeout_s = self.timeout_s + max_wait_ms / 1000.0 if max_wait_ms else None  # the wait is not a timeout
        response = self._call_bucket(bucket, "FetchLog", request, idempotent=True, timeout_s=timeout_s,
                                     long_poll=max_wait_ms > 0)
        return [decode_entry(data, from_offset=from_offset) for data in response.entries], response.log_end_offset

    def trigger_snapshot(self, wait: bool = True) -> list[CommittedSnapshot]:
        """Snapshot every changed bucket of the table now, on every leader; with ``wait``, returns
        the snapshots committed (buckets unchanged since their last snapshot are skipped). Raises if
        a bucket was not committed; :func:`kvlease.client.snapshot_trigger.trigger_snapshots` tells each
        bucket's outcome instead, the failed ones too."""
        outcomes = trigger_snapshots(self, wait=wait)
        raise_failed(outcomes, self.table.path)
        return [o.snapshot for o in outcomes if o.state == COMMITTED and o.snapshot is not None]

    # -- live scans (client/scanner.py) ------------------------------------------------------------

    def scanner(self, bucket: int, *, streaming: bool = False, **options):
        """A scanner of one bucket: :class:`kvlease.client.scanner.KvBatchScanner` (ScanKv sessions, one request
        in flight) or, with ``streaming``, :class:`kvlease.client.stream_scanner.KvStreamScanner` (ScanKvStream).
        ``options``: ``limit``, ``batch_size_bytes``, ``start_after_key``, ``resume``, ``decode``.
        Nothing is sent before the first poll; use it with ``with`` or read it to the end."""
        self._check_open()
        self.physical.check_bucket(bucket)
        options.setdefault("batch_size_bytes", self.scan_batch_bytes)
        options.setdefault("request_timeout_s", self.timeout_s)
        return (KvStreamScanner if streaming else KvBatchScanner)(
            self.physical.route(bucket), self.table, bucket, codec=self.codec, retry=self.retry, **options)

    def scan(self, limit: int | None = None, buckets: Iterable[int] | None = None, streaming: bool = False,
             **options):
        """Every live row of the table (or of ``buckets``): a :class:`kvlease.client.table_scan.ScanResult` with
        ``batches`` and ``log_offsets`` ``{bucket: first changelog offset not in the scan}``. See
        :func:`kvlease.client.table_scan.scan_table` (parallel buckets; ``limit`` over the whole table)."""
        return scan_table(self, limit=limit, buckets=None if buckets is None else list(buckets),
                          streaming=streaming, **options)

