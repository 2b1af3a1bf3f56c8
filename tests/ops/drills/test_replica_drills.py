"""``kvlease drill rolling-restart | disk-loss | decommission`` on one real cluster of 3 tablet servers with a
4 s ZooKeeper session timeout (shared by the three tests, stopped when they are done); the unit tests check
that the drills are registered and that ``all`` skips them on fewer tablet servers."""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout

import pytest

from kvlease.ops.drills import all as all_drills
from kvlease.ops.drills import decommission, disk_loss, registry, rolling_restart
from tests.support.cluster_logs import cluster_logs

#: a snapshot of every changed bucket every 2 s: the drills then see (and the disk-loss judge must survive) what a
#: loaded machine reaches with the default 30 s, snapshots retention deletes during one drill
FAST = {"zookeeper.session-timeout": "4s", "replica.fetch.wait-max": "200ms", "kv.snapshot.interval": "2s"}
DRILLS = {"rolling-restart": rolling_restart, "disk-loss": disk_loss, "decommission": decommission}


@pytest.mark.unit
@pytest.mark.parametrize("name", DRILLS)
def test_each_is_registered_and_skipped_by_all_on_fewer_than_three_tablet_servers(name):
    assert registry.drill_module(name) is DRILLS[name] and name in registry.drill_names()
    doc = {"zookeeper": [{}], "coordinators": [{}], "tablets": [{}, {}]}
    assert all_drills._shape_skip(name, doc) == f"drill {name} needs --tablets 3 or more (the cluster has 2)"
    assert all_drills._shape_skip(name, {**doc, "tablets": [{}, {}, {}]}) is None


@pytest.fixture(scope="module")
def three_tablets(kvlease_tmp):
    from tests.ops.drills.test_drills import _cluster

    yield from _cluster(kvlease_tmp, coordinators=1, tablets=3, config_overrides=FAST)


def _run(module, directory) -> dict:
    out, started = io.StringIO(), time.time()
    try:
        with redirect_stdout(out):
            code = module.main(str(directory), True)
    except BaseException:
        print(cluster_logs(directory, started))  # a drill that stopped with an error (a server that would not stop, …)
        raise
    report = json.loads(out.getvalue())
    if code != 0:
        print(cluster_logs(directory, started))  # shown with the failure
    assert code == 0, json.dumps(report, indent=1)
    return report


CHECKED = ("no request failed beyond the client's retries", "all in the ISR", "changelog exactly once",
           "table of every replica", "committed changelog", "identical below the high watermark", "right data",
           "typed error or resume")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rolling_restart(three_tablets):
    from tests.ops.drills.test_drills import assert_checked

    report = _run(rolling_restart, three_tablets)
    assert_checked(report, *CHECKED, "back in the ISR within 30s of each restart")
    figures = report["figures"]
    assert figures["restarted"] == ["tablet 1", "tablet 2", "tablet 3"]
    assert figures["calls"]["writes"] > 0 and figures["calls"]["lookups"] > 0 and figures["calls"]["scans"] > 0
    assert all(n == 0 for errors in figures["client_errors"].values() for n in errors.values())
    assert any("leaders spread" in c["name"] for c in report["checks"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_disk_loss(three_tablets):
    from tests.ops.drills.test_drills import assert_checked

    report = _run(disk_loss, three_tablets)
    assert_checked(report, *CHECKED, "back in the ISR within 30s", "every wiped replica holds the committed rows",
                   "fail over within")
    figures = report["figures"]
    assert [w.split(" (")[1] for w in figures["wiped"]] == ["a follower)", "a leader)"]
    assert len(set(figures["wiped"])) == 2 and all(0 < s < 30 for s in figures["rejoin_s"].values())


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_decommission(three_tablets):
    from tests.ops.drills.test_drills import assert_checked

    report = _run(decommission, three_tablets)
    # its ISR check names the stopped server too: "all in the ISR" alone would match it and the one before the stop
    before_stop = [c for c in CHECKED if c != "all in the ISR"]
    assert_checked(report, *before_stop, "a retried decommission starts nothing new", "every move of the decommission",
                   "all in the ISR, none on the stopped tablet server", "the one-replica table's buckets moved off",
                   "stays decommissioned across its restart until recommissioned")
    assert report["figures"]["moves_started"] > 0 and report["figures"]["one_replica_buckets_moved"] > 0
