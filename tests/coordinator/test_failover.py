"""Coordinator failover with real processes on a real ZooKeeper (``file://`` remote).

- clients acquire/renew/release/drop leases through both coordinators while the
  active one is killed with ``kill -9``: every acknowledged lease state survives,
  ZooKeeper points only at existing lease files, expiry keeps working;
- leases that expired while no coordinator was active get the failover grace;
- orphan lease files are removed by the new active coordinator (soon after it serves);
- a 3-node ZooKeeper ensemble loses its leader and the coordinator keeps serving.

Coordinator processes are killed at teardown whatever happens (the
``coordinator_procs`` fixture) and their logs are printed when a test fails.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from kazoo.exceptions import ConnectionLoss

from kvlease.common import errors, zkpaths
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column
from kvlease.common.zk import loads, make_client
from kvlease.client.admin import AdminClient
from kvlease.common.model import TableBucket
from kvlease.leases.store import LEASE_FILES, LeaseStore
from kvlease.ops.local_cluster import four_letter
from kvlease.ops.wait import wait_until
from tests.support.snapshot_manifests import commit_snapshot
from tests.support.procs import (  # noqa: F401 - coordinator_procs is a fixture
    assert_served_as_persisted, coordinator_procs, persisted_leases)

pytestmark = [pytest.mark.slow, pytest.mark.zk, pytest.mark.timeout(180)]

CHECK_INTERVAL_MS = 200
GRACE_MS = 3_000
EXPIRY_SLACK_S = 1.5  # scheduling on a loaded 2-core box, on top of the check interval


@pytest.fixture
def config(make_config):
    return make_config({"zookeeper.session-timeout": "3s",
                        "kv.snapshot.lease.expiration-check-interval": f"{CHECK_INTERVAL_MS}ms",
                        "kv.snapshot.lease.failover-grace": f"{GRACE_MS}ms"})


def make_table(client: AdminClient, buckets: int) -> list[TableBucket]:
    table = client.create_table("db.t", [Column("id", "BIGINT")], ["id"], buckets)
    tbs = [TableBucket(table.table_id, b) for b in range(buckets)]
    for tb in tbs:
        commit_snapshot(client, tb, 1, 10)
    return tbs


# -- the client workload --------------------------------------------------------------------------------

UNKNOWN = "unknown"  # the last operation on the lease may or may not have been applied


@dataclass
class Workload:
    """``threads`` clients, each owning a few lease ids, acquiring (all buckets), renewing,
    releasing one bucket and dropping them in a loop.

    Per lease it keeps the state the last *acknowledged* operation implies:
    ``None`` (no lease), ``(expiration, buckets)``, or UNKNOWN after an operation
    that failed in a way that may have applied (it stays UNKNOWN until an
    acknowledged operation determines the whole state again).
    """

    addresses: list[str]
    buckets: list[TableBucket]
    threads: int = 8
    leases_per_thread: int = 3
    duration_ms: int = 60_000
    state: dict[str, object] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    acks: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    ack_times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"workload-{i}", daemon=True)
                         for i in range(self.threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a client thread did not stop"

    def acks_since(self, t: float) -> int:
        with self._lock:
            return sum(1 for x in self.ack_times if x >= t)

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        ids = [f"w{index}-{k}" for k in range(self.leases_per_thread)]
        with AdminClient(self.addresses, request_timeout_s=5, retry_total_s=20) as client:
            while not self._stop.is_set():
                lease_id = rng.choice(ids)
                self._step(client, rng, lease_id)

    def _step(self, client: AdminClient, rng: random.Random, lease_id: str) -> None:
        current = self.state.get(lease_id)
        full = {tb: 1 for tb in self.buckets}
        if current is None or current == UNKNOWN:
            op = "acquire"
        else:
            op = rng.choice(["acquire", "renew", "renew", "release", "drop"])
        try:
            if op == "acquire":
                result = client.acquire_lease(lease_id, full, self.duration_ms)
                if result.unavailable or result.acquired != full:
                    self._violation(f"{lease_id}: acquire answered {result}")
                new = (result.expiration_time, dict(result.acquired))
            elif op == "renew":
                expiration = client.renew_lease(lease_id, self.duration_ms)
                new = (expiration, current[1])
            elif op == "release":
                bucket = rng.choice(sorted(current[1], key=TableBucket.sort_key))
                result = client.release_lease(lease_id, [bucket])
                left = {tb: sid for tb, sid in current[1].items() if tb != bucket}
                if result.lease_remains != bool(left):
                    self._violation(f"{lease_id}: release of {bucket} from {current} answered {result}")
                if not result.released:  # the client retried after a first attempt that applied
                    self._count(self.failures, "released=false")
                new = (current[0], left) if left else None
            else:
                client.drop_lease(lease_id)
                new = None
        except errors.LeaseNotFoundError:
            # only renew/release go to a known lease, which is there (60 s leases); release,
            # even retried after a first attempt that applied, never answers LEASE_NOT_FOUND
            known = current not in (None, UNKNOWN)
            if known:
                self._violation(f"{lease_id}: {op} found no lease, but {current} was acknowledged")
            new = None
            self._count(self.failures, "LeaseNotFound")
        except errors.KvLeaseError as exc:
            self._count(self.failures, type(exc).__name__)
            new = UNKNOWN
        else:
            self._count(self.acks, op)
        self.state[lease_id] = new

    def _count(self, counter: Counter, key: str) -> None:
        with self._lock:
            counter[key] += 1
            if counter is self.acks:
                self.ack_times.append(time.monotonic())

    def _violation(self, text: str) -> None:
        with self._lock:
            self.violations.append(text)

    def check(self, client: AdminClient) -> int:
        """Every lease whose state is known is served exactly so; returns how many were checked."""
        checked = 0
        for lease_id, expected in sorted(self.state.items()):
            if expected == UNKNOWN:
                continue
            checked += 1
            if expected is None:
                with pytest.raises(errors.LeaseNotFoundError):
                    client.describe_lease(lease_id)
                continue
            lease = client.describe_lease(lease_id)
            assert (lease.expiration_time, dict(lease.buckets)) == expected, f"lease {lease_id}"
        return checked


def assert_lease_files_consistent(zk, storage) -> None:
    """ZooKeeper points only at existing files, and no other lease file is left."""
    referenced = set()
    for name in zk.get_children(zkpaths.LEASES):
        node = loads(zk.get(zkpaths.lease(name))[0])
        for table in node["tables"]:
            assert storage.exists(table["metadata_path"]), f"lease {name} points at a missing file"
            referenced.add(table["metadata_path"])
    assert set(storage.list(LEASE_FILES)) == referenced


def wait_gone(client: AdminClient, lease_id: str, timeout_s: float) -> float:
    """Poll until the lease is gone; returns the wall-clock time (s) it was first seen gone."""
    def gone():
        try:
            client.describe_lease(lease_id)
        except errors.LeaseNotFoundError:
            return time.time()
        return None
    return wait_until(gone, timeout_s, f"lease {lease_id} expires", interval_s=0.02)


# -- the tests --------------------------------------------------------------------------------------------


def test_acknowledged_leases_survive_kill_9_of_the_active(config, coordinator_procs):
    procs = coordinator_procs(config)
    procs.spawn(2)
    active, info = procs.wait_active(30)
    standby = next(p for p in procs.procs if p is not active)
    client = procs.client(request_timeout_s=5, retry_total_s=20)
    storage = open_storage(config["remote.data.dir"], config)
    zk = make_client(config)
    try:
        buckets = make_table(client, 4)
        workload = Workload(procs.addresses, buckets)
        workload.start()
        try:
            wait_until(lambda: sum(workload.acks.values()) >= 100, 30, "acknowledged operations before the kill")
            active.kill()
            killed_at = time.monotonic()
            new_active, new_info = procs.wait_active(30, among=[standby], min_epoch=info.epoch + 1)
            wait_until(lambda: workload.acks_since(killed_at) >= 100, 30, "clients continue after the failover")
        finally:
            workload.stop()
        assert not workload.violations, workload.violations
        assert workload.acks_since(killed_at) >= 100

        checked = workload.check(client)
        print(f"acknowledged {dict(workload.acks)}, failed {dict(workload.failures)}, "
              f"{checked} of {len(workload.state)} leases checked")
        assert checked >= len(workload.state) // 2, (checked, workload.state)
        assert_served_as_persisted(client.list_leases(), zk, storage)
        assert_lease_files_consistent(zk, storage)
        assert procs.info(new_active).epoch == new_info.epoch  # no further failover happened meanwhile

        # expiry keeps working on the new active coordinator
        short = client.acquire_lease("short-after", {buckets[0]: 1}, 1_000)
        (short_file,) = [t["metadata_path"] for t in loads(zk.get(zkpaths.lease("short-after"))[0])["tables"]]
        gone_at = wait_gone(client, "short-after", 10)
        assert gone_at - short.expiration_time / 1000 <= CHECK_INTERVAL_MS / 1000 + EXPIRY_SLACK_S
        # describe hides a lease once its deadline passed; the expiry timer then drops its node, and
        # its file is deleted after the node: wait for both (bounded), then nothing else may be left
        wait_until(lambda: not zk.exists(zkpaths.lease("short-after"))
                   and short_file not in storage.list(LEASE_FILES),  # alone in its batch: the workload stopped
                   CHECK_INTERVAL_MS / 1000 + EXPIRY_SLACK_S + 5, "the expired lease's node and file are deleted")
        assert_lease_files_consistent(zk, storage)
    finally:
        zk.stop()
        zk.close()


def test_leases_expired_during_the_gap_get_the_failover_grace(config, coordinator_procs):
    procs = coordinator_procs(config)
    procs.spawn(2)
    active, info = procs.wait_active(30)
    standby = next(p for p in procs.procs if p is not active)
    client = procs.client(request_timeout_s=5, retry_total_s=20)
    buckets = make_table(client, 2)
    gap = client.acquire_lease("gap", {buckets[0]: 1}, 1_000)
    long = client.acquire_lease("long", {buckets[1]: 1}, 60_000)

    killed_at = time.time()
    active.kill()
    direct = procs.client([standby.address], request_timeout_s=2, retry_total_s=0)

    def served():
        try:
            return direct.describe_lease("gap"), time.time()
        except (errors.NotCoordinatorError, errors.CoordinatorNotReadyError, errors.NetworkError):
            return None
    lease, served_at = wait_until(served, 30, "the standby serves")
    assert procs.info(standby).epoch > info.epoch
    zk = make_client(config)
    try:  # the grace was written back before serving: what a later failover loads
        stored = persisted_leases(zk, open_storage(config["remote.data.dir"], config))["gap"]
    finally:
        zk.stop()
        zk.close()
    assert (stored.expiration_time, stored.graced) == (lease.expiration_time, True)
    # its deadline passed while no coordinator was active: reinit time (between the kill
    # and the first answer) + the grace
    assert served_at * 1000 > gap.expiration_time, "the failover was faster than the lease"
    assert killed_at * 1000 + GRACE_MS <= lease.expiration_time <= served_at * 1000 + GRACE_MS
    assert lease.buckets == {buckets[0]: 1}
    assert direct.describe_lease("long").expiration_time == long.expiration_time  # not expired: no grace

    gone_at = wait_gone(direct, "gap", GRACE_MS / 1000 + 10)
    assert gone_at - lease.expiration_time / 1000 <= CHECK_INTERVAL_MS / 1000 + EXPIRY_SLACK_S
    assert gone_at >= lease.expiration_time / 1000 - 0.05
    assert {lease.lease_id for lease in direct.list_leases()} == {"long"}


def test_orphan_lease_files_are_removed_on_failover(config, coordinator_procs):
    procs = coordinator_procs(config)
    procs.spawn(2)
    active, info = procs.wait_active(30)
    standby = next(p for p in procs.procs if p is not active)
    client = procs.client(request_timeout_s=5, retry_total_s=20)
    storage = open_storage(config["remote.data.dir"], config)
    zk = make_client(config)
    try:
        buckets = make_table(client, 2)
        client.acquire_lease("keep", {buckets[0]: 1, buckets[1]: 1}, 60_000)
        node = loads(zk.get(zkpaths.lease("keep"))[0])
        referenced = [t["metadata_path"] for t in node["tables"]]
        table_id = buckets[0].table_id
        strays = [f"{LEASE_FILES}/stray/{table_id}/{'ab' * 16}.metadata",  # no such lease
                  f"{LEASE_FILES}/keep/{table_id}/{'cd' * 16}.metadata"]  # an old version of a live lease
        for path in strays:
            storage.write_new(path, b'{"version":1,"lease_id":"stray","table_id":1,"buckets":[]}')

        active.kill()
        procs.wait_active(30, among=[standby], min_epoch=info.epoch + 1)
        # listed in the background once serving, deleted by the event loop
        wait_until(lambda: not any(storage.exists(p) for p in strays), 10, "orphan lease files removed")
        assert all(storage.exists(p) for p in referenced)
        assert client.describe_lease("keep").buckets == {buckets[0]: 1, buckets[1]: 1}
        assert_lease_files_consistent(zk, storage)
        assert set(persisted_leases(zk, storage)) == {"keep"}
    finally:
        zk.stop()
        zk.close()


def zk_leader(ensemble) -> int:
    for index, node in enumerate(ensemble.nodes):
        answer = (four_letter(node.client_port) or "") if ensemble.alive(index) else ""
        if "Mode: leader" in answer:
            return index
    raise AssertionError("the ensemble has no leader")


def test_coordinator_keeps_serving_when_a_zookeeper_node_dies(make_config, zk_ensemble, coordinator_procs):
    config = make_config({"zookeeper.address": zk_ensemble.connect_string,
                          "zookeeper.session-timeout": "6s",
                          "kv.snapshot.lease.expiration-check-interval": f"{CHECK_INTERVAL_MS}ms"})
    procs = coordinator_procs(config)
    (coordinator,) = procs.spawn(1)
    procs.wait_active(30)
    client = procs.client(request_timeout_s=5, retry_total_s=30)
    storage = open_storage(config["remote.data.dir"], config)
    buckets = make_table(client, 2)
    workload = Workload(procs.addresses, buckets, threads=4)
    workload.start()
    try:
        wait_until(lambda: sum(workload.acks.values()) >= 50, 30, "acknowledged operations before the kill")
        leader = zk_leader(zk_ensemble)
        zk_ensemble.kill(leader)
        killed_at = time.monotonic()
        wait_until(lambda: workload.acks_since(killed_at) >= 50, 45, "clients served after a ZooKeeper node died")
    finally:
        workload.stop()
    assert coordinator.alive()
    assert zk_leader(zk_ensemble) != leader  # the two survivors elected a new leader meanwhile
    assert not workload.violations, workload.violations
    procs.wait_active(30)
    checked = workload.check(client)
    print(f"acknowledged {dict(workload.acks)}, failed {dict(workload.failures)}, "
          f"{checked} of {len(workload.state)} leases checked")
    zk = make_client(config)
    try:
        assert_served_as_persisted(client.list_leases(), zk, storage)
        assert_lease_files_consistent(zk, storage)
    finally:
        zk.stop()
        zk.close()


class _FailingZk:
    """A KazooClient whose read of ``fail_path`` (children or data) fails with a connection loss."""

    def __init__(self, zk, fail_path: str) -> None:
        self.zk = zk
        self.fail_path = fail_path

    def get_children(self, path, *args, **kwargs):
        if path == self.fail_path:
            raise ConnectionLoss()
        return self.zk.get_children(path, *args, **kwargs)

    def get_async(self, path, *args, **kwargs):
        result = self.zk.get_async(path, *args, **kwargs)
        if path == self.fail_path:
            result.get()
            failed = self.zk.handler.async_result()
            failed.set_exception(ConnectionLoss())
            return failed
        return result


@pytest.mark.parametrize("fail", ["children", "node"])
def test_zookeeper_errors_while_loading_leases_are_not_taken_for_missing_leases(config, coordinator_procs, fail):
    """A new active coordinator that cannot read a lease must not load the others and
    then delete the unread lease's files as orphans (it fails and tries again instead)."""
    procs = coordinator_procs(config)
    (coordinator,) = procs.spawn(1)
    procs.wait_active(30)
    client = procs.client(request_timeout_s=5, retry_total_s=20)
    buckets = make_table(client, 2)
    for name in ("a", "b", "c"):
        client.acquire_lease(name, {buckets[0]: 1}, 60_000)
    coordinator.kill()
    storage = open_storage(config["remote.data.dir"], config)
    files = storage.list(LEASE_FILES)
    zk = make_client(config)
    try:
        failing = _FailingZk(zk, zkpaths.LEASES if fail == "children" else zkpaths.lease("b"))
        store = LeaseStore(storage)
        try:
            with pytest.raises(ConnectionLoss):
                store.load_all(failing)
                store.remove_orphans()  # what reinitialization does next
        finally:
            store.close()
        assert storage.list(LEASE_FILES) == files
        assert set(persisted_leases(zk, storage)) == {"a", "b", "c"}
    finally:
        zk.stop()
        zk.close()
