"""``kvlease bucket restore --tablet`` (what is sent, the replicas printed, fewer replicas than the replication
factor said) and ``table describe`` showing the replicas that lost their data, against a fake AdminClient."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import kvlease.client.admin as admin
from kvlease.common.data_loss import RESTORE, DataLoss
from tests.ops.cli.test_cli_lease_unit import FakeAdmin
from tests.support.cli_runner import run

pytestmark = pytest.mark.unit

B = ("--bootstrap", "127.0.0.1:1")
LOSS = DataLoss(RESTORE, 6, 10, 15, 1, 99, 4)


class RestoreAdmin(FakeAdmin):
    """db.t with replication factor 3: a restore onto the named server gets as many replicas as live servers."""

    info = replace(FakeAdmin.info, replication_factor=3)
    asked: list = []
    live = (4, 5, 6)

    def restore_bucket(self, path, bucket, accept_data_loss, tablet=None, partition=None):
        RestoreAdmin.asked.append((path, bucket, accept_data_loss, tablet))
        return {"table": path, "bucket": bucket, "leader": tablet or 4, "leader_epoch": 6,
                "replicas": list(self.live), "replication_factor": 3, "loss": LOSS}

    def get_table_assignment(self, table_id):
        return self.info, {0: admin.BucketLeader(0, 1, "127.0.0.1:2", 3, (1, 2, 3), (1, 3), 5, lost=(2,)),
                           1: admin.BucketLeader(1, 2, "127.0.0.1:3", 1, (2, 3, 1), (2, 3, 1), 4)}


@pytest.fixture
def restoring(monkeypatch):
    monkeypatch.setattr(admin, "AdminClient", RestoreAdmin)
    RestoreAdmin.asked = []
    monkeypatch.setattr(RestoreAdmin, "live", (4, 5, 6))


def test_restore_sends_the_tablet_and_prints_the_replicas(restoring):
    result = run(*B, "bucket", "restore", "db.t", "--bucket", "0", "--accept-data-loss", "--tablet", "4")
    assert result.exit_code == 0, result.output
    assert RestoreAdmin.asked == [("db.t", 0, True, 4)]
    assert "led by tablet server 4" in result.stdout and "(replicas 4, 5, 6)" in result.stdout
    assert "5 changelog offsets lost (10..14)" in result.stdout and "only" not in result.stdout
    run(*B, "bucket", "restore", "db.t", "--bucket", "0", "--accept-data-loss")
    assert RestoreAdmin.asked[-1] == ("db.t", 0, True, None)


def test_restore_onto_too_few_live_servers_says_so(restoring, monkeypatch):
    monkeypatch.setattr(RestoreAdmin, "live", (4,))
    result = run(*B, "bucket", "restore", "db.t", "--bucket", "0", "--accept-data-loss", "--json")
    doc = json.loads(result.stdout)
    assert (doc["replicas"], doc["loss"]["lost_offsets"]) == ([4], 5)
    text = run(*B, "bucket", "restore", "db.t", "--bucket", "0", "--accept-data-loss").stdout
    assert "only 1 of its 3 replicas" in text and "bucket reassign" in text


def test_describe_shows_the_replicas_that_lost_their_data(restoring):
    doc = json.loads(run(*B, "table", "describe", "db.t", "--json").stdout)
    assert doc["assignment"][0]["lost"] == [2] and "lost" not in doc["assignment"][1]
    text = run(*B, "table", "describe", "db.t").stdout
    assert "1, 2, 3 (data lost: 2)" in text and text.count("data lost") == 1
