"""Schema evolution on real coordinators (ZooKeeper, gRPC on loopback), no tablet servers: each change
through the admin client, its history, retries, refusals, partitioned tables, tables stored before field
ids, drops, and a failover in the middle of an alter (docs/schemas.md, "Schema evolution")."""

from __future__ import annotations

import threading

import pytest

from kvlease.client.admin import AdminClient
from kvlease.common import errors, zkpaths
from kvlease.common.schema_changes import SchemaVersion
from kvlease.common.tables import Column
from kvlease.common.zk import dumps, loads
from kvlease.coordinator.server import CoordinatorServer
from kvlease.ops.wait import wait_until
from tests.support import coordinators

pytestmark = pytest.mark.zk

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING"), Column("n", "INT")]


@pytest.fixture
def pair(make_config):
    config = make_config({"kv.snapshot.lease.expiration-check-interval": "100ms",
                          "client.retry.total-timeout": "20s", "zookeeper.session-timeout": "3s"})
    with coordinators.pair(config) as servers:
        yield servers


@pytest.fixture
def admin(pair):
    with AdminClient([s.address for s in pair], retry_total_s=20) as client:
        yield client


def active(pair) -> CoordinatorServer:
    return next(s for s in pair if s.is_active)


def fail_over(pair) -> CoordinatorServer:
    """Stop the active coordinator; the standby, once it serves."""
    was = active(pair)
    was.stop()
    standby = next(s for s in pair if s is not was)
    wait_until(lambda: standby.is_active, 20, "the standby to take over")
    return standby


def test_each_change_makes_a_version_the_client_and_a_new_coordinator_see(admin, pair, zk_client):
    table = admin.create_table("db.t", COLUMNS, ["id"], 2)
    assert [c.id for c in table.columns] == [0, 1, 2] and table.schema_id == 1
    added = admin.alter_table("db.t", add_column="price BIGINT COMMENT 'in cents'")
    assert added.schema_id == 2 and added.columns[-1] == Column("price", "BIGINT", 3, "in cents")
    assert admin.alter_table("db.t", rename_column=("v", "label")).column("label").id == 1
    assert admin.alter_table("db.t", widen_column="n BIGINT").column("n").type == "BIGINT"
    assert [c.name for c in admin.alter_table("db.t", drop_column="price").columns] == ["id", "label", "n"]
    final = admin.alter_table("db.t", comment="one row per thing")
    assert final.schema_id == 6 and final.comment == "one row per thing"
    assert admin.get_table("db.t") == final
    shown, history = admin.schema_history("db.t")
    assert shown == final
    assert [(v.schema_id, v.change) for v in history] == [
        (1, "create"), (2, "add column price BIGINT"), (3, "rename column v to label"),
        (4, "widen column n INT to BIGINT"), (5, "drop column price"), (6, "comment")]
    assert history[0].columns == tuple(table.columns) and history[-1].columns == final.columns
    # one node per version, under the table's node
    assert sorted(zk_client.get_children(zkpaths.table_schemas(table.table_id)), key=int) == list("123456")
    node = loads(zk_client.get(zkpaths.table(table.table_id))[0])
    assert node["schema_id"] == 6 and node["comment"] == "one row per thing"
    # every reader learns the columns of the earlier schema ids its rows may carry, also from a new coordinator
    past = [(v.schema_id, v.columns) for v in history[:-1]]
    assert list(admin.get_table("db.t").past_schemas) == past
    fail_over(pair)
    assert admin.schema_history("db.t") == (final, history)
    assert list(admin.get_table("db.t").past_schemas) == past
    assert admin.get_table("db.t").columns_of(2) == history[1].columns and final.columns_of(9) is None


def test_a_columns_comment_given_at_create_is_kept(admin):
    made = admin.create_table("db.c", [Column("id", "BIGINT", comment="the order's id"), Column("v", "STRING")],
                              ["id"], 1)
    assert made.columns == (Column("id", "BIGINT", 0, "the order's id"), Column("v", "STRING", 1))
    assert admin.get_table("db.c") == made


def test_the_same_alter_sent_again_answers_the_same_schema_id_and_writes_nothing(admin, zk_client):
    table = admin.create_table("db.t", COLUMNS, ["id"], 1)
    for change in ({"add_column": "c INT"}, {"rename_column": ("c", "d")}, {"widen_column": "d BIGINT"},
                   {"drop_column": "v"}, {"comment": "x"}):
        first = admin.alter_table("db.t", **change)
        assert admin.alter_table("db.t", **change) == first  # a retry whose answer was lost
    assert len(admin.schema_history("db.t")[1]) == 6
    assert len(zk_client.get_children(zkpaths.table_schemas(table.table_id))) == 6


