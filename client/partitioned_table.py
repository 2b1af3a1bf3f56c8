"""Writes and lookups of a partitioned table: rows split by partition, each part through its partition's
table client (docs/partitions.md).

A row's partition is named by its partition-key values
(:func:`kvlease.common.partition_names.partition_name`; an auto-partitioned table's values must be of
its time unit). Each partition is a physical table with its own buckets, so each part goes through a
:class:`kvlease.client.table.TableClient` opened on that partition (kept while the client lives). A
write to a partition that does not exist creates it first (``create_partitions``, on by default; off:
``PARTITION_NOT_EXISTS``, nothing written), with ``ignore_if_exists`` so that writers racing to make it
and a retry after a lost answer all succeed. A lookup of a key whose partition does not exist finds
nothing. A partition dropped meanwhile (``PARTITION_NOT_EXISTS`` from its client) is forgotten, and a
write made again after it creates it anew.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from kvlease.client import table_input
from kvlease.common import errors
from kvlease.common.auto_partition import value_problem
from kvlease.common.codec import RowCodec
from kvlease.common.partition_names import partition_name, value_text
from kvlease.common.tables import TableInfo

#: Partitions a write may make at once: a batch naming more is refused (it is almost surely a wrong column).
MAX_NEW_PARTITIONS_PER_WRITE = 100


class PartitionedWrites:
    """One partitioned table's writes and lookups; thread-safe. ``open_partition(name, create)`` gives the
    partition's table client (None: it does not exist and ``create`` is false)."""

    def __init__(self, admin, table: TableInfo, codec: RowCodec, open_client: Callable[[TableInfo], Any],
                 create_partitions: bool = True) -> None:
        self.admin = admin
        self.table = table
        self.codec = codec
        self.create_partitions = create_partitions
        self._open_client = open_client
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}  # partition name -> its TableClient
        self._known: dict[str, TableInfo] | None = None  # partition name -> view (None: not listed yet)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # -- splitting --------------------------------------------------------------------------------

    def by_partition(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        """``{partition name: indices of its rows in batch}``, in first-seen order; InvalidRowError (one line)
        for a row whose partition value cannot name a partition."""
        columns = [batch.column(name).to_pylist() for name in self.table.partition_key]
        types = {c.name: c.type for c in self.table.columns}
        groups: dict[str, list[int]] = {}
        for row in range(batch.num_rows):
            try:
                values = [value_text(types[name], column[row], column=name)
                          for name, column in zip(self.table.partition_key, columns)]
            except errors.KvLeaseError as exc:
                raise errors.InvalidRowError(f"row {row}: {exc.message}", row=row) from None
            groups.setdefault(partition_name(self.table.partition_key, values), []).append(row)
        auto = self.table.auto_partition
        if auto is not None:
            for name, rows in groups.items():
                problem = value_problem(auto.unit, name)
                if problem is not None:
                    raise errors.InvalidRowError(f"row {rows[0]}: {problem}", row=rows[0])
        return {name: np.asarray(rows, dtype=np.int64) for name, rows in groups.items()}

    # -- the partitions' clients -------------------------------------------------------------------

    def client(self, name: str, create: bool) -> Any | None:
        """The table client of partition ``name``; made (and the partition created, if ``create``) the first
        time; None if it does not exist and is not created."""
        with self._lock:
            found = self._clients.get(name)
        if found is not None:
            return found
        view = self._view(name, create)
        if view is None:
            return None
        client = self._open_client(view)
        with self._lock:
            existing = self._clients.setdefault(name, client)
        if existing is not client:
            client.close()
        return existing

    def _view(self, name: str, create: bool) -> TableInfo | None:
        known = self._listing()
        if name in known:
            return known[name]
        known = self._listing(again=True)  # made by another writer since
        if name in known:
            return known[name]
        if not create:
            return None
        _table, made = self.admin.create_partition(self.table.path, name, ignore_if_exists=True)
        view = self.table.of_partition(made.partition_id, made.name)
        with self._lock:
            self._known = {**(self._known or {}), made.name: view}
        return view

    def _listing(self, again: bool = False) -> dict[str, TableInfo]:
        with self._lock:
            known = self._known
        if known is None or again:
            _table, partitions = self.admin.list_partitions(table_id=self.table.table_id)
            known = {p.name: self.table.of_partition(p.partition_id, p.name) for p in partitions}
            with self._lock:
                self._known = known
        return known

    def forget(self, name: str) -> None:
        """Partition ``name`` was dropped: its client goes (a later write creates the partition anew)."""
        with self._lock:
            client = self._clients.pop(name, None)
            if self._known is not None:
                self._known.pop(name, None)
        if client is not None:
            client.close()

    # -- writes and lookups -------------------------------------------------------------------------

    def write(self, batch: pa.RecordBatch, field: str, partial: bool = False) -> dict[tuple[str, int], tuple[int, int]]:
        """Upsert (``field`` "upserts", ``partial``: the batch's columns are the ones written), retract ("retracts")
        or delete ("deletes") a checked batch: ``{(partition, bucket):
        (base_offset, next_offset)}``. A partition that fails stops the write: the error carries the parts
        written (``details["written"]``)."""
        groups = self.by_partition(batch)
        self._check_new(groups)
        written: dict[tuple[str, int], tuple[int, int]] = {}
        for name, rows in groups.items():
            client = self.client(name, self.create_partitions)
            if client is None:
                raise errors.PartitionNotExistsError(
                    f"partition {name} of table {self.table.path} does not exist and this client does not create "
                    f"partitions (create_partitions=False): kvlease partition add {self.table.path} {name}",
                    table=self.table.path, partition=name, written=written)
            part = batch.take(pa.array(rows))
            try:
                offsets = (client.upsert(part, **({"partial": True} if partial else {})) if field == "upserts" else
                           client.retract(part) if field == "retracts" else client.delete(part))
            except errors.PartitionNotExistsError:
                self.forget(name)
                raise
            except errors.KvLeaseError as exc:
                exc.details["written"] = {**written, **{(name, b): o for b, o in exc.details.get("written", {}).items()}}
                raise
            written.update({(name, bucket): o for bucket, o in offsets.items()})
        return written

    def _check_new(self, groups: dict[str, np.ndarray]) -> None:
        known = self._listing()
        new = [name for name in groups if name not in known]
        if len(new) > MAX_NEW_PARTITIONS_PER_WRITE:
            raise errors.InvalidRequestError(
                f"one write names {len(new)} partitions of table {self.table.path} that do not exist (at most "
                f"{MAX_NEW_PARTITIONS_PER_WRITE} are made by one write), e.g. {', '.join(new[:3])}: is the "
                f"partition column {', '.join(self.table.partition_key)} right?", table=self.table.path)

    def lookup_batch(self, keys: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``keys`` (checked), aligned with them; nulls where not found (also where the key's
        partition does not exist)."""
        groups = self.by_partition(keys)
        position = np.zeros(keys.num_rows, dtype=np.int64)
        found = np.zeros(keys.num_rows, dtype=bool)
        parts, base = [], 0
        for name, rows in groups.items():
            client = self.client(name, create=False)
            if client is None:
                continue
            try:
                got = client.lookup_batch(keys.take(pa.array(rows)))
            except errors.PartitionNotExistsError:  # dropped meanwhile: nothing there
                self.forget(name)
                continue
            hit = got.column(self.table.primary_key[0]).is_valid().to_numpy(zero_copy_only=False)
            position[rows[hit]] = base + np.arange(int(hit.sum()))
            found[rows[hit]] = True
            parts.append(got.filter(pa.array(hit)))
            base += int(hit.sum())
        return table_input.concat(parts, self.codec.schema).take(pa.array(position, mask=~found))

