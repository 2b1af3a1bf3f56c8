"""A deposed coordinator cannot write (epoch fencing), in-process and as real processes.

In-process: a coordinator keeps believing it is active while another ZooKeeper
client bumps ``/coordinators/epoch`` the way a new coordinator does; every kind
of write it then attempts fails, changes nothing in ZooKeeper or on remote
storage, and makes it step down, and it keeps running (it leads again once
the intruder goes away).

Processes: the active coordinator is frozen (SIGSTOP) past its ZooKeeper
session, the standby takes over, and the frozen one is resumed with writes
already queued for it: none of them lands.
"""

from __future__ import annotations

import threading
import time

import pytest

from kvlease.common import errors, zkpaths
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column
from kvlease.common.zk import make_client
from kvlease.client.admin import AdminClient
from kvlease.coordinator.fencing import bump_epoch
from kvlease.coordinator.server import CoordinatorServer
from kvlease.common.model import TableBucket
from kvlease.leases.store import LEASE_FILES
from kvlease.ops.wait import wait_until
from tests.support.snapshot_manifests import commit_snapshot, snapshot
from tests.support.procs import (  # noqa: F401 - coordinator_procs is a fixture
    assert_served_as_persisted, coordinator_procs, lease_view, zk_tree)

pytestmark = pytest.mark.zk

def make_table(client: AdminClient, buckets: int = 2, snapshots: int = 1):
    table = client.create_table("db.t", [Column("id", "BIGINT")], ["id"], buckets)
    for bucket in range(buckets):
        for sid in range(1, snapshots + 1):
            commit_snapshot(client, TableBucket(table.table_id, bucket), sid, 10 * sid)
    return table


class Intruder:
    """Another ZooKeeper client acting as a newly elected coordinator: it queues in the
    election (so it leads once the deposed one lets go) and bumps the epoch."""

    def __init__(self, zk) -> None:
        self.zk = zk
        self.leading = threading.Event()
        self._release = threading.Event()
        self._election = zk.Election(zkpaths.ELECTION, "intruder")
        self._thread = threading.Thread(target=self._election.run, args=(self._lead,), daemon=True)

    def _lead(self) -> None:
        self.leading.set()
        self._release.wait()

    def take_over(self) -> int:
        self._thread.start()
        wait_until(lambda: len(self.zk.get_children(zkpaths.ELECTION)) >= 2, 10, "intruder queued in the election")
        epoch, _version = bump_epoch(self.zk)
        return epoch

    def leave(self) -> None:
        self._release.set()
        self._election.cancel()
        self._thread.join(timeout=10)


@pytest.fixture
def server(make_config):
    config = make_config({"kv.snapshot.lease.expiration-check-interval": "100ms"})
    coordinator = CoordinatorServer(config).start()
    try:
        assert coordinator.wait_active(30), "the coordinator did not become active"
        yield coordinator
    finally:
        coordinator.stop()


WRITES = ["acquire-new", "acquire-update", "renew", "release", "drop", "commit-snapshot", "create-table",
          "drop-table", "expire"]


@pytest.mark.parametrize("write", WRITES)
def test_deposed_coordinator_cannot_write(server, zk_client, zk_config, write):
    storage = open_storage(zk_config["remote.data.dir"], zk_config)
    # set-up and final checks retry (a first connection to a fresh server on a loaded machine may fail once:
    # UNAVAILABLE, "tcp handshaker shutdown"); the writes sent to the deposed coordinator are not retried
    client = AdminClient([server.address], request_timeout_s=10, retry_total_s=30)
    direct = AdminClient([server.address], request_timeout_s=10, retry_total_s=0)
    try:
        table = make_table(client)
        tb0, tb1 = TableBucket(table.table_id, 0), TableBucket(table.table_id, 1)
        held = client.acquire_lease("held", {tb0: 1, tb1: 1}, 60_000)
        short = client.acquire_lease("short", {tb0: 1}, 1_500 if write == "expire" else 60_000)
        before_view = client.list_leases()
        old_epoch = server.epoch
        new_snapshot = snapshot(storage, tb0, 7, 70)  # its manifest is written before the bump

        intruder = Intruder(zk_client)
        try:
            new_epoch = intruder.take_over()
            assert new_epoch > old_epoch
            tree = zk_tree(zk_client)
            files = storage.list(LEASE_FILES)
            all_files = storage.list("")
            assert server.is_active, "nothing told the coordinator yet: it still believes it is active"

            _attempt_write(direct, write, tb0, tb1, new_snapshot, short)
            wait_until(lambda: not server.is_active, 10, "the deposed coordinator steps down")
            assert intruder.leading.wait(10), "the intruder leads once the deposed coordinator let go"
            # nothing of the attempt landed: ZooKeeper, lease files and every other file are as before
            assert zk_tree(zk_client) == tree
            assert storage.list(LEASE_FILES) == files
            assert storage.list("") == all_files
            # the deposed coordinator still runs and answers, as a standby
            info = direct.coordinator_info(server.address)
            assert not info.active
            with pytest.raises(errors.NotCoordinatorError):
                direct.describe_lease("held")
        finally:
            intruder.leave()

        # ... and it leads again once the intruder is gone, in a newer epoch, with nothing changed
        assert server.wait_active(30), "the coordinator did not lead again"
        assert server.epoch > new_epoch
        _assert_nothing_changed(client, write, before_view, held, table)
    finally:
        client.close()
        direct.close()


