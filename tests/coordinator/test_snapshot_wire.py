"""The fast wire forms of snapshot listings and acquires (coordinator/snapshot_wire.py, client/lease_wire.py)
mean exactly what the plain protobuf builders of common/wire.py build, for every shape of row."""

from __future__ import annotations

import pytest

from kvlease.client import lease_wire
from kvlease.client.admin_types import SnapshotInfo
from kvlease.common import wire
from kvlease.common.model import SnapshotFile, SnapshotHandle, TableBucket
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.coordinator.snapshot_wire import AcquireAnswers, SnapshotRowEncoder, varint
from kvlease.leases.events import AcquireOutcome

pytestmark = pytest.mark.unit

FILES = (SnapshotFile("kv/7/p9/0/shared/a.sst", 1234), SnapshotFile("kv/7/p9/0/snap-3/MANIFEST", 0))
ROWS = [
    (SnapshotHandle(TableBucket(7, 0), 1, 0, "kv/7/0/snap-1/_METADATA"), (), True),  # zeros: unset on the wire
    (SnapshotHandle(TableBucket(7, 1), 2**40, 2**33, "m", FILES, 1_764_000_000_000), ("a", "lease-b"), False),
    (SnapshotHandle(TableBucket(7, 3, 0), 3, 10, "kv/7/p0/3/_METADATA", (), 5), ("zé",), True),  # partition id 0
    (SnapshotHandle(TableBucket(7, 200, 12_345_678), 4, 300, "x" * 300, FILES * 40, 1), ("b", "a"), True),
]


def plain(table_id: int, rows) -> pb.GetLatestKvSnapshotsResponse:
    return pb.GetLatestKvSnapshotsResponse(table_id=table_id,
                                           snapshots=[wire.handle_to_pb(h, leased, kept) for h, leased, kept in rows])


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1, -1, -(2**63)])
def test_varint_is_protobufs(value):
    assert pb.BucketSnapshotPb.FromString(b"\x10" + varint(value)).snapshot_id == value


@pytest.mark.parametrize("table_id", [0, 7, 2**35])
def test_a_listing_is_the_response_common_wire_builds(table_id):
    encoder = SnapshotRowEncoder()
    for _ in range(2):  # the second time from the kept bytes
        assert encoder.response(pb.GetLatestKvSnapshotsResponse, table_id, ROWS) == plain(table_id, ROWS)
    assert encoder.response(pb.ListKvSnapshotsResponse, table_id, []) == pb.ListKvSnapshotsResponse(table_id=table_id)


def test_a_handle_is_encoded_again_when_another_handle_of_its_bucket_and_id_is_stored():
    encoder = SnapshotRowEncoder()
    first = SnapshotHandle(TableBucket(7, 0), 1, 0, "old")
    encoder.response(pb.GetLatestKvSnapshotsResponse, 7, [(first, (), True)])
    second = SnapshotHandle(TableBucket(7, 0), 1, 5, "new")  # after a failover: another object, maybe other fields
    got = encoder.response(pb.GetLatestKvSnapshotsResponse, 7, [(second, (), True)])
    assert got == plain(7, [(second, (), True)])


def test_the_encoder_keeps_at_most_its_bound():
    encoder = SnapshotRowEncoder(max_cached=2)
    rows = [(SnapshotHandle(TableBucket(7, b), 1, 0, "m"), (), True) for b in range(5)]
    assert encoder.response(pb.GetLatestKvSnapshotsResponse, 7, rows) == plain(7, rows)
    assert len(encoder._cache) <= 2


def test_the_client_reads_a_listing_as_common_wire_does():
    response = pb.GetLatestKvSnapshotsResponse.FromString(plain(7, ROWS).SerializeToString())
    expected = {info.bucket: info for info in (SnapshotInfo(wire.handle_from_pb(s), tuple(s.leased_by), s.retained)
                                               for s in response.snapshots)}
    got = lease_wire.snapshot_infos(response.snapshots)
    assert got == expected and list(got) == list(expected)
    assert got[TableBucket(7, 3, 0)].bucket.partition_id == 0  # set to 0, not unset


