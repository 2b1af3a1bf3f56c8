"""The table client's idempotent writes (client/idempotent.py), against fake tablet servers: a write
is resent as the same batch of the same writer, and a number that may be taken is never used for
other rows."""

from __future__ import annotations

import grpc
import pytest

from kvlease.common import errors
from tests.client.test_table_client import TABLE, FakeTablet, fake_client


@pytest.mark.unit
def test_a_timed_out_write_is_resent_as_the_same_batch_of_the_same_writer():
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3}, fail=[grpc.StatusCode.DEADLINE_EXCEEDED])
    client, admin, sleeps = fake_client(TABLE, [tablet], {b: "a:1" for b in range(4)})
    client.upsert([{"id": 1}])
    client.upsert([{"id": 1}, {"id": 2}])
    first, resent, *later = tablet.writers
    assert first == resent and first[0] > 0 and first[1] == 0  # the retry is batch 0 again, not a new batch
    assert len(sleeps) == 1 and len(tablet.calls) == 2 + len(later)
    by_bucket = {}
    for (method, bucket), writer in zip(tablet.calls, tablet.writers):
        by_bucket.setdefault(bucket, []).append(writer)
    assert all(w[0] == ws[0][0] for ws in by_bucket.values() for w in ws)  # one writer id per bucket
    assert all([w[1] for w in ws] in ([0, 0, 1], [0, 1], [0]) for ws in by_bucket.values())


@pytest.mark.unit
@pytest.mark.parametrize("failure, next_sequence", [
    (errors.ErrorCode.INVALID_ROW, 0),  # refused before anything was appended: the number stays free
    (errors.ErrorCode.UNKNOWN, 0),  # outcome unknown: a new writer, numbered from 0
])
def test_a_failed_write_never_reuses_a_number_that_may_be_taken(failure, next_sequence):
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3}, fail=[failure])
    client, _admin, _sleeps = fake_client(TABLE, [tablet], {b: "a:1" for b in range(4)})
    with pytest.raises(errors.KvLeaseError):
        client.upsert([{"id": 1}])
    client.upsert([{"id": 1}])
    (failed_id, _), (then_id, then_seq) = tablet.writers
    assert then_seq == next_sequence
    assert (then_id == failed_id) == (failure == errors.ErrorCode.INVALID_ROW)


@pytest.mark.unit
def test_out_of_order_sends_the_batch_again_under_a_new_writer():
    tablet = FakeTablet("a:1", TABLE, {0, 1, 2, 3}, fail=[errors.ErrorCode.OUT_OF_ORDER_SEQUENCE])
    client, _admin, _sleeps = fake_client(TABLE, [tablet], {b: "a:1" for b in range(4)})
    client.upsert([{"id": 1}])
    (old_id, _), (new_id, seq) = tablet.writers
    assert new_id != old_id and seq == 0 and len(tablet.rows[next(iter(tablet.rows))]) == 1
