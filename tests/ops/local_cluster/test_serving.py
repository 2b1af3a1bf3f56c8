"""Which unserved buckets a start or a restart does not wait for (ops/local_cluster/serving.py ``waits_for``),
from the coordinator's assignment: its data was lost, or its last in-sync replicas are down (the real restart:
tests/ops/cli/test_cli_cluster_restart.py)."""

from __future__ import annotations

import pytest

from kvlease.client.admin_types import BucketLeader
from kvlease.ops.local_cluster.serving import waits_for

pytestmark = pytest.mark.unit


def bucket(leader: int, replicas: tuple[int, ...], isr: tuple[int, ...], offline_reason: str = "") -> BucketLeader:
    return BucketLeader(0, leader, "", 3, replicas, isr, offline_reason=offline_reason)


def test_a_bucket_waits_for_a_restore_or_for_its_last_in_sync_replicas():
    live = {1}
    assert waits_for("db.t", 0, bucket(-1, (1,), (), "data lost on tablet server 1"), live) == \
        "its data was lost: `kvlease bucket restore db.t --bucket 0 --accept-data-loss`"
    assert waits_for("db.t", 0, bucket(-1, (1,), (), "data lost on tablet server 1"), live, "20261127") == \
        "its data was lost: `kvlease bucket restore db.t --partition 20261127 --bucket 0 --accept-data-loss`"
    # one replica: the coordinator keeps its leader's id while its server is down
    assert waits_for("db.t", 0, bucket(2, (2,), (2,)), live) == "its last in-sync replica, tablet 2, is down"
    assert waits_for("db.t", 0, bucket(-1, (1, 2, 3), (2, 3)), live) == \
        "its last in-sync replicas, tablets 2, 3, are down"


def test_a_bucket_a_live_server_is_to_serve_does_not_wait():
    live = {1, 2}
    assert waits_for("db.t", 0, bucket(1, (1,), (1,)), live) is None  # its leader is live: not served yet
    assert waits_for("db.t", 0, bucket(3, (3, 2), (3, 2)), live) is None  # 2 is in sync: it is to lead
    assert waits_for("db.t", 0, None, live) is None  # not in the assignment (yet)
