"""The drills' checkers fail on planted violations and pass on clean input (tier 1: no processes)."""

from __future__ import annotations

import struct
import zlib

import pytest

from kvlease.common.model import TableBucket
from kvlease.ops.drills.checks import (NOT_FOUND, OK, UNKNOWN, LeaseOp, PointerSample, failures_clean,
                                       leased_files_exist, leases_as_acknowledged, no_deposed_writes, no_orphan_files,
                                       pointers_resolve, recovered, replay)
from kvlease.ops.drills.row_checks import (ScanRecord, WriteOp, possible_values, rows_as_acknowledged,
                                           scans_end_cleanly, scans_match)
from kvlease.ops.drills.zk_txnlog import Txn, ZkOp, parse_log

pytestmark = pytest.mark.unit

B0, B1, B2 = (TableBucket(7, b) for b in range(3))
DUR = 600_000


def acquire(lease, t, snapshots, acquired=None, expiration=None, outcome=OK):
    acquired = dict(snapshots) if acquired is None else acquired
    return LeaseOp(lease, "acquire", t, t + 0.01, outcome, DUR, dict(snapshots),
                   expiration=expiration if expiration is not None else int(t * 1000) + DUR,
                   acquired=acquired if outcome == OK else {})


def renew(lease, t, outcome=OK):
    return LeaseOp(lease, "renew", t, t + 0.01, outcome, DUR, expiration=int(t * 1000) + DUR if outcome == OK else 0)


def release(lease, t, bucket, remains, outcome=OK):
    return LeaseOp(lease, "release", t, t + 0.01, outcome, bucket=bucket, remains=remains)


def drop(lease, t, outcome=OK):
    return LeaseOp(lease, "drop", t, t + 0.01, outcome)


def view(t, buckets):
    return int(t * 1000) + DUR, dict(buckets)


def everywhere(views):
    return {"describe": views, "list": {k: v for k, v in views.items() if v is not None}, "zookeeper+files": views}


# -- leases ------------------------------------------------------------------------------------------------


def test_acknowledged_leases_pass_when_read_back_as_acknowledged():
    history = {"a": [acquire("a", 100.0, {B0: 1, B1: 2}), renew("a", 101.0), release("a", 102.0, B1, True)],
               "b": [acquire("b", 100.0, {B0: 1}), drop("b", 101.0)],
               "c": [acquire("c", 100.0, {B2: 3}, acquired={}, expiration=0)]}  # nothing available: no lease
    check = leases_as_acknowledged(history, everywhere({"a": view(101.0, {B0: 1}), "b": None, "c": None}))
    assert check.ok, check.violations
    assert check.checked == 3


def test_a_lost_lease_is_a_violation():
    history = {"a": [acquire("a", 100.0, {B0: 1})]}
    check = leases_as_acknowledged(history, everywhere({"a": None}))
    assert not check.ok
    assert any("lease a: describe reads no lease" in v for v in check.violations)


def test_a_lease_read_back_with_other_buckets_is_a_violation():
    history = {"a": [acquire("a", 100.0, {B0: 1, B1: 2})]}
    check = leases_as_acknowledged(history, everywhere({"a": view(100.0, {B0: 1, B1: 3})}))
    assert any("7/1=3" in v and "7/1=2" in v for v in check.violations), check.violations
    check = leases_as_acknowledged(history, everywhere({"a": view(100.0, {B0: 1})}))  # a bucket lost
    assert not check.ok


def test_a_deadline_other_than_acknowledged_is_a_violation():
    history = {"a": [acquire("a", 100.0, {B0: 1}), renew("a", 105.0)]}
    assert not leases_as_acknowledged(history, everywhere({"a": view(100.0, {B0: 1})})).ok
    assert leases_as_acknowledged(history, everywhere({"a": view(105.0, {B0: 1})})).ok


def test_sources_that_disagree_are_a_violation_even_when_both_are_possible():
    history = {"a": [acquire("a", 100.0, {B0: 1}), drop("a", 101.0, outcome=UNKNOWN)]}
    readbacks = {"describe": {"a": view(100.0, {B0: 1})}, "zookeeper+files": {"a": None}}
    check = leases_as_acknowledged(history, readbacks)
    assert [v for v in check.violations if "disagree" in v] and len(check.violations) == 1


def test_a_lease_no_client_made_is_a_violation():
    check = leases_as_acknowledged({}, everywhere({"ghost": view(1.0, {B0: 1})}))
    assert any("no client acquired it" in v for v in check.violations)


