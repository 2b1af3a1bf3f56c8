"""The kvlease lease commands against a fake AdminClient (same method names and
return types as client.admin.AdminClient), without a cluster."""

from __future__ import annotations

import json

import pytest

import kvlease.client.admin as admin
from kvlease.common import errors
from kvlease.common.schema_changes import SchemaVersion
from kvlease.common.tables import Column, TableInfo
from kvlease.common.model import Lease, SnapshotHandle, TableBucket
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.unit


class FakeAdmin:
    """Just enough of AdminClient: one table db.t (id 7, 3 buckets)."""

    info = TableInfo(7, "db", "t", (Column("id", "BIGINT"),), ("id",), 3)

    last: "FakeAdmin | None" = None

    def __init__(self, bootstrap, config=None, **kwargs):
        self.bootstrap = admin.parse_bootstrap(bootstrap)
        self.leases: dict[str, Lease] = {}
        FakeAdmin.last = self

    def close(self):
        pass

    def get_table(self, path):
        if path != "db.t":
            raise errors.TableNotExistError(f"table {path} does not exist")
        return self.info

    def list_tables(self, database=""):
        return [self.info]

    def schema_history(self, path):
        info = self.get_table(path)
        return info, [SchemaVersion.current(info)]

    def create_table(self, path, columns, primary_key, buckets, ignore_if_exists=False):
        """Like the coordinator: db.t exists; another table is created (id 8)."""
        if path == "db.t":
            if not ignore_if_exists:
                raise errors.TableAlreadyExistError("table db.t already exists")
            return self.info
        db, name = path.split(".")
        return TableInfo(8, db, name, tuple(columns), tuple(primary_key), buckets)

    tablet_servers: list = [admin.TabletServerInfo(1, "127.0.0.1:2", 3)]

    def get_table_assignment(self, table_id):
        """Every bucket led by tablet server 1, unless no tablet server is registered."""
        leader = 1 if self.tablet_servers else -1
        return self.info, {b: admin.BucketLeader(b, leader, "", 0) for b in range(self.info.buckets)}

    def list_tablet_servers(self):
        return list(self.tablet_servers)

    def drop_table(self, path, ignore_if_not_exists=False):
        """Like AdminClient.drop_table: True if it dropped db.t, False if there was none."""
        if path == "db.t":
            return True
        if ignore_if_not_exists:
            return False
        raise errors.TableNotExistError(f"table {path} does not exist")

    def get_latest_kv_snapshots(self, table_id, partition_id=None):
        handle = SnapshotHandle(TableBucket(7, 0), 5, 10, "m")
        return {handle.bucket: admin.SnapshotInfo(handle)}

    def acquire_lease(self, lease_id, snapshots, duration_ms, *, owner=None):
        acquired = {tb: sid for tb, sid in snapshots.items() if tb.bucket == 0}
        unavailable = {tb: sid for tb, sid in snapshots.items() if tb.bucket != 0}
        self.leases[lease_id] = Lease(lease_id, 1000 + duration_ms, acquired, owner=owner)
        return admin.AcquireResult(lease_id, 1000 + duration_ms, acquired, unavailable)

    def acquire_latest_lease(self, lease_id, table_id, duration_ms, *, partition_id=None, owner=None):
        """Like the coordinator: the latest snapshot of each bucket of db.t that has one (bucket 0's)."""
        assert (table_id, partition_id) == (7, None)
        acquired = {tb: info.snapshot_id for tb, info in self.get_latest_kv_snapshots(table_id).items()}
        self.leases[lease_id] = Lease(lease_id, 1000 + duration_ms, acquired, owner=owner)
        return admin.AcquireResult(lease_id, 1000 + duration_ms, acquired, {})

    def renew_lease(self, lease_id, duration_ms, *, owner=None):
        raise errors.LeaseNotFoundError(f"lease {lease_id} not found")

    def release_lease(self, lease_id, buckets, *, owner=None):
        """L1 holds buckets 0 and 1 of db.t; any other lease is unknown."""
        buckets = list(buckets)
        self.released = buckets
        if lease_id != "L1":
            return admin.ReleaseResult(lease_id, False, False)
        held = {TableBucket(7, 0), TableBucket(7, 1)}
        return admin.ReleaseResult(lease_id, bool(held & set(buckets)), bool(held - set(buckets)))


@pytest.fixture
def fake_admin(monkeypatch):
    monkeypatch.setattr(admin, "AdminClient", FakeAdmin)