def _attempt_write(client, write, tb0, tb1, new_snapshot, short) -> None:
    """``write`` sent to the deposed coordinator is refused; for "expire", wait for its expiry timer."""
    attempts = {
        "acquire-new": lambda: client.acquire_lease("fresh", {tb0: 1}, 60_000),
        "acquire-update": lambda: client.acquire_lease("held", {tb0: 1}, 120_000),
        "renew": lambda: client.renew_lease("held", 120_000),
        "release": lambda: client.release_lease("held", [tb1]),
        "drop": lambda: client.drop_lease("held"),
        "commit-snapshot": lambda: client.commit_kv_snapshot(new_snapshot),
        "create-table": lambda: client.create_table("db.other", [Column("id", "BIGINT")], ["id"], 1),
        "drop-table": lambda: client.drop_table("db.t"),
    }
    if write == "expire":  # no request: the expiry timer itself tries to delete "short"
        assert time.time() * 1000 < short.expiration_time, "set-up too slow: 'short' expired before the bump"
        time.sleep(max(0.0, short.expiration_time / 1000 - time.time()) + 0.5)  # past its deadline and a timer run
    else:
        with pytest.raises((errors.NotCoordinatorError, errors.CoordinatorFencedError)):
            attempts[write]()


def _assert_nothing_changed(client, write, before_view, held, table) -> None:
    """The leases, tables and snapshots served are those from before the attempt."""
    tb0, tb1 = TableBucket(table.table_id, 0), TableBucket(table.table_id, 1)
    after = {lease.lease_id: lease_view(lease) for lease in client.list_leases()}
    expected = {lease.lease_id: lease_view(lease) for lease in before_view}
    if write == "expire":  # "short" expired while nobody could write: it gets the failover grace
        assert after.keys() == expected.keys()
        assert after["short"][0] > expected["short"][0]
        after.pop("short"), expected.pop("short")
    assert after == expected
    assert after["held"] == (held.expiration_time, {tb0: 1, tb1: 1})
    assert {t.path for t in client.list_tables()} == {"db.t"}
    assert {(s.bucket.bucket, s.snapshot_id) for s in client.list_kv_snapshots(table.table_id)} == {(0, 1), (1, 1)}


