"""Which physical table a request names (tablet/replicas/held_tables.py), and the pushes a tablet server refuses
for naming partitions wrongly (tablet/replication/roles.py): pure, no processes."""

from __future__ import annotations

import pytest

from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import Column, TableInfo
from kvlease.common.wire import table_to_pb
from kvlease.tablet.replicas.held_tables import HeldTables
from kvlease.tablet.replication.roles import BucketRole

pytestmark = pytest.mark.unit

COLUMNS = (Column("id", "BIGINT"), Column("day", "STRING"), Column("v", "STRING"))
EVENTS = TableInfo(3, "db", "events", COLUMNS, ("id", "day"), 2, partition_key=("day",))
P1, P2 = EVENTS.of_partition(4, "20261127"), EVENTS.of_partition(5, "20261128")
OTHER = TableInfo(6, "db", "other", COLUMNS, ("id", "day"), 1, partition_key=("day",)).of_partition(7, "x")
PLAIN = TableInfo(8, "db", "plain", COLUMNS[:1], ("id",), 1)
ELSEWHERE = 9  # a partition of EVENTS that ZooKeeper has and this server does not hold


def held(zookeeper=True) -> HeldTables:
    """Views of two partitions of EVENTS, a partition of OTHER and PLAIN; ZooKeeper (asked only of partitions not
    held) has partition 9 of EVENTS."""
    tables = HeldTables({ELSEWHERE: EVENTS.table_id}.get if zookeeper else None)
    tables.keep([P1, P2, OTHER, PLAIN])
    return tables


@pytest.mark.parametrize("table_id, partition_id, physical", [(3, 4, 4), (3, 5, 5), (6, 7, 7), (8, None, 8),
                                                               (42, None, 42)])  # 42: a table not held: as before
def test_a_request_resolves_to_the_physical_table_it_names(table_id, partition_id, physical):
    assert held().resolve(table_id, partition_id) == physical


@pytest.mark.parametrize("table_id, partition_id, error, words", [
    (3, None, errors.PartitionNotExistsError, "table 3 is partitioned: a request for one of its buckets must name"),
    (4, None, errors.TableNotExistError, "table id 4 does not exist: it is the id of a partition of table 3"),
    (3, 7, errors.PartitionNotExistsError, "partition 7 of table 3 does not exist: id 7 is of table 6"),
    (3, 8, errors.PartitionNotExistsError, "partition 8 of table 3 does not exist: id 8 is a table's"),
    (8, 4, errors.InvalidRequestError, "table 8 is not partitioned: leave partition_id unset (it is 4)"),
    (3, 99, errors.PartitionNotExistsError, "partition 99 of table 3 does not exist (never created, or dropped)"),
    (6, 9, errors.PartitionNotExistsError, "partition 9 of table 6 does not exist"),  # ZooKeeper has it of 3
    (3, 9, errors.NotLeaderError, "holds no bucket of partition 9 of table 3: retry on the bucket's leader"),
])
def test_a_request_naming_no_held_physical_table_is_refused_by_what_is_wrong(table_id, partition_id, error, words):
    with pytest.raises(error) as refusal:
        held().resolve(table_id, partition_id)
    assert type(refusal.value) is error and words in refusal.value.message
    assert "events" not in refusal.value.message  # ids only: resolved before the caller's access is checked


def test_without_zookeeper_a_partition_not_held_does_not_exist():
    with pytest.raises(errors.PartitionNotExistsError):
        held(zookeeper=False).resolve(3, ELSEWHERE)


def test_dropping_a_partitioned_tables_id_drops_the_partitions_of_it_held():
    assert held().dropped([3, 99]) == {3, 4, 5, 99}
    assert held().dropped([4]) == {4}


def bucket_pb(view: TableInfo, **fields) -> pb.BucketLeadershipPb:
    return pb.BucketLeadershipPb(table=table_to_pb(view), bucket=1, leader_epoch=2, **fields)


def test_a_push_of_a_partition_is_held_by_the_partitions_id():
    role = BucketRole.from_pb(bucket_pb(P2, partition_id=5), P2, 1)
    assert role.key == (5, 1) and role.table.table_id == 3 and role.table.bucket(1).partition_id == 5


@pytest.mark.parametrize("view, fields, words", [
    (EVENTS, {}, "a partitioned table has no buckets of its own"),
    (PLAIN.of_partition(11, "x"), {}, "of partition 11, but the table is not partitioned"),
    (P1, {"partition_id": 5}, "with partition_id 5, but its table view is of partition 4"),
    (PLAIN, {"partition_id": 5}, "with partition_id 5, but its table is not partitioned"),
])
def test_a_push_naming_a_partition_wrongly_is_refused(view, fields, words):
    with pytest.raises(errors.InvalidRequestError, match=words):
        BucketRole.from_pb(bucket_pb(view, **fields), view, 1)
