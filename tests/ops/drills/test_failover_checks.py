"""The tablet-failover drill's pure checkers (ops/drills/failover_checks.py): each passes on a good history
and fails, naming what broke, on a planted violation."""

from __future__ import annotations

import dataclasses

import pytest

from kvlease.ops.drills.failover_checks import (AckedWrite, ChangeRecord, Outage, Read,
                                                acknowledged_writes_in_changelog, apply_changes,
                                                leaders_served_within, reads_committed, replicas_identical,
                                                stream_equals_table, tables_as_acknowledged)
from kvlease.ops.drills.row_checks import WriteOp

pytestmark = pytest.mark.unit

# bucket 0: key 1 inserted (=10), key 2 inserted (=20), key 1 updated (=11), key 2 deleted
LOG = [ChangeRecord(0, "+I", 1, 10), ChangeRecord(1, "+I", 2, 20),
       ChangeRecord(2, "-U", 1, 10), ChangeRecord(3, "+U", 1, 11), ChangeRecord(4, "-D", 2, 20)]
ACKED = [AckedWrite(0, 0, 2, {1: 10, 2: 20}), AckedWrite(0, 2, 4, {1: 11}), AckedWrite(0, 4, 5, {2: None})]
HISTORY = {1: [WriteOp(1, 10, 0.0, 1.0, True), WriteOp(1, 11, 2.0, 3.0, True)],
           2: [WriteOp(2, 20, 0.0, 1.0, True), WriteOp(2, None, 4.0, 5.0, True)]}


def test_acknowledged_writes_pass_on_a_good_history():
    check = acknowledged_writes_in_changelog(ACKED, {"tablet 1": {0: LOG}, "tablet 2": {0: LOG}})
    assert check.ok and check.checked == 6


@pytest.mark.parametrize("log, words", [
    ([r for r in LOG if r.offset != 3], "key 1 = 11 is not in the changelog at those offsets"),  # lost
    (LOG + [ChangeRecord(5, "-U", 1, 11), ChangeRecord(6, "+U", 1, 11)], "key 1 = 11 is in the changelog 2 times"),
    ([dataclasses.replace(r, offset=r.offset + 1) for r in LOG], "not in the changelog at those offsets"),  # moved
])
def test_acknowledged_writes_fail_on_a_lost_duplicated_or_moved_write(log, words):
    check = acknowledged_writes_in_changelog(ACKED, {"tablet 1": {0: LOG}, "tablet 2": {0: log}})
    assert not check.ok and all(v.startswith("tablet 2: ") for v in check.violations)
    assert any(words in v for v in check.violations)


def test_a_replica_without_the_bucket_is_a_violation():
    check = acknowledged_writes_in_changelog(ACKED, {"tablet 3": {}})
    assert check.violations == ("tablet 3: no changelog of bucket 0, which has acknowledged writes",)


def test_every_replicas_table_is_checked_against_the_writes():
    good = {1: 11}
    assert tables_as_acknowledged(HISTORY, {"tablet 1": good, "tablet 2": good}).ok
    check = tables_as_acknowledged(HISTORY, {"tablet 1": good, "tablet 2": {1: 10, 2: 20}})
    assert check.violations == ("key 1: tablet 2 reads 10, the writes allow 11",
                                "key 2: tablet 2 reads 20, the writes allow no row")


def test_reads_of_committed_values_pass_and_a_value_taken_back_fails():
    reads = [Read("lookup", 1, 10, 1.5), Read("scan", 1, 11), Read("lookup", 2, None)]
    assert reads_committed(reads, {0: LOG}).ok
    check = reads_committed(reads + [Read("scan", 2, 21, 6.25)], {0: LOG})
    assert check.violations == ("scan read key 2 = 21 at 6.250, which no committed change record wrote",)


def test_the_stream_applied_in_order_equals_the_table():
    stream = {0: [ChangeRecord(-1, "+I", 1, 10)] + LOG[1:]}  # bootstrap row of key 1, then the changes
    assert apply_changes(stream[0]) == {1: 11}
    assert stream_equals_table(stream, {1: 11, 2: None}).ok


