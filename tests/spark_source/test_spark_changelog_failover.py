"""A split's changelog read across a failover (spark_source/changelog.py), on a fake table client: a new
leader may serve up to a high watermark a little behind the one the split was planned by, for a moment."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from kvlease.client.transport import RetryPolicy
from kvlease.common.logentry import ChangeType, decode_entry, encode_payload, frame_header, record_batch
from kvlease.spark_source.changelog import ChangelogRangeError, read_entries


def entry(offset: int) -> object:
    payload = encode_payload(record_batch([ChangeType.INSERT], [b"k%d" % offset], [b"v"]))
    return decode_entry(frame_header(offset, 1, payload, 1) + payload.to_pybytes())


class Leader:
    """Serves entries 0..``end - 1``; the first ``behind`` fetches at the end answer nothing (the new leader's
    high watermark not caught up yet)."""

    def __init__(self, end: int, behind: int, total_s: float = 5.0) -> None:
        self.end, self.behind, self.fetches = end, behind, 0
        self.table = SimpleNamespace(path="db.t")
        self.retry = RetryPolicy(total_s, 0.01, time.sleep)

    def fetch_log_entries(self, bucket, offset, max_bytes, last_fetched_epoch=None):
        self.fetches += 1
        if offset >= 2 and self.behind:
            self.behind -= 1
            return [], 2
        return [entry(offset)], self.end  # one entry per fetch


@pytest.mark.unit
def test_a_range_the_new_leader_does_not_serve_yet_is_waited_for():
    leader = Leader(end=4, behind=3)
    assert [e.base_offset for e in read_entries(leader, 0, 0, 4)] == [0, 1, 2, 3]  # nothing missing


@pytest.mark.unit
def test_a_range_never_reached_is_still_an_error_once_the_retries_run_out():
    leader = Leader(end=4, behind=1000, total_s=0.2)
    with pytest.raises(ChangelogRangeError, match="the changelog ends at 2, the split needs records up to 3"):
        list(read_entries(leader, 0, 0, 4))
    assert leader.fetches > 2
