"""The CLI of partitioned tables without a cluster (docs/partitions.md, docs/cli.md).

Argument errors are one line and send nothing: a table definition the coordinator would refuse, options
that need others, ``table alter`` with nothing to change, ``cluster start --set`` with a bad key or value
(nothing started, not even its directory). Against a fake AdminClient with a partitioned table: a
per-bucket command without ``--partition`` is a usage error naming at most ten of its partitions, with
nothing but lookups sent; ``--partition`` of an unpartitioned table is one line; ``lease acquire --latest``
without ``--partition`` leases every partition's buckets in one acquire; what the CLI prints names the
partition of each bucket.
"""

from __future__ import annotations

import json

import pytest

import kvlease.client.admin as admin
from kvlease.client.partitions_admin import PartitionInfo
from kvlease.common import errors
from kvlease.common.auto_partition import AutoPartition, TimeUnit
from kvlease.common.model import Lease, SnapshotHandle, TableBucket
from kvlease.common.schema_changes import SchemaVersion
from kvlease.common.tables import Column, TableInfo
from kvlease.ops.local_cluster import ClusterError, check_settings
from kvlease.ops.local_cluster.settings import merged
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.unit

B = ("--bootstrap", "127.0.0.1:1")
SCHEMA = ("--schema", "day STRING, id BIGINT, n INT, score DOUBLE")
CREATE = ("table", "create", "db.p", *SCHEMA, "--primary-key", "day,id", "--buckets", "2")