@pytest.mark.parametrize("lost", ["acquire", "renew", "release", "drop"])
def test_a_call_of_unknown_outcome_may_have_applied_or_not(lost):
    start = [acquire("a", 100.0, {B0: 1, B1: 2})]
    op = {"acquire": acquire("a", 110.0, {B0: 5}, outcome=UNKNOWN), "renew": renew("a", 110.0, outcome=UNKNOWN),
          "release": release("a", 110.0, B1, False, outcome=UNKNOWN), "drop": drop("a", 110.0, outcome=UNKNOWN)}[lost]
    applied = {"acquire": view(110.0, {B0: 5, B1: 2}), "renew": view(110.0, {B0: 1, B1: 2}),
               "release": view(100.0, {B0: 1}), "drop": None}[lost]
    for outcome in (view(100.0, {B0: 1, B1: 2}), applied):
        assert leases_as_acknowledged({"a": start + [op]}, everywhere({"a": outcome})).ok, outcome
    assert not leases_as_acknowledged({"a": start + [op]}, everywhere({"a": view(110.0, {B2: 9})})).ok


def test_an_acknowledged_call_after_an_unknown_one_determines_the_lease_again():
    history = {"a": [acquire("a", 100.0, {B0: 1}), drop("a", 101.0, outcome=UNKNOWN), acquire("a", 102.0, {B1: 4})]}
    possible, contradictions = replay(history["a"])
    assert not contradictions
    assert possible.admits(view(102.0, {B1: 4})) and possible.admits(view(102.0, {B0: 1, B1: 4}))
    assert not possible.admits(None) and not possible.admits(view(102.0, {B0: 1}))
    assert not possible.admits(view(101.0, {B1: 4}))  # the deadline is the acknowledged one


def test_answers_that_contradict_acknowledged_calls_are_violations():
    renewed_after_drop = [acquire("a", 100.0, {B0: 1}), drop("a", 101.0), renew("a", 102.0)]
    not_found_while_held = [acquire("a", 100.0, {B0: 1}), renew("a", 101.0, outcome=NOT_FOUND)]
    gone_with_a_bucket_left = [acquire("a", 100.0, {B0: 1, B1: 1}), release("a", 101.0, B0, False)]
    for history in (renewed_after_drop, not_found_while_held, gone_with_a_bucket_left):
        _possible, contradictions = replay(history)
        assert contradictions, history


# -- snapshot files, lease files ------------------------------------------------------------------------------


def test_a_deleted_file_of_a_leased_snapshot_is_a_violation():
    leased = {(B0, 3): {"a", "b"}, (B1, 1): {"a"}}
    manifests = {(B0, 3): ["kv/7/0/shared/1.sst", "kv/7/0/snap-3/CURRENT"], (B1, 1): ["kv/7/1/shared/2.sst"]}
    files = {"kv/7/0/shared/1.sst", "kv/7/0/snap-3/CURRENT", "kv/7/1/shared/2.sst"}
    assert leased_files_exist(leased, manifests, files).ok
    check = leased_files_exist(leased, manifests, files - {"kv/7/0/shared/1.sst"})
    assert check.violations == ("snapshot 3 of bucket 7/0 (leased by a, b): kv/7/0/shared/1.sst is gone",)
    check = leased_files_exist(leased, {**manifests, (B1, 1): None}, files)
    assert check.violations == ("snapshot 1 of bucket 7/1 (leased by a): manifest is gone",)


def test_a_zookeeper_node_pointing_at_a_missing_file_is_a_violation():
    good = PointerSample("before", {"a": ["lease/kv-snapshot/a/7/x.metadata"]},
                         frozenset({"lease/kv-snapshot/a/7/x.metadata", "lease/kv-snapshot/b/7/y.metadata"}))
    bad = PointerSample("1.0s into the outage", {"a": ["lease/kv-snapshot/a/7/z.metadata"]}, good.existing)
    assert pointers_resolve([good]).ok
    check = pointers_resolve([good, bad])
    assert check.violations == ("1.0s into the outage: lease a points at lease/kv-snapshot/a/7/z.metadata, "
                                "which does not exist",)


def test_an_orphan_lease_file_is_a_violation():
    pointers = {"a": ["lease/kv-snapshot/a/7/x.metadata"]}
    assert no_orphan_files(["lease/kv-snapshot/a/7/x.metadata"], pointers).ok
    check = no_orphan_files(["lease/kv-snapshot/a/7/x.metadata", "lease/kv-snapshot/a/7/old.metadata"], pointers)
    assert check.violations == ("lease/kv-snapshot/a/7/old.metadata: no lease node points at it",)


