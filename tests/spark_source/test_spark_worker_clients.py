"""A Python worker keeps a finished read's clients for its next task (``spark_source/worker_clients.py``), and a
change feed's read joins its changelog entries into few batches: run in-process against a real cluster, the
reads Spark's worker makes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kvlease.client.table import TableClient
from kvlease.spark_source import options as opts
from kvlease.spark_source import worker_clients
from kvlease.spark_source.reader import _joined, read_split
from kvlease.spark_source.schema import table_schema
from kvlease.spark_source.splits import LogSplit, ReadContext
from tests.support.spark_tables import ALL_TYPES, kv, row  # noqa: F401  (kv is a fixture)


@pytest.fixture(autouse=True)
def no_kept_clients():
    worker_clients.close_all()
    yield
    worker_clients.close_all()


def _feed(kv, table: str, writes: int) -> ReadContext:
    """``table`` with ``writes`` upserts of one row each (an entry each); the context of a change-feed read."""
    kv.create_table(table, ALL_TYPES, ["id"], 1)
    with TableClient(kv.admin, table) as client:
        for i in range(writes):
            client.upsert([row(i)])
    options = opts.parse({"bootstrap": kv.coordinator.address, "table": table})
    info = kv.admin.get_table(table)
    columns = tuple(f.name for f in table_schema(info, with_changes=True).fields)
    return ReadContext(options.bootstrap, info, None, columns)


def _rows(batches) -> list[tuple]:
    return [(r["_log_offset"], r["id"], r["name"], r["_change_type"]) for b in batches for r in b.to_pylist()]


def test_a_later_read_borrows_the_clients_and_reads_what_new_clients_read(kv):
    ctx = _feed(kv, "shop.feed", 20)
    first = list(read_split(ctx, LogSplit(0, 0, 12)))
    assert worker_clients.kept() == 1
    (admin, table), = next(iter(worker_clients._idle.values()))
    assert not table._closed
    second = list(read_split(ctx, LogSplit(0, 12, 20)))  # the next micro-batch's range
    assert worker_clients.kept() == 1 and next(iter(worker_clients._idle.values())) == [(admin, table)]
    worker_clients.close_all()
    fresh = list(read_split(ctx, LogSplit(0, 0, 20)))  # made anew
    assert _rows(first) + _rows(second) == _rows(fresh)
    assert [r[1] for r in _rows(fresh)] == list(range(20))  # every write once, in log order
    assert len(first) == 1 and first[0].num_rows == 12  # the entries joined: one batch, not 12
    assert table._closed  # close_all closed the kept pair


def test_a_read_stopped_early_or_failed_closes_its_clients_instead_of_keeping_them(kv, monkeypatch):
    ctx = _feed(kv, "shop.feed", 5)
    monkeypatch.setattr("kvlease.spark_source.reader.JOINED_ROWS", 1)  # a batch per entry
    rows = read_split(ctx, LogSplit(0, 0, 5))
    assert next(rows).num_rows == 1
    rows.close()  # Spark stops reading a split once a LIMIT has its rows
    assert worker_clients.kept() == 0
    with pytest.raises(Exception, match="bucket"):
        list(read_split(ctx, LogSplit(7, 0, 5)))  # the table has bucket 0 only
    assert worker_clients.kept() == 0
    assert _rows(read_split(ctx, LogSplit(0, 0, 5)))[-1][1] == 4 and worker_clients.kept() == 1


def test_at_most_kept_pairs_wait_and_the_oldest_is_closed(kv, monkeypatch):
    monkeypatch.setattr(worker_clients, "KEPT", 1)
    one, two = _feed(kv, "shop.one", 1), _feed(kv, "shop.two", 1)
    list(read_split(one, LogSplit(0, 0, 1)))
    (_, oldest), = next(iter(worker_clients._idle.values()))
    list(read_split(two, LogSplit(0, 0, 1)))
    assert worker_clients.kept() == 1
    assert oldest._closed


def test_joined_batches_keep_the_order_and_hand_on_the_rows_before_an_error():
    batches = [pa.record_batch({"a": [i, i + 100]}) for i in range(5)]
    assert [b.to_pydict()["a"] for b in _joined(iter(batches), rows=3)] == [[0, 100, 1, 101], [2, 102, 3, 103],
                                                                          [4, 104]]
    other = pa.record_batch({"b": ["x"]})  # another schema is never joined to the ones before
    assert [b.num_columns and b.schema.names for b in _joined(iter([batches[0], other]), 10)] == [["a"], ["b"]]

    def failing():
        yield from batches[:2]
        raise RuntimeError("fetch refused")

    joined = _joined(failing(), 10)
    assert next(joined).to_pydict()["a"] == [0, 100, 1, 101]
    with pytest.raises(RuntimeError, match="fetch refused"):
        next(joined)
