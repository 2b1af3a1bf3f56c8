"""``kvlease drill``: names, options, help and the errors it gives before touching a cluster (no processes)."""

from __future__ import annotations

import json

import pytest

from tests.support.cli_runner import assert_one_line_error, run

pytestmark = pytest.mark.unit

DRILLS = ("coordinator-failover", "zk-leader-loss", "tablet-restart", "remote-outage", "all")


def fake_cluster(path, *, zk=1, coordinators=1, tablets=0, remote=None):
    """A cluster.json of that shape whose processes do not run."""
    doc = {"zookeeper": [{"id": str(i + 1), "pid": None, "address": f"127.0.0.1:{1 + i}", "log": str(path / "zk.log")}
                         for i in range(zk)],
           "coordinators": [{"id": str(i + 1), "pid": None, "address": f"127.0.0.1:{10 + i}"}
                            for i in range(coordinators)],
           "tablets": [{"id": str(i + 1), "pid": None, "address": f"127.0.0.1:{20 + i}"} for i in range(tablets)],
           "remote": remote or (path / "remote").as_uri(), "zk_root": "/kvlease", "zookeeper_connect": "127.0.0.1:1"}
    (path / "cluster.json").write_text(json.dumps(doc))
    return str(path)


def test_help_lists_every_drill_and_what_it_checks():
    result = run("drill", "--help")
    assert result.exit_code == 0
    for name in DRILLS:
        assert f"  {name}:" in result.stdout
    assert result.stdout.count("Checks:") >= len(DRILLS)
    for helper in ("checks", "row-checks", "cluster", "leases"):  # modules without main() are no drills
        assert f"  {helper}:" not in result.stdout
    text = " ".join(result.stdout.split())
    assert "--rounds" in text and "Needs --zk-nodes 3" in text


@pytest.mark.parametrize("name", ["nosuch", "checks", "row-checks", "cluster"])
def test_unknown_drills_name_the_available_ones(name, tmp_path):
    message = assert_one_line_error(run("drill", name, "--cluster", str(tmp_path)))
    assert f"unknown drill {name!r}" in message and "coordinator-failover" in message


def test_a_bad_name_or_an_option_the_drill_does_not_take_is_a_usage_error(tmp_path):
    assert run("drill", "Bad.Name", "--cluster", str(tmp_path)).exit_code == 2
    result = run("drill", "tablet-restart", "--clients", "3", "--cluster", str(tmp_path))
    assert result.exit_code == 2 and "takes no --clients" in result.stderr


def test_no_cluster_given_or_none_in_the_directory(tmp_path):
    assert "no cluster directory given" in assert_one_line_error(run("drill", "coordinator-failover"))
    message = assert_one_line_error(run("drill", "coordinator-failover", "--cluster", str(tmp_path / "none")))
    assert "no cluster in" in message and "kvlease cluster start" in message


@pytest.mark.parametrize("name, shape, needs", [
    ("zk-leader-loss", {"tablets": 1}, "needs --zk-nodes 3 (the cluster has 1)"),
    ("zk_leader_loss", {"tablets": 1}, "needs --zk-nodes 3"),  # underscores work too
    ("coordinator-failover", {"tablets": 1}, "needs --coordinators 2 or more (the cluster has 1)"),
    ("coordinator-failover", {"coordinators": 2}, "needs --tablets 1 or more (the cluster has 0)"),
    ("tablet-restart", {}, "needs --tablets 1 or more"),
    ("remote-outage", {"tablets": 1, "remote": "s3://bucket/p"}, "needs a file:// remote"),
    ("chaos", {"tablets": 1}, "needs --coordinators 2 or more (the cluster has 1)"),
    ("chaos", {"coordinators": 2}, "needs --tablets 1 or more (the cluster has 0)"),
])
def test_a_cluster_of_the_wrong_shape_says_what_the_drill_needs(tmp_path, name, shape, needs):
    message = assert_one_line_error(run("drill", name, "--cluster", fake_cluster(tmp_path, **shape)))
    assert needs in message


def test_a_cluster_that_is_not_running_whole_is_an_error(tmp_path):
    message = assert_one_line_error(run("drill", "tablet-restart", "--dir", fake_cluster(tmp_path, tablets=1)))
    assert "not running whole" in message and "coordinator 1" in message


def test_all_skips_what_the_shape_does_not_allow_and_says_why(tmp_path):
    result = run("drill", "all", "--json", "--skip", "spark-failover", "--cluster", fake_cluster(tmp_path))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    skipped = {d["drill"]: d["skipped"] for d in doc["drills"]}
    assert doc["ok"] and set(skipped) >= set(DRILLS) - {"all"}
    assert "needs --zk-nodes 3" in skipped["zk-leader-loss"] and "needs --tablets 1" in skipped["tablet-restart"]
    assert "all" not in skipped
    assert "no such drill" in assert_one_line_error(run("drill", "all", "--skip", "nosuch", "--cluster", str(tmp_path)),
                                                    code=2)
    assert skipped["spark-failover"] == "--skip"  # given: skipped for that, before its shape is looked at


def test_all_on_a_stopped_cluster_is_one_error_not_a_failed_report_per_drill(tmp_path):
    message = assert_one_line_error(run("drill", "all", "--cluster", fake_cluster(tmp_path, coordinators=2, tablets=1)))
    assert "is not running whole (ZooKeeper node 1, coordinator 1, coordinator 2, tablet server 1 down)" in message


def test_all_skips_spark_failover_on_a_cluster_without_two_coordinators(tmp_path):
    result = run("drill", "all", "--json", "--skip", "tablet-restart", "--skip", "remote-outage",
                 "--cluster", fake_cluster(tmp_path, tablets=1))
    assert result.exit_code == 0, result.output
    skipped = {d["drill"]: d.get("skipped") for d in json.loads(result.stdout)["drills"]}
    assert skipped["spark-failover"] == "drill spark-failover needs --coordinators 2 or more (the cluster has 1)"


def test_spark_failover_takes_no_options(tmp_path):
    for option in ("--rounds", "--clients", "--outage"):
        message = assert_one_line_error(run("drill", "spark-failover", option, "2", "--cluster", str(tmp_path)), code=2)
        assert f"drill spark-failover takes no {option}" in message