@pytest.mark.slow
def test_frozen_coordinator_resumes_without_writing(make_config, coordinator_procs):
    config = make_config({"zookeeper.session-timeout": "2s",
                          "kv.snapshot.lease.expiration-check-interval": "200ms",
                          "kv.snapshot.lease.failover-grace": "30s"})
    procs = coordinator_procs(config)
    procs.spawn(2)
    frozen, info = procs.wait_active(30)
    other = next(p for p in procs.procs if p is not frozen)
    client = procs.client(request_timeout_s=10, retry_total_s=30)
    direct = procs.client([frozen.address], request_timeout_s=20, retry_total_s=0)
    storage = open_storage(config["remote.data.dir"], config)
    zk = make_client(config)
    try:
        table = make_table(client, snapshots=2)
        tb0, tb1 = TableBucket(table.table_id, 0), TableBucket(table.table_id, 1)
        kept = client.acquire_lease("kept", {tb0: 1, tb1: 2}, 60_000)
        client.acquire_lease("short", {tb0: 2}, 1_000)  # expires while the frozen one sleeps
        assert direct.coordinator_info(frozen.address).active  # the direct channel is connected

        zombie_snapshot = snapshot(storage, tb1, 9, 90)
        frozen.pause()
        try:
            # writes queued on the frozen coordinator's socket: it handles them when it wakes up
            zombies, outcomes = _send_zombie_writes(direct, tb1, zombie_snapshot)
            active, new_info = procs.wait_active(20, among=[other], min_epoch=info.epoch + 1)
            assert active is other
            # the new active coordinator serves; "short" expired in the gap and got the grace
            # (asked directly: a client still pointed at the frozen one would wait for its timeout)
            client = procs.client([other.address], request_timeout_s=10, retry_total_s=30)
            now_ms = time.time() * 1000
            short = client.describe_lease("short")
            assert short.expiration_time > now_ms + 20_000
            assert client.describe_lease("kept").expiration_time == kept.expiration_time
            tree = zk_tree(zk)
            files = storage.list("")
        finally:
            frozen.resume()

        for thread in zombies:
            thread.join(timeout=30)
        assert set(outcomes) == {"acquire", "renew", "drop", "commit"}
        acknowledged = {name: result for name, result in outcomes.items() if not isinstance(result, Exception)}
        assert not acknowledged, f"the deposed coordinator acknowledged writes: {acknowledged}"
        _assert_stays_standby(procs, frozen, direct, info, new_info)

        # it never wrote after resuming: ZooKeeper and remote storage are as before
        assert zk_tree(zk) == tree
        _assert_as_before_but_orphan_lease_files(storage, files, tree)
        _assert_served_as_before(procs, client, zk, storage, kept, table, other, new_info)
        # clients given both addresses (the deposed one first) still work
        both = procs.client([frozen.address, other.address], request_timeout_s=10, retry_total_s=30)
        assert both.acquire_lease("after", {tb1: 2}, 60_000).acquired == {tb1: 2}
        assert both.renew_lease("kept", 120_000) > kept.expiration_time
        assert both.describe_lease("after").buckets == {tb1: 2}
        assert both.address == other.address
    finally:
        zk.stop()
        zk.close()


def _assert_as_before_but_orphan_lease_files(storage, files: list[str], tree: dict) -> None:
    """Remote storage holds ``files`` and maybe lease files nothing in ZooKeeper (``tree``) points at: one a
    zombie write prepared before its ZooKeeper write failed with an unknown outcome (the connection of its
    expired session lost) stays; the next active coordinator's election reclaims it."""
    now = storage.list("")
    assert set(files) <= set(now), sorted(set(files) - set(now))
    for path in sorted(set(now) - set(files)):
        assert path.startswith("lease/") and path.endswith(".metadata"), path
        name = path.rsplit("/", 1)[1].encode()
        assert not any(name in data for data, _mzxid in tree.values()), f"ZooKeeper points at {path}"


def _assert_stays_standby(procs, frozen, direct, info, new_info) -> None:
    """It steps down (or already had) and stays a standby; its expiry timer, which saw "short"
    expire, could not delete it either."""
    wait_until(lambda: (procs.info(frozen) or info).active is False, 15, "the resumed coordinator is a standby")
    time.sleep(1.0)  # a negative check: a crash or a return to active would show by now
    assert frozen.alive()
    resumed = procs.info(frozen)
    assert resumed is not None and not resumed.active and resumed.epoch >= new_info.epoch
    with pytest.raises(errors.NotCoordinatorError):
        direct.describe_lease("kept")


def _send_zombie_writes(direct, tb1, zombie_snapshot) -> tuple[list[threading.Thread], dict[str, object]]:
    """Four writes sent on threads to the frozen coordinator; each one's result or error lands in the dict."""
    outcomes: dict[str, object] = {}

    def send(name, call) -> None:
        try:
            outcomes[name] = call()
        except errors.KvLeaseError as exc:
            outcomes[name] = exc

    zombies = [threading.Thread(target=send, args=args, daemon=True) for args in (
        ("acquire", lambda: direct.acquire_lease("zombie", {tb1: 1}, 60_000)),
        ("renew", lambda: direct.renew_lease("kept", 600_000)),
        ("drop", lambda: direct.drop_lease("short")),
        ("commit", lambda: direct.commit_kv_snapshot(zombie_snapshot)),
    )]
    for thread in zombies:
        thread.start()
    return zombies, outcomes


def _assert_served_as_before(procs, client, zk, storage, kept, table, other, new_info) -> None:
    """Every lease in ZooKeeper (+ files) is what the active coordinator serves, "kept" unchanged."""
    tb0, tb1 = TableBucket(table.table_id, 0), TableBucket(table.table_id, 1)
    served = {lease.lease_id: lease_view(lease) for lease in client.list_leases()}
    assert_served_as_persisted(client.list_leases(), zk, storage)  # the grace of "short" included
    assert set(served) == {"kept", "short"}
    assert served["kept"] == (kept.expiration_time, {tb0: 1, tb1: 2})
    assert procs.info(other).active and procs.info(other).epoch == new_info.epoch
