"""A table on the wire keeps its partitioning (docs/partitions.md): the partition key, the partition limit,
auto-partitioning, and on a partition's view its id and name; an unpartitioned table stays one."""

from __future__ import annotations

import pytest

from kvlease.common.auto_partition import AutoPartition, TimeUnit
from kvlease.common.tables import DEFAULT_MAX_PARTITIONS, Column, TableInfo
from kvlease.common.wire import table_from_pb, table_to_pb

pytestmark = pytest.mark.unit

COLUMNS = (Column("day", "STRING"), Column("id", "BIGINT"))


def test_a_partitioned_table_and_its_partitions_view_cross_the_wire_whole():
    table = TableInfo(5, "shop", "events", COLUMNS, ("day", "id"), 2, 1_700_000_000_000, 3, 2,
                      partition_key=("day",), max_partitions=50,
                      auto_partition=AutoPartition(TimeUnit.HOUR, 3, -1, "Europe/Berlin"))
    assert table_from_pb(table_to_pb(table)) == table
    view = table.of_partition(9, "2026112714")
    assert table_from_pb(table_to_pb(view)) == view and table_from_pb(table_to_pb(view)).physical_id == 9


def test_an_unpartitioned_table_stays_unpartitioned():
    table = TableInfo(5, "db", "t", COLUMNS, ("day", "id"), 4)
    back = table_from_pb(table_to_pb(table))
    assert back == table and not back.partitioned and back.partition_id is None
    by_hand = TableInfo(6, "db", "p", COLUMNS, ("day", "id"), 1, partition_key=("day",))
    assert table_from_pb(table_to_pb(by_hand)).max_partitions == DEFAULT_MAX_PARTITIONS
