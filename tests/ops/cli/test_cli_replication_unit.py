"""``kvlease table create --replication-factor``, ``table describe`` (replicas, leader, ISR, leader epoch) and
``cluster status`` (offline and under-replicated buckets) against a fake AdminClient, without a cluster."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from rich.console import Console

import kvlease.client.admin as admin
from kvlease.ops.cli import output as out
from tests.ops.cli.test_cli_lease_unit import FakeAdmin
from tests.support.cli_runner import run

pytestmark = pytest.mark.unit

B = ("--bootstrap", "127.0.0.1:1")


class ReplicatedAdmin(FakeAdmin):
    """db.t with replication factor 3 and min in-sync replicas 2: bucket 0 in sync, 1 under-replicated,
    2 offline."""

    info = replace(FakeAdmin.info, replication_factor=3, min_insync_replicas=2)
    created: dict = {}

    def create_table(self, path, columns, primary_key, buckets, ignore_if_exists=False, **replication):
        ReplicatedAdmin.created = replication
        table = super().create_table(path, columns, primary_key, buckets, ignore_if_exists)
        return replace(table, replication_factor=replication.get("replication_factor", 1),
                       min_insync_replicas=replication.get("min_insync_replicas", 1))

    def get_table_assignment(self, table_id):
        return self.info, {0: admin.BucketLeader(0, 1, "127.0.0.1:2", 3, (1, 2, 3), (1, 2, 3), 5),
                           1: admin.BucketLeader(1, 2, "127.0.0.1:3", 1, (2, 3, 1), (2,), 4),
                           2: admin.BucketLeader(2, -1, "", 7, (3, 1, 2), (3,), 9)}


@pytest.fixture
def replicated(monkeypatch):
    monkeypatch.setattr(admin, "AdminClient", ReplicatedAdmin)


def test_create_passes_the_replication_options_only_when_given(replicated):
    result = run(*B, "table", "create", "db.n", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "2",
                 "--replication-factor", "3", "--min-insync-replicas", "2")
    assert result.exit_code == 0, result.output
    assert ReplicatedAdmin.created == {"replication_factor": 3, "min_insync_replicas": 2}
    assert "replication factor 3, min in-sync replicas 2" in result.stdout
    assert run(*B, "table", "create", "db.m", "--schema", "id BIGINT", "--primary-key", "id",
               "--buckets", "2").exit_code == 0
    assert ReplicatedAdmin.created == {}


@pytest.mark.parametrize("args, where", [(("--replication-factor", "0"), "--replication-factor"),
                                         (("--replication-factor", "2", "--min-insync-replicas", "3"),
                                          "--min-insync-replicas 3 is more than --replication-factor 2")])
def test_bad_replication_options_are_usage_errors(replicated, args, where):
    result = run(*B, "table", "create", "db.n", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "2",
                 *args)
    assert result.exit_code == 2 and where in result.stderr and "Traceback" not in result.output


def test_describe_shows_each_buckets_replicas_leader_isr_and_epoch(replicated):
    doc = json.loads(run(*B, "table", "describe", "db.t", "--json").stdout)
    assert (doc["replication_factor"], doc["min_insync_replicas"]) == (3, 2)
    assert doc["assignment"][1] == {"bucket": 1, "leader": 2, "leader_address": "127.0.0.1:3", "replicas": [2, 3, 1],
                                    "isr": [2], "leader_epoch": 1, "bucket_epoch": 4}
    text = run(*B, "table", "describe", "db.t").stdout
    assert "replication factor" in text and "min in-sync replicas" in text
    rows = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines() if line[:1] in "012"}
    assert rows["1"].split() == ["2", "2,", "3,", "1", "2", "1"]
    assert "none (offline)" in rows["2"]


def test_status_text_counts_and_lists_offline_and_under_replicated_buckets():
    buffer = io.StringIO()
    out.TextOutput(Console(file=buffer, width=200)).cluster_status({
        "zookeeper": [], "coordinators": [],
        "tablets": [{"id": "1", "pid": 5, "address": "127.0.0.1:9", "alive": True, "registered": True,
                     "buckets": 2, "replicas": 6}],
        "offline": [{"table": "db.t", "table_id": 7, "bucket": 2}], "offline_count": 1,
        "under_replicated": [{"table": "db.t", "table_id": 7, "bucket": 1}, {"table": "db.u", "table_id": 8,
                                                                             "bucket": 0}],
        "under_replicated_count": 2})
    text = buffer.getvalue()
    assert "2 buckets led, 6 replicas" in text
    assert "offline buckets (no live leader): 1: db.t/2" in text
    assert "under-replicated buckets (ISR smaller than replicas): 2: db.t/1, db.u/0" in text


def test_status_text_names_the_partition_of_a_partition_s_bucket():
    """Not its physical id: the table, the partition's name and the bucket, also in an offline reason."""
    buffer = io.StringIO()
    events = {"table": "shop.events", "table_id": 9, "partition": "20261129", "partition_id": 4242}
    out.TextOutput(Console(file=buffer, width=300)).cluster_status({
        "zookeeper": [], "coordinators": [], "tablets": [],
        "offline": [{**events, "bucket": 3, "offline_reason": "data lost on tablet server 2"},
                    {"table": "db.t", "table_id": 7, "bucket": 2}], "offline_count": 2,
        "under_replicated": [{**events, "bucket": 1}], "under_replicated_count": 1})
    text = buffer.getvalue()
    assert "offline buckets (no live leader): 2: shop.events partition 20261129 bucket 3, db.t/2" in text
    assert "  shop.events partition 20261129 bucket 3: data lost on tablet server 2" in text
    assert "under-replicated buckets (ISR smaller than replicas): 1: shop.events partition 20261129 bucket 1" in text
    assert "4242" not in text  # the partition's id is in --json only