class Unreachable:
    """An AdminClient that must not be used: a usage error is found before anything is sent."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("the command built a client: something was about to be sent")


@pytest.fixture
def nothing_sent(monkeypatch):
    monkeypatch.setattr(admin, "AdminClient", Unreachable)


# -- table create, table alter: refused before anything is sent ---------------------------------------


@pytest.mark.parametrize("options, message", [
    (("--partition-by", "n"), "partition key column 'n' is not part of the primary key (day, id)"),
    (("--partition-by", "nope"), "partition key column 'nope' is not a column of the table"),
    (("--partition-by", "day,id"), "partition key (day, id) is the whole primary key"),
    (("--partition-by", "day,day"), "partition key names column 'day' twice"),
    (("--auto-partition", "DAY"), "--auto-partition needs --partition-by COL"),
    (("--max-partitions", "5"), "--max-partitions needs --partition-by COL"),
    (("--precreate", "2", "--retention", "3"), "--precreate, --retention need --partition-by COL"),
    (("--partition-by", "day", "--precreate", "2"), "--precreate needs --auto-partition UNIT"),
    (("--partition-by", "day", "--time-zone", "UTC", "--retention", "1"),
     "--retention, --time-zone need --auto-partition UNIT"),
    (("--partition-by", "day", "--auto-partition", "HOURS"),
     "Invalid value for '--auto-partition': unknown table.auto-partition.time-unit 'HOURS': one of SECOND, HOUR, "
     "DAY, MONTH, QUARTER, YEAR; did you mean 'HOUR'?"),
    (("--partition-by", "day", "--auto-partition", "DAY", "--time-zone", "Mars/Olympus"),
     "Invalid value for '--time-zone': unknown table.auto-partition.time-zone 'Mars/Olympus'"),
    (("--partition-by", "day", "--auto-partition", "DAY", "--precreate", "-1"), "'--precreate'"),
    (("--partition-by", "day", "--auto-partition", "DAY", "--precreate", "990", "--retention", "10"),
     "auto-partitioning keeps up to 1001 partitions (num-precreate 990 + num-retention 10 + 1) but a table has "
     "at most 1000"),
    (("--partition-by", "day", "--max-partitions", "10001"), "table.partition.max must be between 1 and 10000"),
])
def test_a_bad_partitioned_table_is_a_usage_error_before_anything_is_sent(nothing_sent, options, message):
    line = assert_one_line_error(run(*B, *CREATE, *options), code=2)
    assert message in line and line.endswith("(see: kvlease table create --help)")


def test_auto_partitioning_needs_one_string_column(nothing_sent):
    line = assert_one_line_error(run(*B, "table", "create", "db.p", "--schema", "day BIGINT, id BIGINT",
                                     "--primary-key", "day,id", "--partition-by", "day", "--auto-partition", "DAY",
                                     "--buckets", "1"), code=2)
    assert "auto-partition column 'day' is of type BIGINT: it must be STRING" in line
    line = assert_one_line_error(run(*B, "table", "create", "db.p", "--schema", "day DOUBLE, id BIGINT",
                                     "--primary-key", "day,id", "--partition-by", "day", "--buckets", "1"), code=2)
    assert "partition key column 'day' is of type DOUBLE" in line


def test_table_alter_needs_something_to_change(nothing_sent):
    line = assert_one_line_error(run(*B, "table", "alter", "db.p"), code=2)
    assert ("nothing to change: give --add-column, --rename-column, --widen-column, --drop-column, --comment, "
            "--precreate, --retention or --max-partitions") in line
    assert "'--max-partitions'" in assert_one_line_error(run(*B, "table", "alter", "db.p", "--max-partitions", "0"),
                                                         code=2)


# -- cluster start --set: checked like a config file, nothing started -----------------------------------


@pytest.mark.parametrize("setting, message", [
    ("auto-partition.check-intervall=1s",
     "unknown config key 'auto-partition.check-intervall': did you mean 'auto-partition.check-interval'?"),
    ("auto-partition.check-interval=1", "bad value for config key 'auto-partition.check-interval': '1' has no unit"),
    ("auto-partition.check-interval=0s", "bad value for config key 'auto-partition.check-interval'"),
    ("auto-partition.check-interval", "is not KEY=VALUE"),
    ("tablet.port=9999", "config key 'tablet.port' cannot be --set: cluster start gives each server its own"),
    ("remote.data.dir=file:///x", "config key 'remote.data.dir' cannot be --set: use --remote URI"),
    ("security.enabled=true", "config key 'security.enabled' cannot be --set: security is --secure's"),
])
def test_cluster_start_with_a_bad_setting_starts_nothing(tmp_path, setting, message):
    directory = tmp_path / "kv"
    result = run("cluster", "start", "--dir", str(directory), "--set", "kv.snapshot.interval=1m", "--set", setting)
    line = assert_one_line_error(result, code=2)
    assert "Invalid value for '--set'" in line and message in line
    assert not directory.exists()


def test_settings_of_a_later_start_replace_the_recorded_ones_key_by_key():
    recorded = {"settings": {"auto-partition.check-interval": "1s", "kv.snapshot.interval": "1m"}}
    assert merged(recorded, {"kv.snapshot.interval": "5m"}) == {"auto-partition.check-interval": "1s",
                                                                "kv.snapshot.interval": "5m"}
    assert merged({}, None) == {} and merged(recorded, None) == recorded["settings"]
    with pytest.raises(ClusterError, match="unknown config key 'nope'"):
        check_settings({"nope": 1})


# -- per-bucket commands against a fake partitioned table ---------------------------------------------


PARTITIONS = [PartitionInfo(100 + i, f"d{i:02d}", 1_700_000_000_000 + i) for i in range(12)]
HELD = PartitionInfo(99, "d-old", 1_600_000_000_000, ("reader-1",))


class PartitionedAdmin:
    """Just enough of AdminClient: db.p (id 7, 2 buckets per partition, 12 partitions), db.t (id 8, unpartitioned).
    Records every call by name; the latest snapshot of bucket 0 of every partition is 5."""

    calls: list = []
    acquired: dict = {}
    tables = {"db.p": TableInfo(7, "db", "p", (Column("day", "STRING"), Column("id", "BIGINT")), ("day", "id"), 2,
                                partition_key=("day",)),
              "db.t": TableInfo(8, "db", "t", (Column("id", "BIGINT"),), ("id",), 2)}

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        raise AssertionError(f"unexpected call {name}")

    def close(self):
        pass

    def get_table(self, path):
        self.calls.append("get_table")
        if path not in self.tables:
            raise errors.TableNotExistError(f"table {path} does not exist")
        return self.tables[path]

    def list_tables(self, database=""):
        return list(self.tables.values())

    def schema_history(self, path):
        info = self.get_table(path)
        return info, [SchemaVersion.current(info)]

    def list_partitions(self, path=None, *, table_id=None):
        self.calls.append("list_partitions")
        return self.tables["db.p"], [HELD, *PARTITIONS]

    def get_latest_kv_snapshots(self, table_id, partition_id=None):
        self.calls.append("get_latest_kv_snapshots")
        ids = [p.partition_id for p in PARTITIONS if partition_id in (None, p.partition_id)]
        handles = [SnapshotHandle(TableBucket(table_id, 0, pid), 5, 10, "m") for pid in ids]
        return {h.bucket: admin.SnapshotInfo(h) for h in handles}

    def acquire_lease(self, lease_id, snapshots, duration_ms, *, owner=None):
        self.calls.append("acquire_lease")
        PartitionedAdmin.acquired = dict(snapshots)
        return admin.AcquireResult(lease_id, 60_000, dict(snapshots), {})

    def acquire_latest_lease(self, lease_id, table_id, duration_ms, *, partition_id=None, owner=None):
        """Like the coordinator: the latest snapshot of each bucket of the table (or partition) that has one."""
        self.calls.append("acquire_latest_lease")
        latest = {tb: info.snapshot_id for tb, info in self.get_latest_kv_snapshots(table_id, partition_id).items()}
        PartitionedAdmin.acquired = latest
        return admin.AcquireResult(lease_id, 60_000, latest, {})

    def describe_lease(self, lease_id):
        return Lease(lease_id, 60_000, {TableBucket(7, 1, 103): 4, TableBucket(8, 0): 2, TableBucket(7, 0, 555): 1})

    def create_table(self, path, columns, primary_key, buckets, ignore_if_exists=False, **options):
        self.calls.append(("create_table", options))
        db, name = path.split(".")
        return TableInfo(9, db, name, tuple(columns), tuple(primary_key), buckets, **options)


@pytest.fixture
def partitioned(monkeypatch):
    monkeypatch.setattr(admin, "AdminClient", PartitionedAdmin)
    PartitionedAdmin.calls = []
    PartitionedAdmin.acquired = {}


@pytest.mark.parametrize("args", [
    ("scan", "db.p"), ("log", "db.p", "--bucket", "0"), ("snapshot", "trigger", "db.p"),
    ("lease", "acquire", "L1", "--table", "db.p", "--snapshot", "0=5", "--duration", "1m"),
    ("lease", "release", "L1", "--table", "db.p", "--bucket", "0"),
    ("bucket", "restore", "db.p", "--bucket", "0", "--accept-data-loss"),
    ("bucket", "elect", "db.p", "--bucket", "0"),
    ("bucket", "reassign", "db.p", "--bucket", "0", "--replicas", "1"),
])
def test_a_per_bucket_command_needs_a_partition_of_a_partitioned_table(partitioned, monkeypatch, args):
    from kvlease.ops.cli.app import State

    monkeypatch.setattr(State, "table_client", lambda self, path, partition=None: FakeClient(self.client, path))
    line = assert_one_line_error(run(*B, *args), code=2)
    shown = ", ".join(p.name for p in [HELD, *PARTITIONS][:10])
    assert f"error: table db.p is partitioned: give --partition NAME (its partitions: {shown} and 3 more)" in line
    assert set(PartitionedAdmin.calls) <= {"get_table", "list_partitions"}  # looked up, nothing changed


class FakeClient:
    """A TableClient opened without a partition: what the CLI asks of it before refusing."""

    def __init__(self, admin_client, path):
        self.table = admin_client.get_table(path)

    def close(self):
        pass


@pytest.mark.parametrize("args", [
    ("scan", "db.t", "--partition", "d01"),
    ("snapshot", "list", "db.t", "--partition", "d01"),
    ("lease", "acquire", "L1", "--table", "db.t", "--latest", "--partition", "d01", "--duration", "1m"),
    ("lease", "release", "L1", "--table", "db.t", "--partition", "d01", "--bucket", "0"),
])
def test_a_partition_of_an_unpartitioned_table_is_one_line(partitioned, args):
    line = assert_one_line_error(run(*B, *args))
    assert line == "error: table db.t is not partitioned: leave the partition out"
    assert set(PartitionedAdmin.calls) == {"get_table"}


def test_lease_acquire_latest_without_a_partition_holds_every_partitions_buckets_in_one_lease(partitioned):
    result = run(*B, "--json", "lease", "acquire", "L1", "--table", "db.p", "--latest", "--duration", "1m")
    assert result.exit_code == 0, result.output
    assert PartitionedAdmin.calls.count("acquire_latest_lease") == 1  # one request: the coordinator chooses them
    assert PartitionedAdmin.acquired == {TableBucket(7, 0, p.partition_id): 5 for p in PARTITIONS}
    doc = json.loads(result.stdout)
    assert [(b["partition"], b["partition_id"], b["bucket"]) for b in doc["acquired"]] == [
        (p.name, p.partition_id, 0) for p in PARTITIONS]
    missing = [(b["partition"], b["bucket"]) for b in doc["no_snapshot"]]
    assert missing == [(HELD.name, 0), (HELD.name, 1)] + [(p.name, 1) for p in PARTITIONS]


def test_lease_acquire_of_one_partition_names_its_buckets(partitioned):
    result = run(*B, "lease", "acquire", "L1", "--table", "db.p", "--partition", "d03", "--snapshot", "1=4",
                 "--duration", "1m")
    assert result.exit_code == 0, result.output
    assert PartitionedAdmin.acquired == {TableBucket(7, 1, 103): 4}
    assert "partition" in result.stdout and "d03" in result.stdout


def test_lease_describe_names_each_buckets_partition(partitioned):
    doc = json.loads(run(*B, "--json", "lease", "describe", "L1").stdout)
    assert doc["buckets"] == [
        {"table": "db.p", "partition": "d03", "partition_id": 103, "bucket": 1, "snapshot_id": 4},
        {"table": "db.p", "partition": "#555", "partition_id": 555, "bucket": 0, "snapshot_id": 1},  # dropped
        {"table": "db.t", "bucket": 0, "snapshot_id": 2}]
    text = run(*B, "lease", "describe", "L1").stdout
    assert "partition" in text and "d03" in text and "#555" in text


def test_creating_a_partitioned_table_sends_its_partitioning_and_warns_of_no_leader(partitioned):
    result = run(*B, "table", "create", "db.q", *SCHEMA, "--primary-key", "day,id", "--partition-by", "day",
                 "--auto-partition", "hour", "--precreate", "3", "--retention", "-1", "--time-zone", "Europe/Berlin",
                 "--max-partitions", "50", "--buckets", "2")
    assert result.exit_code == 0, result.output
    (call, options), = [c for c in PartitionedAdmin.calls if c[0] == "create_table"]
    assert options == {"partition_key": ("day",), "max_partitions": 50,
                       "auto_partition": AutoPartition(TimeUnit.HOUR, 3, -1, "Europe/Berlin")}
    assert result.stderr == ""  # no "buckets have no leader": its buckets are its partitions'
    assert ("created table db.q (id 9, 2 buckets per partition), partitioned by day (auto HOUR: 3 ahead, none "
            "dropped, time zone Europe/Berlin), at most 50 partitions; partitions now: d-old, d00") in result.stdout


def test_describe_and_partition_list_text_name_partitions_and_the_leases_holding_them():
    import io

    from rich.console import Console

    from kvlease.ops.cli import output as out

    console = Console(file=io.StringIO(), width=200)
    table = TableInfo(7, "db", "p", (Column("day", "STRING"), Column("id", "BIGINT")), ("day", "id"), 1,
                      partition_key=("day",), auto_partition=AutoPartition(TimeUnit.DAY, 2, 7, "UTC"))
    leader = admin.BucketLeader(0, 1, "127.0.0.1:2", 3, (1, 2), (1,), 5)
    doc = {**out.table_doc(table), "assignment": [],
           "partitions": [{**out.partition_doc(p), "assignment": out.assignment_docs({0: leader})}
                          for p in (HELD, PARTITIONS[0])]}
    out.TextOutput(console).table(doc)
    text = console.file.getvalue()
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "partitioned by day (auto DAY: 2 ahead, 7 kept, time zone UTC)" in lines and "partitions 2" in lines
    assert "PK, partition" in text
    rows = [line.split() for line in text.splitlines() if line.startswith(("d-old", "d00"))]
    assert [(r[0], r[1], r[-1]) for r in rows[:2]] == [("d-old", "99", "reader-1"), ("d00", "100", "-")]  # id, held
    assert rows[2:] == [["d-old", "0", "1", "1,", "2", "1", "3"], ["d00", "0", "1", "1,", "2", "1", "3"]]  # buckets
    console.file = io.StringIO()
    out.TextOutput(console).partitions(out.partitions_doc("db.p", [PARTITIONS[1], HELD]))
    lines = console.file.getvalue().splitlines()
    assert lines[0].strip() == "db.p" and lines[2].split()[0] == "d-old" and lines[2].split()[-1] == "reader-1"
    assert lines[3].split()[0] == "d01" and lines[3].split()[-1] == "-"


def test_the_bucket_commands_hand_the_partition_on_and_name_it(partitioned, monkeypatch):
    from kvlease.common.data_loss import DataLoss

    asked = []

    def restore_bucket(self, path, bucket, accept_data_loss, tablet=None, partition=None):
        asked.append(("restore", path, bucket, partition))
        return {"table": path, "partition": partition, "bucket": bucket, "leader": 1, "leader_epoch": 4,
                "replicas": [1], "replication_factor": 1, "loss": DataLoss("RESTORE", 4, 0, 5)}

    def elect_leader(self, path, bucket, unclean, tablet=None, partition=None):
        asked.append(("elect", path, bucket, partition))
        return {"table": path, "partition": partition, "bucket": bucket, "leader": 2, "leader_epoch": 5, "isr": [2],
                "loss": None}

    def reassign_bucket(self, path, bucket, replicas, partition=None):
        asked.append(("reassign", path, bucket, partition))
        return {"table": path, "table_id": 7, "partition": partition, "partition_id": 103, "bucket": bucket,
                "replicas": [1], "target": list(replicas), "isr": [1], "leader": 1, "state": "moving",
                "waiting": [2], "removing": [1]}

    for name, method in (("restore_bucket", restore_bucket), ("elect_leader", elect_leader),
                         ("reassign_bucket", reassign_bucket)):
        monkeypatch.setattr(PartitionedAdmin, name, method, raising=False)
    restored = run(*B, "bucket", "restore", "db.p", "--partition", "d03", "--bucket", "1", "--accept-data-loss")
    assert restored.exit_code == 0, restored.output
    assert restored.stdout.startswith("bucket 1 of db.p partition d03 restored from nothing")
    elected = json.loads(run(*B, "--json", "bucket", "elect", "db.p", "--partition", "d03", "--bucket", "0").stdout)
    assert (elected["table"], elected["partition"], elected["leader"]) == ("db.p", "d03", 2)
    moved = run(*B, "bucket", "reassign", "db.p", "--partition", "d03", "--bucket", "0", "--replicas", "2")
    assert moved.exit_code == 0, moved.output
    assert moved.stdout.startswith("moving bucket 0 of db.p partition d03: db.p/d03/0: to [2], leaving [1]")
    assert asked == [("restore", "db.p", 1, "d03"), ("elect", "db.p", 0, "d03"), ("reassign", "db.p", 0, "d03")]


def test_snapshot_list_without_a_partition_lists_every_partitions_snapshots(partitioned, monkeypatch):
    asked = []

    def list_kv_snapshots(self, table_id, partition_id=None):
        asked.append(partition_id)
        handles = [SnapshotHandle(TableBucket(7, b, pid), 2, 30, "m") for pid in (101, 100) for b in (1, 0)]
        return [admin.SnapshotInfo(h, ("L1",) if h.bucket.partition_id == 101 else ())
                for h in handles if partition_id in (None, h.bucket.partition_id)]

    monkeypatch.setattr(PartitionedAdmin, "list_kv_snapshots", list_kv_snapshots, raising=False)
    every = json.loads(run(*B, "--json", "snapshot", "list", "db.p").stdout)
    assert "partition" not in every and asked == [None]
    assert [(s["partition"], s["bucket"], s["leased_by"]) for s in every["snapshots"]] == [
        ("d00", 0, []), ("d00", 1, []), ("d01", 0, ["L1"]), ("d01", 1, ["L1"])]
    one = json.loads(run(*B, "--json", "snapshot", "list", "db.p", "--partition", "d01").stdout)
    assert one["partition"] == "d01" and asked == [None, 101] and {s["partition"] for s in one["snapshots"]} == {"d01"}
    text = run(*B, "snapshot", "list", "db.p").stdout.splitlines()
    assert text[1].split()[:2] == ["partition", "bucket"] and text[2].split()[:2] == ["d00", "0"]
