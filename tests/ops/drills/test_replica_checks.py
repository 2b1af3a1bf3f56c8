"""The replica drills' pure checkers (service_checks, disk_loss_checks, decommission_checks): each passes on
a good outcome and fails, naming what broke, on a planted violation."""

from __future__ import annotations

import pytest

from kvlease.client.admin_types import BucketLeader
from kvlease.ops.drills.decommission_checks import (mark_kept, moves_finished, one_replica_moved,
                                                    retry_started_nothing_new)
from kvlease.ops.drills.disk_loss_checks import rebuilt_tables_equal, rejoined_within, replica_table
from kvlease.ops.drills.failover_checks import AckedWrite, ChangeRecord, acknowledged_writes_in_changelog
from kvlease.ops.drills.service_checks import isr_full, leaders_spread, led_by_preferred, no_client_errors

pytestmark = pytest.mark.unit


def bucket(b: int, replicas: tuple[int, ...], isr: tuple[int, ...] | None = None, leader: int | None = None,
           address: str = "127.0.0.1:1") -> BucketLeader:
    return BucketLeader(b, replicas[0] if leader is None else leader, address, 1, replicas,
                        replicas if isr is None else isr)


FULL = {0: bucket(0, (1, 2, 3)), 1: bucket(1, (2, 3, 1)), 2: bucket(2, (3, 1, 2)), 3: bucket(3, (1, 2, 3))}


def test_no_client_errors_counts_every_failed_call_by_kind():
    calls = {"writes": 100, "lookups": 50, "scans": 3}
    assert no_client_errors({"writes": {}, "lookups": {}, "scans": {}}, calls).ok
    check = no_client_errors({"writes": {"NotEnoughReplicasError": 2, "TimeoutError": 1}, "lookups": {},
                              "scans": {"NotLeaderError": 1}}, calls)
    assert check.violations == (
        "1 of 3 scans failed after the client's retries (NotLeaderError 1)",
        "3 of 100 writes failed after the client's retries (NotEnoughReplicasError 2, TimeoutError 1)")
    assert check.checked == 153


def test_isr_full_passes_on_full_isrs_and_names_each_planted_fault():
    assert isr_full(FULL, 3).ok and isr_full(FULL, 3).checked == 4
    planted = {0: bucket(0, (1, 2, 3), isr=(1, 2)),  # a replica out of sync
               1: bucket(1, (2, 3)),  # too few replicas
               2: bucket(2, (3, 1, 2), address=""),  # no live leader
               3: bucket(3, (1, 2, 3), leader=-1)}  # none at all
    assert isr_full(planted, 3).violations == (
        "bucket 0 (replicas [1, 2, 3], ISR [1, 2]): not every replica is in sync",
        "bucket 1 (replicas [2, 3], ISR [2, 3]): 2 distinct replicas, not 3",
        "bucket 2 (replicas [3, 1, 2], ISR [3, 1, 2]): no live in-sync leader (leader 3)",
        "bucket 3 (replicas [1, 2, 3], ISR [1, 2, 3]): no live in-sync leader (leader -1)")


def test_isr_full_fails_on_a_replica_left_on_a_server_moved_away_from():
    moved = {0: bucket(0, (1, 2)), 1: bucket(1, (2, 1))}
    assert isr_full(moved, 2, away={3}).ok
    check = isr_full({**moved, 1: bucket(1, (2, 3))}, 2, away={3})
    assert check.violations == ("bucket 1 (replicas [2, 3], ISR [2, 3]): still has a replica on tablet server 3",)


def test_leaders_spread():
    assert leaders_spread(FULL, [1, 2, 3]).ok  # 2, 1, 1
    piled = {b: bucket(b, s.replicas, leader=1) for b, s in FULL.items()}
    assert leaders_spread(piled, [1, 2, 3]).violations == (
        "leaders are not spread: tablet 1 leads 4, tablet 2 leads 0, tablet 3 leads 0",)


def test_led_by_preferred_names_each_bucket_led_by_another_replica():
    assert led_by_preferred(FULL).ok and led_by_preferred(FULL).checked == 4
    moved = {**FULL, 1: bucket(1, (2, 3, 1), leader=3)}
    assert led_by_preferred(moved).violations == (
        "bucket 1 (replicas [2, 3, 1]) is led by 3, not its preferred replica 2",)


def test_a_replica_table_is_its_snapshot_with_its_changelog_applied():
    records = [ChangeRecord(5, "-U", 1, 10), ChangeRecord(6, "+U", 1, 11), ChangeRecord(7, "-D", 2, 20),
               ChangeRecord(8, "+I", 3, 30)]
    assert replica_table({1: 10, 2: 20}, records) == {1: 11, 3: 30}
    assert replica_table(None, records[1:]) == {1: 11, 3: 30}