def test_acquire_json(fake_admin):
    result = run("--bootstrap", "127.0.0.1:1", "lease", "acquire", "L1", "--table", "db.t",
                 "--snapshot", "0=5", "--snapshot", "1=9", "--duration", "10m", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc == {"lease_id": "L1", "expiration_time": 601_000,
                   "acquired": [{"table": "db.t", "bucket": 0, "snapshot_id": 5}],
                   "unavailable": [{"table": "db.t", "bucket": 1, "snapshot_id": 9}]}


def test_acquire_passes_its_owner_and_refuses_a_bad_one_before_sending(fake_admin):
    args = ("--bootstrap", "127.0.0.1:1", "lease", "acquire", "L1", "--table", "db.t", "--snapshot", "0=5",
            "--duration", "10m")
    assert run(*args, "--owner", "job-7").exit_code == 0
    assert FakeAdmin.last.leases["L1"].owner == "job-7"
    assert run(*args).exit_code == 0
    assert FakeAdmin.last.leases["L1"].owner is None
    bad = run(*args, "--owner", "a/b")
    assert bad.exit_code == 2 and "bad lease owner 'a/b'" in bad.output


def test_acquire_latest_reports_buckets_without_snapshot(fake_admin):
    result = run("--bootstrap", "127.0.0.1:1", "--json", "lease", "acquire", "L1", "--table", "db.t",
                 "--latest", "--duration", "1m")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["acquired"] == [{"table": "db.t", "bucket": 0, "snapshot_id": 5}]
    assert doc["no_snapshot"] == [{"table": "db.t", "bucket": 1}, {"table": "db.t", "bucket": 2}]


def test_server_errors_are_one_line(fake_admin):
    assert "lease L9 not found" in assert_one_line_error(
        run("--bootstrap", "127.0.0.1:1", "lease", "renew", "L9", "--duration", "1m"))
    assert "table db.nope does not exist" in assert_one_line_error(
        run("--bootstrap", "127.0.0.1:1", "lease", "release", "L9", "--table", "db.nope", "--bucket", "0"))


def test_release_accepts_repeated_and_comma_separated_buckets(fake_admin):
    result = run("--bootstrap", "127.0.0.1:1", "lease", "release", "L1", "--table", "db.t",
                 "--bucket", "2", "--bucket", "0,1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"lease_id": "L1", "table": "db.t", "buckets": [0, 1, 2],
                                         "released": True, "lease_remains": False}
    assert FakeAdmin.last.released == [TableBucket(7, 0), TableBucket(7, 1), TableBucket(7, 2)]


@pytest.mark.parametrize("lease_id, bucket, text, released, remains", [
    ("L1", "0", "released db.t bucket(s) 0 from lease L1", True, True),
    ("L1", "0,1", "released db.t bucket(s) 0, 1 from lease L1; lease L1 holds nothing more and is gone", True, False),
    ("L1", "2", "lease L1 holds none of db.t bucket(s) 2: nothing released", False, True),
    ("gone", "0", "no lease gone (nothing to release)", False, False),
])
def test_release_says_what_it_released_and_exits_0_when_nothing_was_held(fake_admin, lease_id, bucket, text,
                                                                         released, remains):
    args = ("--bootstrap", "127.0.0.1:1", "lease", "release", lease_id, "--table", "db.t", "--bucket", bucket)
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == text and result.stderr == ""
    doc = json.loads(run(*args, "--json").stdout)
    assert (doc["released"], doc["lease_remains"]) == (released, remains)


@pytest.mark.parametrize("path, text, dropped", [
    ("db.t", "dropped table db.t", True), ("db.gone", "no table db.gone (nothing to drop)", False)])
def test_table_drop_if_exists_says_whether_there_was_a_table(fake_admin, path, text, dropped):
    result = run("--bootstrap", "127.0.0.1:1", "table", "drop", path, "--if-exists")
    assert result.exit_code == 0 and text in result.stdout, result.output
    doc = json.loads(run("--bootstrap", "127.0.0.1:1", "table", "drop", path, "--if-exists", "--json").stdout)
    assert doc == {"table": path, "dropped": dropped}
    if not dropped:
        assert "does not exist" in assert_one_line_error(run("--bootstrap", "127.0.0.1:1", "table", "drop", path))


def test_create_if_not_exists_says_whether_it_created(fake_admin):
    created = run("table", "create", "db.new", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "2",
                  "--if-not-exists", "--json", "--bootstrap", "h:1")
    assert created.exit_code == 0 and json.loads(created.stdout)["created"] is True
    again = run("table", "create", "db.t", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "3",
                "--if-not-exists", "--bootstrap", "h:1")
    assert again.exit_code == 0 and "already exists with this definition (id 7): nothing created" in again.stdout
    doc = json.loads(run("table", "create", "db.t", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "3",
                         "--if-not-exists", "--json", "--bootstrap", "h:1").stdout)
    assert (doc["created"], doc["table_id"], doc["no_leader"]) == (False, 7, [])


def test_create_with_no_tablet_server_warns_at_once(fake_admin, monkeypatch):
    monkeypatch.setattr(FakeAdmin, "tablet_servers", [])
    created = run("table", "create", "db.new", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "3",
                  "--bootstrap", "h:1")
    assert created.exit_code == 0 and created.stdout.startswith("created table db.new")
    assert created.stderr == ("warning: bucket(s) 0, 1, 2 of db.new have no leader, so put, get, scan and log fail "
                              "('no leader assigned') until a tablet server takes them; no tablet server is running "
                              "in the cluster: start one (a local cluster: kvlease cluster stop --dir D, then "
                              "kvlease cluster start --dir D --tablets 1)\n")
