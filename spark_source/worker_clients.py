"""A Python worker's admin and table clients, kept for the worker's next tasks.

Spark reuses a Python worker for later tasks (``spark.python.worker.reuse``,
on by default): every micro-batch of a streaming query reads its splits in
the same few workers. A task used to make its own admin client and table
client (new gRPC channels, a coordinator call for the table's metadata,
4-9 ms of the 15-20 ms a micro-batch's read of 20 changes took) and close
them. :func:`clients` lends a task the pair a finished task left for the
same read (the same coordinators and security settings, table, partition
and schema read as), or makes one. A pair goes back for the next task only
when its task read every row; a task that failed or stopped early closes
its pair, so a failure never reaches the next task through a client. Kept
clients behave as any long-lived client: their calls find a bucket's new
leader and retry (``client/table.py``); a reader's answers do not depend
on which client made the call. At most :data:`KEPT` pairs wait, the
oldest closed first; a pair is lent to one task at a time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common.tables import TableInfo
from kvlease.spark_source.options import connect, open_table

#: Client pairs kept at most in a worker (a worker reads one split at a time; a few reads may alternate).
KEPT = 4

_lock = threading.Lock()
_idle: OrderedDict[tuple, list[tuple[AdminClient, TableClient]]] = OrderedDict()


@contextmanager
def clients(bootstrap: tuple[str, ...], security: tuple, table: TableInfo,
            view: TableInfo) -> Iterator[tuple[AdminClient, TableClient]]:
    """An admin client of ``bootstrap`` and a client of ``view`` (``table`` or a partition's view of it)
    reading as ``table``'s columns, for the caller alone; kept for a later task if the block ends normally,
    closed if it raises (GeneratorExit included: a read Spark stopped early)."""
    key = (bootstrap, security, repr(table), repr(view))
    pair = _take(key) or _make(bootstrap, security, table, view)
    try:
        yield pair
    except BaseException:
        _close(pair)
        raise
    _keep(key, pair)


def _make(bootstrap: tuple[str, ...], security: tuple, table: TableInfo,
          view: TableInfo) -> tuple[AdminClient, TableClient]:
    admin = connect(bootstrap, security)
    try:
        return admin, open_table(admin, table.table_id, security,
                                 partition=view if view.partition_id is not None else None, read_as=table.columns)
    except BaseException:
        admin.close()
        raise


def _take(key: tuple) -> tuple[AdminClient, TableClient] | None:
    with _lock:
        pairs = _idle.get(key)
        if not pairs:
            return None
        pair = pairs.pop()
        if not pairs:
            del _idle[key]
        return pair


def _keep(key: tuple, pair: tuple[AdminClient, TableClient]) -> None:
    evicted = []
    with _lock:
        _idle.setdefault(key, []).append(pair)
        _idle.move_to_end(key)
        while sum(len(p) for p in _idle.values()) > KEPT:
            oldest = next(iter(_idle))
            evicted.append(_idle[oldest].pop(0))
            if not _idle[oldest]:
                del _idle[oldest]
    for old in evicted:
        _close(old)


def _close(pair: tuple[AdminClient, TableClient]) -> None:
    admin, table = pair
    try:
        table.close()
    finally:
        admin.close()


def close_all() -> None:
    """Close every kept pair (tests; a worker's exit closes them anyway)."""
    with _lock:
        pairs = [pair for kept in _idle.values() for pair in kept]
        _idle.clear()
    for pair in pairs:
        _close(pair)


def kept() -> int:
    """How many pairs wait for a task now."""
    with _lock:
        return sum(len(p) for p in _idle.values())