@pytest.mark.parametrize("rows, words", [
    (LOG[:3], "key 1: the stream applied in order gives 10, the table has 11"),  # a change skipped
    (LOG + [LOG[1]], "record +I of key 2 at offset 1 came 2 times"),  # a change repeated
    ([LOG[3], LOG[0]], "key 1: the stream applied in order gives 10"),  # out of order
])
def test_the_stream_fails_on_a_gap_a_duplicate_or_a_wrong_table(rows, words):
    check = stream_equals_table({0: rows}, {1: 11})
    assert not check.ok and any(words in v for v in check.violations)


def test_replicas_identical_below_the_high_watermark():
    leader = {0: [(0, 111), (2, 222), (4, 333), (5, 444)]}
    follower = {0: [(0, 111), (2, 222), (4, 333)]}  # not caught up above the HW: fine
    trimmed = {0: [(2, 222), (4, 333)]}  # retention removed its first entry already: compared from there
    assert replicas_identical({"tablet 1": leader, "tablet 2": follower, "tablet 3": trimmed}, {0: 5}).ok
    diverged = {0: [(0, 111), (2, 999), (4, 333)]}
    short = {0: [(0, 111), (2, 222)]}
    check = replicas_identical({"tablet 1": leader, "tablet 2": diverged, "tablet 3": short}, {0: 5},
                               describe=lambda fingerprint: f"entry #{fingerprint}")
    assert check.violations == (
        "bucket 0: tablet 2's changelog differs from tablet 1's at offset 2 (below the high watermark 5: 3 vs 3 "
        "entries; tablet 2 has entry #999 at 2, tablet 1 has entry #222 at 2)",
        "bucket 0: tablet 3's changelog differs from tablet 1's at offset 4 (below the high watermark 5: 2 vs 3 "
        "entries; tablet 3 has none, tablet 1 has entry #333 at 4)")
    plain = replicas_identical({"tablet 1": leader, "tablet 2": diverged}, {0: 5})
    assert plain.violations[0].endswith("tablet 2 has an entry at 2, tablet 1 has an entry at 2)")


def test_leaders_served_within_the_bound():
    outages = [Outage("round 1: kill -9 tablet 1", 100.0, frozenset({0, 2})),
               Outage("round 2: SIGSTOP tablet 2", 200.0, frozenset({1}))]
    successes = {0: [(98.5, 99.0), (103.0, 103.5)], 2: [(103.9, 104.0)], 1: [(149.0, 150.0), (204.0, 205.0)]}
    check, delays = leaders_served_within(outages, successes, bound_s=8.0)
    assert check.ok and check.checked == 3 and delays == [4.0, 5.0]
    check, delays = leaders_served_within(outages, {0: [(103.0, 103.5)], 2: [(108.0, 109.0)], 1: [(150.0, 150.5)]},
                                          bound_s=8.0)
    assert check.violations == ("round 1: kill -9 tablet 1: bucket 2 served again only after 9.0s",
                                "round 2: SIGSTOP tablet 2: bucket 1 was never served again")
    assert delays == [9.0, None]


def test_a_call_sent_before_the_outage_does_not_count_as_served_again():
    outage = Outage("round 1: kill -9 tablet 1", 100.0, frozenset({0}))
    check, delays = leaders_served_within([outage], {0: [(99.9, 100.2), (109.5, 110.0)]}, bound_s=8.0)
    assert check.violations == ("round 1: kill -9 tablet 1: bucket 0 served again only after 10.0s",)
    assert delays == [10.0]


def test_an_entry_is_described_by_its_leader_epoch_and_writer_batch():
    from kvlease.common.logentry import encode_payload, frame_header, record_batch
    from kvlease.ops.drills.replica_logs import describe_frame

    payload = encode_payload(record_batch([0], [b"k"], [b"v"]))
    written = frame_header(7, 1, payload, 1000, leader_epoch=4, writer_id=2, sequence=46) + payload.to_pybytes()
    assert describe_frame(written) == "an entry of leader epoch 4, writer 2 batch 46"
    assert describe_frame(frame_header(7, 1, payload, 1000, leader_epoch=5) + payload.to_pybytes()) == (
        "an entry of leader epoch 5")
    assert describe_frame(b"junk") == "a damaged entry"
