"""``kvlease bucket reassign``, ``cluster decommission|rebalance|reassignments`` and the moves shown by
``table describe`` / ``cluster status``, against a fake AdminClient, without a cluster."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

import kvlease.client.admin as admin
from kvlease.common import errors
from kvlease.ops.cli import cluster_moves
from kvlease.ops.cli import output as out
from tests.ops.cli.test_cli_replication_unit import ReplicatedAdmin
from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.unit

B = ("--bootstrap", "127.0.0.1:1")


def move(bucket=0, state="moving", target=(3, 1), waiting=(3,)):
    return {"table": "db.t", "table_id": 7, "bucket": bucket, "replicas": [3, 1, 2], "target": list(target),
            "isr": [1, 2], "leader": 1, "state": state, "waiting": list(waiting), "removing": [2]}


class MovesAdmin(ReplicatedAdmin):
    """Moves in progress: each list_reassignments call answers the next of ``polls`` (then nothing)."""

    polls: list = []
    asked: list = []

    def reassign_bucket(self, path, bucket, replicas, partition=None):
        MovesAdmin.asked.append((path, bucket, list(replicas), partition))
        if replicas == [9, 1]:
            raise errors.InvalidRequestError("cannot move bucket 0 of db.t: tablet server(s) [9] are not live")
        return move(bucket, target=replicas)

    def decommission_tablet(self, tablet_id):
        return [move(0), move(2)] if tablet_id == 1 else []

    def rebalance(self, leaders_only=False):
        MovesAdmin.asked.append(("rebalance", leaders_only))
        leaders = [{"kind": "leader", "table": "db.t", "table_id": 7, "bucket": 2, "old_leader": 2, "new_leader": 3,
                    "leader_epoch": 5},
                   {"kind": "leader", "table": "db.t", "table_id": 7, "bucket": 3, "old_leader": 1, "new_leader": 1,
                    "leader_epoch": 4}]
        return leaders if leaders_only else [{"kind": "move", **move(1)}, *leaders]

    def list_reassignments(self):
        return MovesAdmin.polls.pop(0) if MovesAdmin.polls else []

    def get_table_assignment(self, table_id):
        return self.info, {0: admin.BucketLeader(0, 1, "127.0.0.1:2", 3, (3, 1, 2), (1, 2), 5, (3, 1)),
                           1: admin.BucketLeader(1, 2, "127.0.0.1:3", 1, (2, 3, 1), (2, 3, 1), 4)}


@pytest.fixture
def moves(monkeypatch):
    monkeypatch.setattr(admin, "AdminClient", MovesAdmin)
    monkeypatch.setattr(cluster_moves, "POLL_S", 0.0)
    MovesAdmin.polls, MovesAdmin.asked = [], []


def test_reassign_sends_the_replicas_and_shows_the_move(moves):
    result = run(*B, "bucket", "reassign", "db.t", "--bucket", "0", "--replicas", "3,1")
    assert result.exit_code == 0, result.output
    assert MovesAdmin.asked == [("db.t", 0, [3, 1], None)]
    assert "moving bucket 0 of db.t: db.t/0: to [3, 1], leaving [2] (waiting for 3 to catch up)" in result.stdout
    doc = json.loads(run(*B, "bucket", "reassign", "db.t", "--bucket", "0", "--replicas", "3,1", "--json").stdout)
    assert doc["target"] == [3, 1] and doc["waiting"] == [3] and doc["state"] == "moving"


def test_reassign_errors_are_one_line(moves):
    line = assert_one_line_error(run(*B, "bucket", "reassign", "db.t", "--bucket", "0", "--replicas", "9,1"))
    assert "[9] are not live" in line
    usage = run(*B, "bucket", "reassign", "db.t", "--bucket", "0", "--replicas", "a,b")
    assert usage.exit_code == 2 and "comma-separated list of tablet ids" in usage.stderr
    assert run(*B, "bucket", "reassign", "db.t", "--bucket", "0").exit_code == 2  # --replicas required


def test_reassign_wait_polls_until_the_move_is_done(moves):
    MovesAdmin.polls = [[move(0)], [move(0, waiting=())], []]
    result = run(*B, "bucket", "reassign", "db.t", "--bucket", "0", "--replicas", "3,1", "--wait")
    assert result.exit_code == 0, result.output
    assert MovesAdmin.polls == []  # asked until nothing was left
    assert "waiting for 3 to catch up" in result.stderr and "completing" in result.stderr
    assert "bucket 0 of db.t is on tablet servers [3, 1]" in result.stdout


def test_wait_gives_up_at_the_timeout_naming_what_is_left(moves):
    MovesAdmin.polls = [[move(0)]] * 1000
    line = assert_one_line_error(run(*B, "bucket", "reassign", "db.t", "--bucket", "0", "--replicas", "3,1",
                                     "--wait", "--timeout", "1ms", "--json"))
    assert "1 move(s) not complete within the --timeout" in line and "db.t/0: to [3, 1]" in line


def test_decommission_and_rebalance(moves):
    doc = json.loads(run(*B, "cluster", "decommission", "--tablet", "1", "--json").stdout)
    assert [m["bucket"] for m in doc["moves"]] == [0, 2] and doc["waited"] is False
    assert "decommissioning tablet server 1: 2 move(s) in progress" in run(*B, "cluster", "decommission",
                                                                           "--tablet", "1").stdout
    assert "holds no bucket replica: nothing to move" in run(*B, "cluster", "decommission", "--tablet", "4").stdout
    MovesAdmin.polls = [[move(0)], []]
    waited = run(*B, "cluster", "decommission", "--tablet", "1", "--wait")
    assert "tablet server 1 decommissioned: 2 replica(s) moved off it" in waited.stdout
    text = run(*B, "cluster", "rebalance").stdout
    assert "1 replica move(s) started" in text and "db.t/2 2 -> 3" in text
    assert "2 bucket(s) led by their preferred replica" in text and "db.t/3 1 (now preferred)" in text
    doc = json.loads(run(*B, "cluster", "rebalance", "--json").stdout)
    assert len(doc["moves"]) == 1 and doc["leaders"][0]["new_leader"] == 3


def test_rebalance_of_the_leaders_only_asks_for_no_moves(moves):
    doc = json.loads(run(*B, "cluster", "rebalance", "--leaders", "--json").stdout)
    assert MovesAdmin.asked == [("rebalance", True)] and doc["moves"] == [] and len(doc["leaders"]) == 2
    run(*B, "cluster", "rebalance")
    assert MovesAdmin.asked[-1] == ("rebalance", False)


def test_reassignments_lists_the_moves_in_progress(moves):
    MovesAdmin.polls = [[move(0)], []]
    assert json.loads(run(*B, "cluster", "reassignments", "--json").stdout)["moves"][0]["target"] == [3, 1]
    assert "no move in progress" in run(*B, "cluster", "reassignments").stdout


def test_describe_shows_where_a_bucket_moves(moves):
    doc = json.loads(run(*B, "table", "describe", "db.t", "--json").stdout)
    assert [a.get("reassign_target") for a in doc["assignment"]] == [[3, 1], None]
    assert "reassign_target" not in doc["assignment"][1]  # only while a move is in progress
    text = run(*B, "table", "describe", "db.t").stdout
    assert "moving to" in text and "3, 1 (waiting for 3)" in text


def test_cluster_status_text_names_the_buckets_being_moved():
    buffer = io.StringIO()
    output = out.TextOutput(Console(file=buffer, width=200))
    output.cluster_status({"zookeeper": [], "coordinators": [], "tablets": [], "reassignments": [move(0)]})
    assert "buckets being moved: 1: db.t/0 to [3, 1] (waiting for [3])" in buffer.getvalue()