@pytest.mark.parametrize("change, error, says", [
    ({"add_column": "v INT"}, errors.InvalidTableError, "column v exists already in table db.t (STRING)"),
    ({"rename_column": ("id", "key")}, errors.InvalidTableError, "column id of table db.t is a primary key column"),
    ({"widen_column": "n STRING"}, errors.InvalidTableError, "cannot change column n from INT to STRING"),
    ({"widen_column": "id INT"}, errors.InvalidTableError, "it cannot be retyped"),
    ({"drop_column": "id"}, errors.InvalidTableError, "it cannot be dropped"),
    ({"add_column": "c WHATEVER"}, errors.InvalidTableError, "column 'c': bad column type 'WHATEVER'"),
    ({"add_column": "c INT", "drop_column": "v"}, errors.InvalidRequestError, "one schema change at a time"),
    ({"add_column": "c INT", "max_partitions": 3}, errors.InvalidRequestError, "one schema change at a time"),
    ({"rename_column": "v"}, errors.InvalidRequestError, "rename_column: (old name, new name)"),
])
def test_refused_changes_say_why_and_change_nothing(admin, change, error, says):
    admin.create_table("db.t", COLUMNS, ["id"], 1)
    with pytest.raises(error) as refused:
        admin.alter_table("db.t", **change)
    assert says in refused.value.message
    assert admin.get_table("db.t").schema_id == 1
    with pytest.raises(errors.TableNotExistError):
        admin.alter_table("db.nope", add_column="c INT")


def test_a_partitioned_tables_alter_reaches_every_partition_view(admin):
    table = admin.create_table("db.p", [Column("day", "STRING"), Column("id", "BIGINT")], ["day", "id"], 1,
                               partition_key=["day"])
    admin.create_partition("db.p", "20261127")
    with pytest.raises(errors.InvalidTableError, match="partition key column: it cannot be renamed"):
        admin.alter_table("db.p", rename_column=("day", "d"))
    altered = admin.alter_table("db.p", add_column="v STRING")
    _table, partitions = admin.list_partitions("db.p")
    view, _buckets = admin.get_table_assignment(table.table_id, partitions[0].partition_id)
    assert view.schema_id == altered.schema_id == 2 and view.columns == altered.columns
    assert view.past_schemas == ((1, table.columns),)  # a partition's rows are read as its table's
    later = admin.create_partition("db.p", "20261128")[1]  # a partition made after the alter
    assert admin.get_table_assignment(table.table_id, later.partition_id)[0].columns == altered.columns
    assert admin.alter_table("db.p", max_partitions=5).max_partitions == 5  # the partitioning alter still works


def test_a_table_stored_before_field_ids_loads_and_its_first_alter_keeps_its_first_version(admin, pair, zk_client):
    table = admin.create_table("db.old", COLUMNS, ["id"], 1)
    node = loads(zk_client.get(zkpaths.table(table.table_id))[0])
    node["schema"] = [{"name": c["name"], "type": c["type"]} for c in node["schema"]]
    del node["schema_id"]
    zk_client.set(zkpaths.table(table.table_id), dumps(node))  # as a coordinator before issue 42 wrote it
    fail_over(pair)
    loaded = admin.get_table("db.old")
    assert [c.id for c in loaded.columns] == [0, 1, 2] and loaded.schema_id == 1
    assert admin.schema_history("db.old")[1] == [SchemaVersion.current(loaded)]
    admin.alter_table("db.old", add_column="c INT")
    assert [v.schema_id for v in admin.schema_history("db.old")[1]] == [1, 2]


def test_a_drop_deletes_the_history_and_a_table_of_that_name_starts_again(admin, zk_client):
    table = admin.create_table("db.t", COLUMNS, ["id"], 1)
    admin.alter_table("db.t", add_column="c INT")
    admin.drop_table("db.t")
    assert not zk_client.exists(zkpaths.table(table.table_id))
    again = admin.create_table("db.t", COLUMNS, ["id"], 1)
    assert again.schema_id == 1 and [v.schema_id for v in admin.schema_history("db.t")[1]] == [1]


def test_a_failover_after_the_alters_write_answers_the_retry_with_the_same_schema_id(admin, pair, zk_client):
    """The active coordinator writes the alter, then goes before it answers (held after the ZooKeeper write,
    then stopped; its loop's answer is an unknown outcome). The client sends the alter again to the standby
    that took over, which finds it made: the same schema id, one version."""
    table = admin.create_table("db.t", COLUMNS, ["id"], 1)
    first = active(pair)
    written, release = threading.Event(), threading.Event()
    writer = first.serving_loop().controller.schemas.writer
    commit = writer.commit

    def held_commit(ops):
        commit(ops)
        if any(op.path.startswith(zkpaths.table_schemas(table.table_id)) for op in ops):
            written.set()
            release.wait(30)
            raise errors.OutcomeUnknownError("held after the write, then stopped (test)")
    writer.commit = held_commit
    answer: dict = {}
    alter = threading.Thread(target=lambda: answer.update(table=admin.alter_table("db.t", add_column="c BIGINT")))
    alter.start()
    assert written.wait(20), "the alter's write"
    assert loads(zk_client.get(zkpaths.table(table.table_id))[0])["schema_id"] == 2  # written, not answered
    stopping = threading.Thread(target=first.stop)
    stopping.start()
    release.set()
    standby = next(s for s in pair if s is not first)
    wait_until(lambda: standby.is_active, 20, "the standby to take over")
    alter.join(30)
    stopping.join(30)
    assert answer["table"].schema_id == 2 and answer["table"].column("c") == Column("c", "BIGINT", 3)
    assert admin.alter_table("db.t", add_column="c BIGINT").schema_id == 2  # and any later retry
    assert [v.schema_id for v in admin.schema_history("db.t")[1]] == [1, 2]
    assert sorted(zk_client.get_children(zkpaths.table_schemas(table.table_id))) == ["1", "2"]
