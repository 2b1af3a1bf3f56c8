"""A table's wire form (common/wire.py): partitioning, auto-partitioning and a partition's view travel whole."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.common.auto_partition import AutoPartition, TimeUnit
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.tables import DEFAULT_MAX_PARTITIONS, Column, TableInfo
from kvlease.common.wire import table_from_pb, table_to_pb

pytestmark = pytest.mark.unit

COLUMNS = (Column("id", "BIGINT"), Column("day", "STRING"))
PARTITIONED = TableInfo(3, "db", "events", COLUMNS, ("id", "day"), 2, 5, 2, 1, partition_key=("day",),
                        max_partitions=20, auto_partition=AutoPartition(TimeUnit.DAY, 3, -1, "Europe/Berlin"))
PLAIN = TableInfo(1, "db", "plain", COLUMNS[:1], ("id",), 4)


@pytest.mark.parametrize("table", [PLAIN, PARTITIONED, PARTITIONED.of_partition(7, "20261127"),
                                   TableInfo(**{**PARTITIONED.__dict__, "auto_partition": None})],
                         ids=["plain", "partitioned", "partition-view", "by-hand"])
def test_a_table_and_a_partitions_view_travel_whole(table):
    assert table_from_pb(pb.TableInfoPb.FromString(table_to_pb(table).SerializeToString())) == table


def test_the_wire_form_names_the_partition_and_the_auto_partitioning():
    msg = table_to_pb(PARTITIONED.of_partition(7, "20261127"))
    assert (msg.table_id, msg.partition_id, msg.partition_name, list(msg.partition_key)) == (3, 7, "20261127", ["day"])
    assert (msg.auto_partition.time_unit, msg.auto_partition.precreate, msg.auto_partition.retention,
            msg.auto_partition.time_zone, msg.max_partitions) == ("DAY", 3, -1, "Europe/Berlin", 20)
    plain = table_to_pb(PLAIN)
    assert not plain.HasField("partition_id") and not plain.HasField("auto_partition") and not plain.max_partitions


def test_unset_limits_and_zones_read_as_their_defaults():
    msg = table_to_pb(PARTITIONED)
    msg.max_partitions = 0
    msg.auto_partition.time_zone = ""
    table = table_from_pb(msg)
    assert table.max_partitions == DEFAULT_MAX_PARTITIONS and table.auto_partition.time_zone == "UTC"


def test_a_bad_auto_partitioning_is_refused_naming_it():
    msg = table_to_pb(PARTITIONED)
    msg.auto_partition.time_unit = "FORTNIGHT"
    with pytest.raises(errors.InvalidTableError, match="table.auto-partition.time-unit"):
        table_from_pb(msg)