def test_rebuilt_tables_equal_the_kept_replicas_table():
    kept = {1: 11, 3: 30}
    assert rebuilt_tables_equal({"tablet 2": dict(kept), "tablet 3": dict(kept)}, "tablet 1", kept).ok
    check = rebuilt_tables_equal({"tablet 2": {1: 10, 3: 30, 4: 40}, "tablet 3": None}, "tablet 1", kept)
    assert check.violations == (
        "tablet 2: key 1 is 10, tablet 1 has 11",
        "tablet 2: key 4 is 40, tablet 1 has no row",
        "tablet 3: its table could not be read back (no kept snapshot at its log start)")


def test_rejoined_within_the_bound():
    assert rejoined_within([("tablet 2 (a follower)", 3.5), ("tablet 3 (a leader)", 7.0)], 30.0).ok
    check = rejoined_within([("tablet 2 (a follower)", 31.0), ("tablet 3 (a leader)", None)], 30.0)
    assert check.violations == ("tablet 2 (a follower): back in the ISR only after 31.0s",
                                "tablet 3 (a leader): not back in the ISR within 30s")


def test_a_replica_rebuilt_from_a_snapshot_is_asked_only_for_the_writes_after_its_log_start():
    acked = [AckedWrite(0, 0, 1, {1: 10}), AckedWrite(0, 1, 2, {1: 11})]
    full = [ChangeRecord(0, "+I", 1, 10), ChangeRecord(1, "+U", 1, 11)]
    rebuilt = full[1:]  # its changelog starts at 1: offset 0 is in the snapshot it started from
    changelogs = {"tablet 1": {0: full}, "tablet 2": {0: rebuilt}}
    assert acknowledged_writes_in_changelog(acked, changelogs, {"tablet 2": {0: 1}}).ok
    check = acknowledged_writes_in_changelog(acked, changelogs)  # without its log start: the write at 0 missing
    assert check.violations == ("tablet 2: write at 0..0 of bucket 0: key 1 = 10 is not in the changelog at those "
                                "offsets",)
    lost = {"tablet 1": {0: full}, "tablet 2": {0: []}}  # a start does not excuse a write after it
    assert not acknowledged_writes_in_changelog(acked, lost, {"tablet 2": {0: 1}}).ok


def test_a_retried_decommission_starts_nothing_new():
    first = [{"table": "drill.t", "bucket": 0, "target": [2, 3]}, {"table": "drill.t", "bucket": 2}]
    assert retry_started_nothing_new(first, []).ok
    assert retry_started_nothing_new(first, list(reversed(first))).ok
    check = retry_started_nothing_new(first, [{"table": "drill.t", "bucket": 1}])
    assert check.violations == ("the retried call started a move the first did not: {'table': 'drill.t', 'bucket': 1}",)


def test_moves_finished():
    assert moves_finished([{"bucket": 0}], [], 3.0).ok
    check = moves_finished([{"bucket": 0}], [{"bucket": 0, "state": "catching-up"}], 60.0)
    assert check.violations == ("still in progress after 60s: {'bucket': 0, 'state': 'catching-up'}",)


def test_the_decommission_mark_is_kept_across_the_restart_until_recommissioned():
    assert mark_kept(3, [3], True, []).ok
    for after_restart, recommissioned, after, fault in (([], True, [], "is not decommissioned any more"),
                                                        ([3], False, [], "answered it was not decommissioned"),
                                                        ([3], True, [3], "still decommissioned after")):
        check = mark_kept(3, after_restart, recommissioned, after)
        assert not check.ok and len(check.violations) == 1 and fault in check.violations[0]


def test_one_replica_moved():
    moved = {0: bucket(0, (2,)), 1: bucket(1, (3,))}
    rows = {1: 1, 2: 2}
    assert one_replica_moved(moved, 1, [0], rows, dict(rows)).ok
    check = one_replica_moved({**moved, 1: bucket(1, (1,))}, 1, [0], rows, {1: 1, 2: None})
    assert check.violations == ("bucket 1: replicas [1], leader 1 (want one replica, not tablet server 1, leading it)",
                                "key 2: wrote 2, read None")
    assert one_replica_moved({0: bucket(0, (2, 3))}, 1, [0], {}, {}).violations == (
        "bucket 0: replicas [2, 3], leader 2 (want one replica, not tablet server 1, leading it)",)
    assert one_replica_moved(moved, 1, [], rows, dict(rows)).violations == (
        "no bucket of the one-replica table was on tablet server 1: none was moved",)
