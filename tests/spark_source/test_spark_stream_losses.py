"""The Spark stream's guard against reused offsets, without Spark: its offsets record per bucket the loss
records seen (older offsets without them count 0), and a position past an unseen loss fails with DATA_LOST.
(The stream itself on a real cluster: the Spark workers import /work/main's package; see
tests/tablet/replication/test_data_loss_cluster.py for the same check against a real cluster.)"""

from __future__ import annotations

import pytest

from client.lost_ranges import check_losses
from common import errors
from common.data_loss import RESTORE, DataLoss
from spark_source.stream import _losses_seen, _offset, _parse


def test_offsets_carry_the_losses_seen_and_old_offsets_count_none():
    doc = _offset(None, {0: (-1, 15), 1: (-1, 3)}, 7, {0: 2, 1: 0})
    assert doc["buckets"]["0"] == {"snapshot": -1, "offset": 15, "losses": 2}
    assert "losses" not in doc["buckets"]["1"]
    assert _losses_seen(doc) == {0: 2, 1: 0}
    assert _parse(doc)[2] == {0: (-1, 15), 1: (-1, 3)}
    assert _losses_seen({"buckets": {"0": {"snapshot": -1, "offset": 5}}}) == {0: 0}


def test_a_query_past_an_unseen_loss_fails_naming_the_range_and_one_before_it_adopts_it():
    loss = DataLoss(RESTORE, 3, 1200, 1535, 4, 0, 1)
    with pytest.raises(errors.DataLostError, match=r"bucket 0 of db\.t: offsets 1200\.\.1533 this query read were "
                                                   r"lost when the bucket was restored from snapshot 4 at .*new "
                                                   r"checkpoint") as raised:
        check_losses("db.t", {0: (loss,)}, {0: 1534}, {})
    assert raised.value.code == 35 and raised.value.details["from_offset"] == 1200
    assert check_losses("db.t", {0: (loss,)}, {0: 1200}, {}) == {0: 1}  # nothing it read was reused
    assert check_losses("db.t", {0: (loss,)}, {0: -1}, {}) == {0: 1}  # not started: adopts it
    assert check_losses("db.t", {0: (loss,)}, {0: 9999}, {0: 1}) == {0: 1}  # seen before