# -- fencing ----------------------------------------------------------------------------------------------------

ROOT = "/kvlease"
EPOCH = ROOT + "/coordinators/epoch"
OLD, NEW = 0x100, 0x200


def took_epoch(zxid, session, version):
    return Txn(zxid, session, 0, False, (ZkOp("set", EPOCH, version),))


def fenced(zxid, session, checked, *ops):
    return Txn(zxid, session, 0, True, (ZkOp("check", EPOCH, checked), *ops))


LEASE = ZkOp("set", ROOT + "/leases/kv_snapshot/a", 3)


def test_writes_by_the_epoch_holder_pass_and_containers_and_other_nodes_are_not_judged():
    txns = [Txn(1, OLD, 0, False, (ZkOp("create", ROOT + "/leases"), ZkOp("create", ROOT + "/leases/kv_snapshot"))),
            Txn(2, OLD, 0, False, (ZkOp("create", EPOCH),)), took_epoch(3, OLD, 1),
            fenced(4, OLD, 1, ZkOp("create", ROOT + "/coordinators/active"), ZkOp("create", ROOT + "/tables/1")),
            Txn(5, 0x300, 0, False, (ZkOp("create", ROOT + "/tabletservers/ids/1"),)),
            took_epoch(6, NEW, 2), fenced(7, NEW, 2, LEASE)]
    check = no_deposed_writes(txns, ROOT)
    assert check.ok, check.violations
    assert check.checked == 2


def test_a_write_from_a_deposed_epoch_is_a_violation():
    txns = [took_epoch(3, OLD, 1), fenced(4, OLD, 1, LEASE), took_epoch(6, NEW, 2), fenced(7, OLD, 1, LEASE)]
    check = no_deposed_writes(txns, ROOT)
    assert check.violations == ("zxid 0x7: set /leases/kv_snapshot/a by session 0x100, but epoch version 2 was "
                                "held by session 0x200",)
    assert no_deposed_writes(txns, ROOT, since_zxid=8).ok  # judged only from since_zxid on


def test_an_unfenced_or_wrongly_fenced_write_is_a_violation():
    txns = [took_epoch(3, NEW, 2), Txn(4, NEW, 0, False, (LEASE,)), fenced(5, NEW, 1, LEASE)]
    check = no_deposed_writes(txns, ROOT)
    assert len(check.violations) == 2
    assert "without the epoch check" in check.violations[0] and "checked epoch version 1" in check.violations[1]


def _record(session, zxid, kind, body):
    txn = struct.pack(">qiqqi", session, 0, zxid, 1_700_000_000_000, kind) + body
    return struct.pack(">qi", zlib.adler32(txn), len(txn)) + txn + b"B"


def _string(text):
    data = text.encode()
    return struct.pack(">i", len(data)) + data


def test_the_transaction_log_parser_reads_writes_multi_ops_and_stops_at_a_torn_record():
    set_data = _string(EPOCH) + _string('{"epoch":2}') + struct.pack(">i", 2)
    check = _string(EPOCH) + struct.pack(">i", 3)  # logged as the version after an increment
    create = _string(ROOT + "/leases/kv_snapshot/a") + _string("{}") + struct.pack(">i", 0)
    error = struct.pack(">i", -101)
    multi = struct.pack(">i", 3) + b"".join(struct.pack(">i", t) + struct.pack(">i", len(b)) + b
                                            for t, b in ((13, check), (1, create), (-1, error)))
    log = (b"ZKLG" + struct.pack(">iq", 2, 0) + _record(NEW, 5, 5, set_data) + _record(NEW, 6, 14, multi)
           + _record(NEW, 7, -10, struct.pack(">i", 6000))[:-5] + b"\0" * 64)  # torn, then preallocated zeros
    txns = list(parse_log(log))
    assert [t.zxid for t in txns] == [5, 6]
    assert txns[0].ops == (ZkOp("set", EPOCH, 2),) and not txns[0].multi
    assert txns[1].multi and txns[1].ops == (ZkOp("check", EPOCH, 2), ZkOp("create", ROOT + "/leases/kv_snapshot/a"))
    assert txns[1].session == NEW


# -- failures and recovery ----------------------------------------------------------------------------------