SNAPSHOTS = {TableBucket(7, 2, 9): 3, TableBucket(7, 0): 0, TableBucket(8, 1, 0): 2**40, TableBucket(7, 1, 9): 1}


def test_an_acquire_request_is_the_one_common_wire_builds():
    got = lease_wire.acquire_request("lease-1", SNAPSHOTS, 60_000, "me")
    assert got == pb.AcquireKvSnapshotLeaseRequest(lease_id="lease-1", snapshots=wire.bucket_snapshots_to_pb(SNAPSHOTS),
                                                   duration_ms=60_000, owner="me")
    slow = {wire.bucket_from_pb(b.bucket): b.snapshot_id for b in got.snapshots}  # field by field
    assert wire.bucket_snapshots_from_pb(got.snapshots) == slow == SNAPSHOTS
    with pytest.raises(TypeError):
        lease_wire.acquire_request("lease-1", {TableBucket(7, 0): "1"}, 60_000, "")


def test_an_acquire_answer_with_everything_acquired_is_its_request_s_snapshots():
    request = lease_wire.acquire_request("lease-1", SNAPSHOTS, 60_000, "")
    response = AcquireAnswers().response(request, AcquireOutcome(99, dict(SNAPSHOTS), {}))
    assert response.expiration_time_ms == 99 and not response.unavailable
    assert wire.bucket_snapshots_from_pb(response.acquired) == SNAPSHOTS
    assert lease_wire.acquired(response, SNAPSHOTS) == SNAPSHOTS


def test_an_acquire_answer_with_some_unavailable_names_each_side():
    request = lease_wire.acquire_request("lease-1", SNAPSHOTS, 60_000, "")
    missing = {TableBucket(7, 0): 0}
    held = {tb: sid for tb, sid in SNAPSHOTS.items() if tb not in missing}
    response = AcquireAnswers().response(request, AcquireOutcome(99, held, missing))
    assert response == pb.AcquireKvSnapshotLeaseResponse(expiration_time_ms=99,
                                                         acquired=wire.bucket_snapshots_to_pb(held),
                                                         unavailable=wire.bucket_snapshots_to_pb(missing))
    assert lease_wire.acquired(response, SNAPSHOTS) == held
    assert wire.bucket_snapshots_from_pb(response.unavailable) == missing


def test_a_latest_acquire_answer_from_kept_entries_means_what_the_plain_builder_builds():
    """``lease acquire --latest`` names no snapshot: its answer is built from each (bucket, snapshot)'s kept entry,
    in sort_key order; a bucket's newer snapshot gets its own entry, and a full cache starts again."""
    answers = AcquireAnswers(max_cached=6)
    latest = pb.AcquireKvSnapshotLeaseRequest(lease_id="l", latest=pb.LatestSnapshotsPb(table_id=7))
    held = {TableBucket(7, 2, 300): 2**40, TableBucket(7, 0): 0, TableBucket(7, 1, 0): 5, TableBucket(7, 0, 300): 1,
            TableBucket(7, 127, 2**33): 128}
    missing = {TableBucket(7, 3, 300): 4}

    def plain_answer(acquired, unavailable):
        return pb.AcquireKvSnapshotLeaseResponse(expiration_time_ms=99, acquired=wire.bucket_snapshots_to_pb(acquired),
                                                 unavailable=wire.bucket_snapshots_to_pb(unavailable))

    first = answers.response(latest, AcquireOutcome(99, held, missing))
    assert first == plain_answer(held, missing)
    assert answers.response(latest, AcquireOutcome(99, dict(reversed(held.items())), {})) == plain_answer(held, {})
    newer = {**held, TableBucket(7, 0): 9}  # a newer snapshot of one bucket; 6 entries: the cache is full, starts again
    assert answers.response(latest, AcquireOutcome(99, newer, {})) == plain_answer(newer, {})
    assert answers.response(latest, AcquireOutcome(99, held, {})) == plain_answer(held, {})
