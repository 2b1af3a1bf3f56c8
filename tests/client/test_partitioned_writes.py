"""How a partitioned table's client splits rows by partition and when it makes partitions (a fake admin
client; the real thing: test_partitioned_table_cluster.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kvlease.client.partitioned_table import MAX_NEW_PARTITIONS_PER_WRITE, PartitionedWrites
from kvlease.client.partitions_admin import PartitionInfo
from kvlease.common import errors
from kvlease.common.auto_partition import AutoPartition, TimeUnit
from kvlease.common.codec import RowCodec
from kvlease.common.tables import Column, TableInfo

pytestmark = pytest.mark.unit

COLUMNS = (Column("region", "STRING"), Column("n", "INT"), Column("id", "BIGINT"))


class FakeAdmin:
    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self.partitions: dict[str, int] = {}
        self.created: list[str] = []

    def list_partitions(self, path=None, *, table_id=None):
        return self.table, [PartitionInfo(pid, name) for name, pid in sorted(self.partitions.items())]

    def create_partition(self, path, name, ignore_if_exists=False):
        self.created.append(name)
        pid = self.partitions.setdefault(name, 100 + len(self.partitions))
        return self.table, PartitionInfo(pid, name)


class FakeClient:
    def __init__(self, view: TableInfo, log: list) -> None:
        self.view, self.log = view, log

    def upsert(self, batch):
        self.log.append((self.view.partition_name, batch.column("id").to_pylist()))
        return {0: (0, batch.num_rows)}

    def close(self):
        pass


def writes(table: TableInfo, create=True):
    admin, log = FakeAdmin(table), []
    return admin, log, PartitionedWrites(admin, table, RowCodec(table), lambda view: FakeClient(view, log), create)


def batch(table: TableInfo, rows):
    return RowCodec(table).validate(pa.RecordBatch.from_pylist(rows, schema=RowCodec(table).schema))


def test_rows_split_by_the_partition_their_key_values_name_in_partition_key_order():
    table = TableInfo(1, "db", "t", COLUMNS, ("region", "n", "id"), 2, partition_key=("region", "n"))
    admin, log, w = writes(table)
    rows = [{"region": "eu", "n": 1, "id": 1}, {"region": "us", "n": 1, "id": 2}, {"region": "eu", "n": 1, "id": 3},
            {"region": "eu", "n": -2, "id": 4}]
    written = w.write(batch(table, rows), "upserts")
    assert sorted(log) == [("region=eu/n=-2", [4]), ("region=eu/n=1", [1, 3]), ("region=us/n=1", [2])]
    assert set(written) == {("region=eu/n=1", 0), ("region=us/n=1", 0), ("region=eu/n=-2", 0)}
    assert admin.created == ["region=eu/n=1", "region=us/n=1", "region=eu/n=-2"]
    w.write(batch(table, rows[:1]), "upserts")
    assert len(admin.created) == 3  # known now: not asked again


def test_without_creation_a_missing_partition_fails_the_write_before_anything_is_sent():
    table = TableInfo(1, "db", "t", COLUMNS, ("region", "id"), 2, partition_key=("region",))
    admin, log, w = writes(table, create=False)
    with pytest.raises(errors.PartitionNotExistsError):
        w.write(batch(table, [{"region": "eu", "n": 1, "id": 1}]), "upserts")
    assert log == [] and admin.created == []


def test_a_value_outside_the_alphabet_or_off_the_time_unit_is_refused_naming_the_row():
    table = TableInfo(1, "db", "t", COLUMNS, ("region", "id"), 2, partition_key=("region",),
                      auto_partition=AutoPartition(TimeUnit.DAY))
    admin, log, w = writes(table)
    with pytest.raises(errors.InvalidRowError, match="row 1: partition column .region.: bad partition value .a b."):
        w.write(batch(table, [{"region": "20261127", "n": 1, "id": 1}, {"region": "a b", "n": 1, "id": 2}]),
                "upserts")
    with pytest.raises(errors.InvalidRowError, match="row 0: .*yyyyMMdd"):
        w.write(batch(table, [{"region": "2026-11-27", "n": 1, "id": 1}]), "upserts")
    assert log == [] and admin.created == []


def test_one_write_makes_at_most_a_hundred_partitions():
    table = TableInfo(1, "db", "t", COLUMNS, ("region", "id"), 2, partition_key=("region",))
    admin, log, w = writes(table)
    rows = [{"region": f"r{i}", "n": 1, "id": i} for i in range(MAX_NEW_PARTITIONS_PER_WRITE + 1)]
    with pytest.raises(errors.InvalidRequestError, match="partition column region right"):
        w.write(batch(table, rows), "upserts")
    assert admin.created == []
    w.write(batch(table, rows[:MAX_NEW_PARTITIONS_PER_WRITE]), "upserts")
    assert len(admin.created) == MAX_NEW_PARTITIONS_PER_WRITE