def test_an_untyped_or_slow_failure_is_a_violation():
    clean = [renew("a", 1.0), LeaseOp("a", "acquire", 2.0, 4.0, UNKNOWN, error="StorageError")]
    assert failures_clean(clean, 5.0).ok
    untyped = LeaseOp("a", "acquire", 2.0, 2.1, UNKNOWN, error="UnknownServerError")
    internal = LeaseOp("a", "acquire", 2.0, 2.1, UNKNOWN, error="internal: KeyError: 'x'")
    slow = LeaseOp("a", "release", 2.0, 40.0, UNKNOWN, error="NetworkError")
    assert len(failures_clean(clean + [untyped, internal, slow], 5.0).violations) == 3


def test_no_or_slow_recovery_is_a_violation():
    assert recovered([6.2, 7.0], 30.0).ok
    assert recovered([6.2, None, 31.0], 30.0).violations == ("round 2: nothing within 30s",
                                                              "round 3: an acquire succeeds only after 31.0s")


# -- rows and scans --------------------------------------------------------------------------------------------


def w(key, value, t, acked=True):
    return WriteOp(key, value, t, t + 0.1, acked)


def test_rows_read_back_as_the_acknowledged_writes_say():
    history = {1: [w(1, 10, 1.0), w(1, 11, 2.0)], 2: [w(2, 20, 1.0), w(2, None, 2.0)], 3: [w(3, 30, 1.0, acked=False)]}
    for three in (None, 30):  # an unacknowledged write may or may not be there
        assert rows_as_acknowledged(history, {"lookup": {1: 11, 2: None, 3: three}}).ok


def test_a_missing_or_stale_acknowledged_row_is_a_violation():
    history = {1: [w(1, 10, 1.0), w(1, 11, 2.0)], 2: [w(2, 20, 1.0)]}
    check = rows_as_acknowledged(history, {"lookup": {1: 10, 2: None}, "scan": {1: 11, 2: 20, 9: 90}})
    assert check.violations == ("key 1: lookup reads 10, the writes allow 11",
                                "key 2: lookup reads no row, the writes allow 20",
                                "key 9: scan reads 90, but it was never written")


def test_an_unacknowledged_write_before_an_acknowledged_one_is_overwritten():
    history = [w(1, 10, 1.0, acked=False), w(1, 11, 2.0)]
    assert possible_values(history) == {11}
    assert possible_values(history, 1.5, 1.6) == {None, 10}  # before the second: the first, or nothing
    assert possible_values(history, 1.5, 2.05) == {None, 10, 11}


def scan(rows, t_open=1.5, t_end=1.6, complete=True, bucket=0, **kwargs):
    return ScanRecord("s", bucket, t_open, t_end, rows, complete, False, **kwargs)


def test_scans_pass_with_the_values_held_while_they_were_open():
    history = {1: [w(1, 10, 1.0), w(1, 11, 2.0)], 2: [w(2, 20, 1.0)], 3: [w(3, 30, 3.0)]}
    bucket_of = {1: 0, 2: 0, 3: 0}
    assert scans_match([scan([(1, 10), (2, 20)])], history, bucket_of).ok  # key 3 did not exist yet
    assert scans_match([scan([(1, 11), (2, 20), (3, 30)], 2.5, 3.5)], history, bucket_of).ok


def test_a_wrong_scanned_row_is_a_violation():
    history = {1: [w(1, 10, 1.0), w(1, 11, 2.0)], 2: [w(2, 20, 1.0)]}
    bucket_of = {1: 0, 2: 1}
    check = scans_match([scan([(1, 11), (1, 11), (2, 20), (5, 50)], complete=False)], history, bucket_of)
    assert check.violations == (
        "s: key 1 returned 2 times",
        "s: key 1 has value 11, while open it could be 10",
        "s: key 1 has value 11, while open it could be 10",
        "s: key 2 belongs to bucket 1, not 0",
        "s: key 5 (value 50) was never written")
    missing = scans_match([scan([], t_open=1.5)], history, bucket_of)
    assert missing.violations == ("s: key 1 missing, while open it was 10",)


def test_an_interrupted_scan_must_end_with_a_typed_error_or_resume():
    fine = [scan([], error="UnknownScannerIdError", complete=False, interrupted=True), scan([], resumed=1)]
    assert scans_end_cleanly(fine).ok
    untyped = scan([], complete=False, error="internal: KeyError: 'v'")
    resume_failed = ScanRecord("r", 0, 1.0, 2.0, [], False, True, error="NetworkError")
    assert len(scans_end_cleanly([untyped, resume_failed]).violations) == 2
