"""Acquires that travel together (AcquireKvSnapshotLeases, client.coalescing) on real coordinators over real
gRPC and a real ZooKeeper: each acquire of a batch is handled and answered as if it came alone."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.proto import coordinator_pb2_grpc as pb_grpc
from kvlease.common.wire import bucket_snapshots_from_pb
from tests.coordinator.test_coordinator_service import client, pair, table  # noqa: F401 (fixtures)

pytestmark = pytest.mark.zk
HOUR_MS = 3_600_000


def _acquire(lease_id: str, snapshots: list[tuple[int, int, int]], duration_ms: int = HOUR_MS):
    return pb.AcquireKvSnapshotLeaseRequest(lease_id=lease_id, duration_ms=duration_ms, snapshots=[
        pb.BucketSnapshotPb(bucket=pb.TableBucketPb(table_id=t, bucket=b), snapshot_id=s) for t, b, s in snapshots])


@pytest.fixture
def admin(pair):  # noqa: F811
    active, _standby = pair
    with AdminClient([active.address], retry_total_s=10) as client:
        yield client


def test_each_acquire_of_a_batch_is_answered_as_if_it_came_alone(pair, table, admin):  # noqa: F811
    active, _standby = pair
    t = table.table_id
    batch = [
        _acquire("fresh", [(t, 0, 1)]),
        _acquire("dup-bucket", [(t, 0, 1), (t, 0, 1)]),
        _acquire("no-table", [(t + 100, 0, 1)]),
        _acquire("bad/id", [(t, 0, 1)]),
        _acquire("gone-snapshot", [(t, 1, 99), (t, 0, 1)]),
        _acquire("twice", [(t, 0, 1)]),
        _acquire("twice", [(t, 1, 1)]),  # the same lease again in the same batch: it updates the lease
        _acquire("too-long", [(t, 0, 1)], duration_ms=HOUR_MS * 2),
    ]
    with grpc.insecure_channel(active.address) as channel:
        response = pb_grpc.CoordinatorServiceStub(channel).AcquireKvSnapshotLeases(
            pb.AcquireKvSnapshotLeasesRequest(requests=batch), timeout=10)
    assert response.error.code == 0
    codes = [r.error.code for r in response.responses]
    E = errors.ErrorCode
    assert codes == [0, E.INVALID_REQUEST, E.TABLE_NOT_EXIST, E.INVALID_LEASE_ID, 0, 0, 0, E.INVALID_LEASE_DURATION]
    fresh, gone, first, second = (response.responses[i] for i in (0, 4, 5, 6))
    assert bucket_snapshots_from_pb(fresh.acquired) == {TableBucket(t, 0): 1}
    assert bucket_snapshots_from_pb(gone.acquired) == {TableBucket(t, 0): 1}
    assert bucket_snapshots_from_pb(gone.unavailable) == {TableBucket(t, 1): 99}
    assert bucket_snapshots_from_pb(first.acquired) == {TableBucket(t, 0): 1}
    assert bucket_snapshots_from_pb(second.acquired) == {TableBucket(t, 1): 1}
    leases = {lease.lease_id: lease for lease in admin.list_leases()}
    assert sorted(leases) == ["fresh", "gone-snapshot", "twice"]
    assert leases["twice"].buckets == {TableBucket(t, 0): 1, TableBucket(t, 1): 1}
    assert leases["fresh"].expiration_time == fresh.expiration_time_ms


def test_the_standby_refuses_a_batch_as_a_whole_naming_the_active(pair, table):  # noqa: F811
    active, standby = pair
    with grpc.insecure_channel(standby.address) as channel:
        response = pb_grpc.CoordinatorServiceStub(channel).AcquireKvSnapshotLeases(
            pb.AcquireKvSnapshotLeasesRequest(requests=[_acquire("a", [(table.table_id, 0, 1)])]), timeout=10)
    assert response.error.code == errors.ErrorCode.NOT_COORDINATOR
    assert response.error.active_address == active.address
    assert list(response.responses) == []


def test_threads_sharing_a_client_acquire_together_and_each_gets_its_own_lease(pair, table):  # noqa: F811
    active, standby = pair
    t = table.table_id
    with AdminClient([standby.address, active.address], retry_total_s=10) as client:
        batches: list[int] = []
        send_many = client._acquire_many

        def counting(requests):
            batches.append(len(requests))
            return send_many(requests)
        client._acquires._send_many = counting
        gate = threading.Barrier(16)

        def worker(i: int) -> list:
            gate.wait()
            results = []
            for n in range(20):
                bucket = (i + n) % 2
                results.append(client.acquire_lease(f"w{i}-{n}", {TableBucket(t, bucket): 1}, HOUR_MS))
            return results

        with ThreadPoolExecutor(16) as pool:
            results = [r for rs in pool.map(worker, range(16)) for r in rs]
        assert batches and max(batches) > 1  # some travelled together
        leases = {lease.lease_id: lease for lease in client.list_leases()}
        assert len(leases) == 320
        for r in results:
            i, n = map(int, r.lease_id[1:].split("-"))
            want = {TableBucket(t, (i + n) % 2): 1}
            assert r.acquired == want and r.unavailable == {}
            assert leases[r.lease_id].buckets == want
            assert leases[r.lease_id].expiration_time == r.expiration_time


def test_a_call_carrying_too_many_acquires_is_refused_whole_and_changes_nothing(pair, table, admin):  # noqa: F811
    from kvlease.coordinator.service import MAX_ACQUIRES_PER_CALL

    active, _standby = pair
    batch = [_acquire(f"many-{i}", [(table.table_id, 0, 1)]) for i in range(MAX_ACQUIRES_PER_CALL + 1)]
    with grpc.insecure_channel(active.address) as channel:
        response = pb_grpc.CoordinatorServiceStub(channel).AcquireKvSnapshotLeases(
            pb.AcquireKvSnapshotLeasesRequest(requests=batch), timeout=10)
    assert response.error.code == errors.ErrorCode.INVALID_REQUEST
    assert f"at most {MAX_ACQUIRES_PER_CALL}" in response.error.message
    assert admin.list_leases() == []
