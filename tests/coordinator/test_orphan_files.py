"""The coordinator's orphan reclaim (coordinator/orphan_files.py) on a real coordinator (real ZooKeeper, gRPC on
loopback, file:// remote storage whose files are aged with ``os.utime``): orphans older than
``kv.snapshot.orphan-grace`` go, and a dropped table's leftovers; files a stored snapshot names (retained or
leased), young files and directories that are no table of this cluster stay; a commit naming a file the reclaim
deleted is refused; a restarted coordinator's run deletes nothing more. And a coordinator that steps down during
a run sends no more deletes (the reclaim alone, with a real store, catalog and file:// storage)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from kvlease.client.admin import AdminClient
from kvlease.common import errors
from kvlease.common.model import SnapshotFile, TableBucket
from kvlease.common.tables import Column
from kvlease.common.storage import FileStorage
from kvlease.coordinator import requests as rq
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.orphan_files import OrphanFiles
from kvlease.coordinator.server import CoordinatorServer
from kvlease.coordinator.snapshots import SnapshotStore
from kvlease.ops.wait import wait_until
from tests.support.snapshot_manifests import snapshot, storage_of

#: runs only when a test asks for one (a_full_run): a run of its own timer overlapping the test's setup deleted the
#: orphans of a setup half done, and the run the test then asked for found nothing left (seen in a suite run)
SETTINGS = {"kv.snapshot.lease.expiration-check-interval": "50ms", "kv.snapshot.orphan-check-interval": "1h",
            "kv.snapshot.orphan-grace": "1h", "kv.snapshot.num-retained": 1}
HOURS_AGO = 2 * 3600


def age(storage, paths, seconds: float = HOURS_AGO) -> None:
    when = time.time() - seconds
    for path in paths:
        os.utime(os.path.join(storage.root, path), (when, when))


def a_full_run(server: CoordinatorServer) -> dict:
    """The figures of a reclaim run started now (at the loop's next tick; none runs by its own timer here)."""
    orphans = server.serving_loop().controller.orphans
    done = orphans.runs_done
    orphans.next_run_ms = 0
    wait_until(lambda: orphans.runs_done > done, 15, "a whole orphan reclaim run")
    return orphans.last_run


def deleted(server: CoordinatorServer, reason: str) -> float:
    return server.metrics.registry.get_sample_value("kvlease_coordinator_orphan_files_deleted_total",
                                                    {"reason": reason}) or 0.0


@pytest.fixture
def coordinator(make_config):
    servers = []

    def start() -> CoordinatorServer:
        server = CoordinatorServer(make_config(SETTINGS)).start()
        servers.append(server)
        assert server.wait_active(15)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.mark.zk
def test_orphans_older_than_the_grace_go_and_nothing_else_even_across_a_restart(coordinator, make_config):
    server = coordinator()
    storage = storage_of(make_config())
    columns = [Column("id", "BIGINT"), Column("v", "STRING")]
    with AdminClient([server.address], retry_total_s=10) as admin:
        table = admin.create_table("db.t", columns, ["id"], 2)
        dropped = admin.create_table("db.gone", columns, ["id"], 1)
        admin.drop_table("db.gone")
        t, d = table.table_id, dropped.table_id
        tb0, tb1 = TableBucket(t, 0), TableBucket(t, 1)
        shared = f"kv/{t}/0/shared"
        leased = snapshot(storage, tb0, 1, 10, [SnapshotFile(f"{shared}/1-10-0a0b0c0d-s1-e0-00000001.sst", 10),
                                                SnapshotFile(f"kv/{t}/0/snap-1/e0-00000001/CURRENT", 16)])
        admin.commit_kv_snapshot(leased)
        admin.acquire_lease("reader", {tb0: 1}, 3_600_000)
        latest = snapshot(storage, tb0, 2, 20, [SnapshotFile(f"{shared}/1-10-0a0b0c0d-s1-e0-00000001.sst", 10),
                                                SnapshotFile(f"{shared}/2-20-0a0b0c0d-s2-e0-00000002.sst", 20),
                                                SnapshotFile(f"kv/{t}/0/snap-2/e0-00000002/CURRENT", 16)])
        admin.commit_kv_snapshot(latest)  # snapshot 1 is past num-retained 1: its lease keeps it
        other = snapshot(storage, tb1, 1, 5, [SnapshotFile(f"kv/{t}/1/snap-1/e0-00000003/CURRENT", 16)])
        admin.commit_kv_snapshot(other)
        assert sorted(s.handle.snapshot_id for s in admin.list_kv_snapshots(t) if s.bucket == tb0) == [1, 2]
        stored = leased.file_paths() | latest.file_paths() | other.file_paths()

        orphans = {  # a deposed leader's upload, an SST a restarted server lost track of, a dropped table's
            f"{shared}/3-30-0a0b0c0d-s3-e1-0000000a.sst": b"z" * 30, f"kv/{t}/0/snap-3/_METADATA": b"{}",
            f"kv/{t}/0/snap-3/e1-0000000a/CURRENT": b"c", f"kv/{t}/1/shared/9-9-0a0b0c0d-s1-e0-0000000b.sst": b"s",
            f"kv/{d}/0/shared/1-1-0a0b0c0d-s1-e0-0000000c.sst": b"d", f"kv/{d}/0/snap-1/_METADATA": b"{}"}
        young = {f"{shared}/4-40-0a0b0c0d-s4-e2-0000000d.sst": b"y",  # an upload under way
                 f"kv/{d}/0/shared/5-5-0a0b0c0d-s5-e0-0000000e.sst": b"y"}  # a zombie writing into a dropped table
        foreign = {f"kv/{d + 100}/0/snap-1/_METADATA": b"{}", "kv/notes/readme.txt": b"n"}  # no table of ours
        for path, data in {**orphans, **young, **foreign}.items():
            storage.put(path, data)
        age(storage, [*stored, *orphans, *foreign])  # even old, a stored snapshot's files stay
        everything = set(storage.list("kv"))

        figures = a_full_run(server)
        assert set(storage.list("kv")) == everything - set(orphans)
        assert (deleted(server, "orphan"), deleted(server, "dropped_table")) == (4, 2)
        assert figures["deleted"] == 6 and figures["deleted_bytes"] == sum(map(len, orphans.values()))
        assert figures["young"] == 2 and d in figures["dropped_tables"]

        # a commit whose file checks (off the loop) passed before the reclaim deleted one of its files: refused on
        # the loop (sent after the delete, its file check refuses it: tests/tablet/store/test_snapshot_files.py)
        late = snapshot(storage, tb0, 3, 30, [SnapshotFile(f"{shared}/3-30-0a0b0c0d-s3-e1-0000000a.sst", 30)])
        with pytest.raises(errors.InvalidSnapshotError, match=r"s3-e1-0000000a\.sst on remote storage was deleted "
                                                              "as an orphan"):
            server.serving_loop().submit(rq.CommitSnapshot(late, None, None)).result(timeout=10)
        storage.delete_many(sorted(late.file_paths()))  # what the helper wrote for it
        assert set(storage.list("kv")) == everything - set(orphans)

    server.stop()  # a new active coordinator, nothing but ZooKeeper and the files to go by
    restarted = coordinator()
    figures = a_full_run(restarted)
    assert figures["deleted"] == 0 and figures["young"] == 2
    assert set(storage.list("kv")) == everything - set(orphans)
    assert deleted(restarted, "orphan") == deleted(restarted, "dropped_table") == 0


class HeldListing(FileStorage):
    """Its table listings wait until the test lets them go."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri, fsync=False)
        self.listing = threading.Event()
        self.go = threading.Event()

    def list_stats(self, prefix):
        self.listing.set()
        assert self.go.wait(10)
        return super().list_stats(prefix)


@pytest.mark.unit
def test_a_coordinator_that_steps_down_during_a_run_deletes_nothing_more(tmp_path):
    storage = HeldListing(f"file://{tmp_path}/remote")
    storage.put("kv/1/0/shared/orphan.sst", b"o")
    age(storage, ["kv/1/0/shared/orphan.sst"])
    catalog = TableCatalog()
    catalog.last_id = 1  # table 1 was dropped
    now = [int(time.time() * 1000)]
    orphans = OrphanFiles(storage, grace_ms=3_600_000, interval_ms=1000, clock_ms=lambda: now[0],
                          catalog=lambda: catalog, snapshots=lambda: SnapshotStore(1), is_protected=lambda tb, sid: False)
    now[0] += 100  # a tenth of an interval: the first run is due
    orphans.tick()
    assert orphans.runs_started == 1 and storage.listing.wait(10)
    orphans.close()  # stepped down while the listing was under way
    storage.go.set()
    orphans._lister.shutdown(wait=True)
    orphans.tick()  # the loop is gone in real life; a late tick judges nothing either
    orphans._deleter.shutdown(wait=True)
    assert storage.list("kv") == ["kv/1/0/shared/orphan.sst"] and orphans.runs_done == 0
