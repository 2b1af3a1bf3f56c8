"""The checkers of the demo and the spark-failover drill (ops/streaming/feed_check.py): they pass on a correct stream
output and fail on each kind of planted fault."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kvlease.ops.streaming import feed_check

pytestmark = pytest.mark.unit

KEY, VALUES = ("id",), ("v",)


def output(rows: list[tuple]) -> pa.Table:
    """Rows ``(batch, bucket, offset, change_type, id, v)`` as a stream's output."""
    names = ["_batch", "_bucket", "_log_offset", "_change_type", "id", "v"]
    return pa.table({name: [r[i] for r in rows] for i, name in enumerate(names)})


def table(rows: dict[int, str]) -> pa.Table:
    return pa.table({"id": list(rows), "v": list(rows.values())})


# bucket 0: keys 1, 2 bootstrapped (end offset 5); then 1 updated (5, 6), 2 deleted (7), 3 inserted (8)
# bucket 1: key 10 bootstrapped (end offset 2); then nothing
GOOD = [
    (0, 0, 3, "insert", 1, "a"), (0, 0, 4, "insert", 2, "b"), (0, 1, 1, "insert", 10, "x"),
    (1, 0, 5, "update_preimage", 1, "a"), (1, 0, 6, "update_postimage", 1, "a2"),
    (2, 0, 7, "delete", 2, "b"), (2, 0, 8, "insert", 3, "c"),
]
BOOT_ENDS, FINAL_ENDS = {0: 5, 1: 2}, {0: 9, 1: 2}
STATE = {1: "a2", 3: "c", 10: "x"}


def checks(rows, state=STATE, boot=BOOT_ENDS, final=FINAL_ENDS):
    out = output(rows)
    return {"bootstrap": feed_check.check_bootstrap(out, KEY, boot),
            "tail": feed_check.check_tail(out, boot, final),
            "state": feed_check.check_state(out, table(state), KEY, VALUES)}


def test_a_correct_output_passes_every_check():
    result = checks(GOOD)
    assert all(c.ok for c in result.values()), result
    assert result["tail"].checked == 4 and result["state"].checked == 3
    assert feed_check.apply_changes(output(GOOD), KEY, VALUES) == {(k,): (v,) for k, v in STATE.items()}


def test_changes_are_applied_in_offset_order_not_row_order():
    shuffled = list(reversed(GOOD))
    assert feed_check.apply_changes(output(shuffled), KEY, VALUES) == {(k,): (v,) for k, v in STATE.items()}


@pytest.mark.parametrize("index", range(3, len(GOOD)))
def test_any_missing_change_row_fails(index):
    result = checks(GOOD[:index] + GOOD[index + 1:])
    assert not result["tail"].ok
    assert f"offset(s) {GOOD[index][2]} missing" in result["tail"].violations[0]


def test_a_missing_change_that_moves_the_state_fails_the_state_check_too():
    result = checks([r for r in GOOD if r[2] != 6])  # the update's after-image
    assert not result["state"].ok
    assert result["state"].violations == ("id=1: the output {v: 'a'}, the table {v: 'a2'}",)


def test_a_doubled_change_row_fails():
    result = checks(GOOD + [(3, 0, 7, "delete", 2, "b")])
    assert result["tail"].violations == ("bucket 0: offset 7 is in the output 2 times",)


def test_a_change_past_the_end_or_in_an_unknown_bucket_fails():
    assert "outside the tail [5, 9)" in checks(GOOD + [(3, 0, 9, "insert", 4, "d")])["tail"].violations[0]
    assert "no such bucket" in checks(GOOD + [(3, 7, 0, "insert", 4, "d")])["tail"].violations[0]


def test_a_doubled_or_late_bootstrap_row_fails():
    doubled = checks(GOOD + [(0, 0, 2, "insert", 1, "a")])["bootstrap"]
    assert doubled.violations == ("id=1: 2 rows in the bootstrap",)
    late = checks([(0, 1, 2, "insert", 11, "y")] + GOOD)["bootstrap"]
    assert late.violations == ("bucket 1: a bootstrap row at offset 2, past the bootstrap's end 2",)


def test_a_table_that_differs_fails_naming_the_keys():
    result = checks(GOOD, state={1: "a2", 3: "c", 10: "x", 11: "z"})["state"]
    assert result.violations == ("id=11: not in the output; in the table: {v: 'z'}",)
    result = checks(GOOD, state={1: "a2", 10: "x"})["state"]
    assert result.violations == ("id=3: in the output: {v: 'c'}; not in the table",)


def test_the_table_against_the_acknowledged_writes():
    assert feed_check.check_written({(1,): ("a2",)}, table({1: "a2"}), KEY, VALUES).ok
    lost = feed_check.check_written({(1,): ("a2",), (2,): ("b",)}, table({1: "a2"}), KEY, VALUES)
    assert lost.violations == ("id=2: not in the table; in the acknowledged writes: {v: 'b'}",)


def test_long_violation_lists_are_capped():
    state = {i: "z" for i in range(200)}
    result = checks(GOOD, state=state)["state"]
    assert len(result.violations) == feed_check.MAX_VIOLATIONS + 1
    assert result.violations[-1].startswith("… and ")


def test_an_unknown_change_type_is_an_error():
    with pytest.raises(ValueError, match="unknown _change_type 'upsert'"):
        feed_check.apply_changes(output([(1, 0, 0, "upsert", 1, "a")]), KEY, VALUES)


@pytest.mark.unit
def test_a_lease_watch_judges_released_from_what_other_clients_saw_too():
    """The watch polls from outside and can miss a lease that lived a second on the new active coordinator:
    a deadline another client saw and a listing without the lease are evidence too."""
    import time

    from kvlease.ops.streaming.stream_failover import LeaseWatch

    watch = LeaseWatch(["127.0.0.1:1"], "L1", interval_s=60)  # nothing answers there: it sees nothing itself
    watch.stop()
    assert not watch.released  # never seen: no claim
    now = int(time.time() * 1000)
    watch.saw_gone(now)
    assert not watch.released  # gone, but no deadline known
    watch.saw_deadline(now + 30_000)
    assert watch.released and watch.deadlines == [now + 30_000]
    watch.saw_deadline(now + 30_000)
    assert watch.deadlines == [now + 30_000]  # the same deadline counts once
    late = LeaseWatch(["127.0.0.1:1"], "L2", interval_s=60)
    late.stop()
    late.saw_deadline(now - 1)
    late.saw_gone(now)
    assert not late.released  # gone after its deadline: expired, not released
