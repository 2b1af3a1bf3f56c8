"""A replicated bucket whose files are parked (closed under ``tablet.buckets.max-open``) stays parked through
fetch rounds with nothing new, on its follower and on its leader, and opens again when records arrive.

Two real tablet servers on the test's ZooKeeper and gRPC on loopback, pushed their roles by hand as in
``tests/tablet/test_partition_buckets.py`` (whose fixtures these are): the follower's fetch thread asks the
leader for bucket 0 of a partition every ``replica.fetch.wait-max`` (100 ms), sending its log end and last
epoch; the leader answers with its offsets and the end of that epoch (``tablet/replication/fetcher.py``,
``tablet/replication/fetch_service.py``). Parked, both answer from memory (``tablet/bucket/replication.py``).
"""

from __future__ import annotations

from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import TableInfo
from kvlease.common.wire import table_to_pb
from kvlease.ops.wait import wait_until
from tests.tablet.test_partition_buckets import EVENTS, by_bucket, put, rows, tablets, zk  # noqa: F401

REPLICATED = TableInfo(**{**EVENTS.__dict__, "replication_factor": 2}).of_partition(4, "20261127")


def test_a_parked_follower_is_not_reopened_by_idle_fetches_and_catches_up_on_new_records(tablets):
    leader, follower = tablets(1), tablets(2)
    role = pb.BucketLeadershipPb(table=table_to_pb(REPLICATED), bucket=0, leader_epoch=1, leader=1,
                                 leader_address=leader.server.address, replicas=[1, 2], isr=[1, 2], bucket_epoch=1)
    for t in (leader, follower):
        assert not t.push(role).error.code
    wait_until(leader.server.lease.valid, 10, "the leader lease")
    part = by_bucket(REPLICATED, rows(REPLICATED, range(40), "r"))[0]
    first = put(leader, REPLICATED, 0, part[:5])
    assert not first.error.code, first.error
    led, followed = leader.server.replicas.replica(4, 0), follower.server.replicas.replica(4, 0)
    wait_until(lambda: followed.store.high_watermark == first.next_offset, 10, "the follower to apply the write")

    wait_until(lambda: followed.store.files.park() and led.store.files.park(), 10, "both replicas parked")
    opens = leader.server.replicas.budget.opens, follower.server.replicas.budget.opens
    seen: set[int] = set()  # the follower's fetches the leader took, by their time (ms)
    wait_until(lambda: seen.add(led.lead.view.follower(2).last_fetch_ms) or len(seen) > 4, 10, "idle fetch rounds")
    assert not followed.store.is_open and not led.store.is_open
    assert (leader.server.replicas.budget.opens, follower.server.replicas.budget.opens) == opens
    assert (followed.store.log_end_offset, followed.store.last_epoch) == (first.next_offset, 1)
    assert not followed.store.is_open  # asked by the test too: still answered from memory

    second = put(leader, REPLICATED, 0, part[5:])  # acknowledged once the follower has appended it
    assert not second.error.code, second.error
    wait_until(lambda: followed.store.high_watermark == second.next_offset, 10, "the follower to apply the rest")
    assert followed.store.is_open and follower.server.replicas.budget.opens > opens[1]
    assert followed.store.fetch_log(0, 1 << 30)[0] == led.store.fetch_log(0, 1 << 30)[0]  # byte for byte
    assert followed.store.last_epoch == led.store.last_epoch == 1
    assert followed.store.applied_offset == second.next_offset == len(part)  # a record a row
