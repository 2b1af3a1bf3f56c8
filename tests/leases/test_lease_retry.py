"""Retry-safe lease requests over real gRPC, against coordinators on a real ZooKeeper.

In-process coordinators (``CoordinatorServer``) on loopback, an AdminClient, and
the ``kvlease`` CLI in-process (click's runner) with ``--bootstrap``. The expiry
timer is set to an hour, so it never runs: every "past its deadline" case here
is the request's own check, not the timer's. What the coordinator persisted is
read back from ZooKeeper + the lease files (``persisted_leases``).
"""

from __future__ import annotations

import json
import time

import pytest

from kvlease.client.admin import AdminClient, ReleaseResult
from kvlease.common import errors
from kvlease.common.model import TableBucket
from kvlease.common.storage import open_storage
from kvlease.common.tables import Column
from kvlease.common.zk import make_client
from kvlease.coordinator.server import CoordinatorServer
from kvlease.ops.wait import wait_until
from tests.support.cli_runner import assert_one_line_error, run
from tests.support.procs import persisted_leases
from tests.support.snapshot_manifests import commit_snapshot

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]

GRACE_MS = 2_000
SHORT_MS = 200  # a lease meant to pass its deadline during the test


@pytest.fixture
def config(make_config):
    return make_config({"metrics.port": 0, "kv.snapshot.lease.expiration-check-interval": "1h",
                        "kv.snapshot.lease.max-duration": "1h",
                        "kv.snapshot.lease.failover-grace": f"{GRACE_MS}ms",
                        "client.retry.total-timeout": "10s"})


class Coordinators:
    """Coordinator servers started on ``config``; every one is stopped at teardown."""

    def __init__(self, config) -> None:
        self.config = config
        self.servers: list[CoordinatorServer] = []

    def start(self) -> CoordinatorServer:
        server = CoordinatorServer(self.config).start()
        self.servers.append(server)
        return server

    def active(self, timeout_s: float = 15) -> CoordinatorServer:
        return wait_until(lambda: next((s for s in self.servers if s.is_active), None), timeout_s,
                          "an active coordinator")

    def close(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def coordinators(config):
    group = Coordinators(config)
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def active(coordinators):
    coordinators.start()
    return coordinators.active()


@pytest.fixture
def client(active):
    with AdminClient([active.address], retry_total_s=10) as admin:
        yield admin


@pytest.fixture
def persisted(config):
    """``persisted() -> {lease_id: Lease}`` as ZooKeeper + the lease files hold them now."""
    zk = make_client(config)
    storage = open_storage(config["remote.data.dir"], config)
    try:
        yield lambda: persisted_leases(zk, storage)
    finally:
        zk.stop()
        zk.close()


@pytest.fixture
def tbs(client) -> list[TableBucket]:
    """db.t with 4 buckets; buckets 0-2 have snapshot 1."""
    table = client.create_table("db.t", [Column("id", "BIGINT")], ["id"], 4)
    buckets = [TableBucket(table.table_id, b) for b in range(4)]
    for tb in buckets[:3]:
        commit_snapshot(client, tb, 1, 10)
    return buckets


def leased_by(client: AdminClient, tb: TableBucket) -> tuple[str, ...]:
    return {s.bucket: s.leased_by for s in client.list_kv_snapshots(tb.table_id)}[tb]


def now_ms() -> int:
    """The wall clock as the coordinator reads it: whole milliseconds (a float can be ahead of it)."""
    return int(time.time() * 1000)


def past_deadline(expiration_time_ms: int) -> None:
    """Wait until the wall clock (the coordinator's clock) is past ``expiration_time_ms``."""
    wait_until(lambda: time.time() * 1000 > expiration_time_ms + 20, 10, "the lease's deadline passes",
               interval_s=0.02)


def expired_lease(client: AdminClient, persisted, lease_id: str, snapshots: dict) -> None:
    """A lease past its deadline that the (hour-long) expiry timer has not dropped."""
    result = client.acquire_lease(lease_id, snapshots, SHORT_MS)
    past_deadline(result.expiration_time)
    assert lease_id in persisted(), "the expiry timer ran"


# -- release ----------------------------------------------------------------------------------------------


def test_a_retried_release_of_the_last_bucket_answers_released_false(client, tbs, persisted):
    client.acquire_lease("L", {tbs[0]: 1}, 60_000)
    assert client.release_lease("L", [tbs[0]]) == ReleaseResult("L", released=True, lease_remains=False)
    assert client.release_lease("L", [tbs[0]]) == ReleaseResult("L", released=False, lease_remains=False)
    assert "L" not in persisted() and client.list_leases() == []
    assert leased_by(client, tbs[0]) == ()


def test_release_of_an_unknown_lease_answers_released_false(client, tbs, persisted):
    assert client.release_lease("never", [tbs[0], tbs[1]]) == ReleaseResult("never", False, False)
    assert client.list_leases() == [] and persisted() == {}


def test_release_of_held_and_not_held_buckets_frees_the_held_ones(client, tbs, persisted):
    client.acquire_lease("L", {tbs[0]: 1, tbs[1]: 1}, 60_000)
    assert client.release_lease("L", [tbs[1], tbs[2], tbs[3]]) == ReleaseResult("L", True, True)
    assert client.describe_lease("L").buckets == {tbs[0]: 1}
    assert persisted()["L"].buckets == {tbs[0]: 1}
    assert client.release_lease("L", [tbs[2]]) == ReleaseResult("L", released=False, lease_remains=True)
    assert client.describe_lease("L").buckets == {tbs[0]: 1}


@pytest.mark.parametrize("lease_id", ["L", "unknown"])
def test_release_of_a_bad_bucket_is_a_typed_error(client, tbs, persisted, lease_id):
    client.acquire_lease("L", {tbs[0]: 1}, 60_000)
    before = persisted()
    with pytest.raises(errors.BucketOutOfRangeError, match="out of range"):
        client.release_lease(lease_id, [tbs[0], TableBucket(tbs[0].table_id, 4)])
    with pytest.raises(errors.TableNotExistError):
        client.release_lease(lease_id, [tbs[0], TableBucket(tbs[0].table_id + 100, 0)])
    assert persisted() == before
    assert client.describe_lease("L").buckets == {tbs[0]: 1}


# -- a lease past its deadline, the expiry timer not run ---------------------------------------------------


def test_a_lease_past_its_deadline_is_hidden_and_renew_is_lease_not_found(client, tbs, persisted):
    expired_lease(client, persisted, "L", {tbs[0]: 1})
    assert client.list_leases() == []
    with pytest.raises(errors.LeaseNotFoundError):
        client.describe_lease("L")
    with pytest.raises(errors.LeaseNotFoundError, match="expired"):
        client.renew_lease("L", 60_000)
    assert "L" not in persisted()  # the renew dropped it
    assert leased_by(client, tbs[0]) == ()
    with pytest.raises(errors.LeaseNotFoundError):  # and it stays gone
        client.renew_lease("L", 60_000)


def test_acquire_past_the_deadline_starts_a_new_lease(client, tbs, persisted):
    expired_lease(client, persisted, "L", {tbs[0]: 1, tbs[1]: 1})
    before_ms = now_ms()
    result = client.acquire_lease("L", {tbs[1]: 1, tbs[2]: 1}, 60_000)
    assert result.acquired == {tbs[1]: 1, tbs[2]: 1} and result.unavailable == {}
    assert before_ms + 60_000 <= result.expiration_time <= time.time() * 1000 + 60_000
    lease = client.describe_lease("L")
    assert (lease.expiration_time, lease.buckets) == (result.expiration_time, {tbs[1]: 1, tbs[2]: 1})
    stored = persisted()["L"]
    assert (stored.expiration_time, stored.buckets) == (result.expiration_time, {tbs[1]: 1, tbs[2]: 1})
    assert leased_by(client, tbs[0]) == ()  # the old bucket's refcount was freed
    assert leased_by(client, tbs[1]) == ("L",)


def test_release_and_drop_past_the_deadline_answer_false_and_remove_the_lease(client, tbs, persisted):
    expired_lease(client, persisted, "R", {tbs[0]: 1})
    expired_lease(client, persisted, "D", {tbs[1]: 1})
    assert client.release_lease("R", [tbs[0]]) == ReleaseResult("R", released=False, lease_remains=False)
    assert client.drop_lease("D") is False
    assert persisted() == {}
    assert leased_by(client, tbs[0]) == () and leased_by(client, tbs[1]) == ()


# -- failover: the grace is written back, once ---------------------------------------------------------------


def test_the_failover_grace_is_persisted_and_not_granted_again(coordinators, persisted):
    first = coordinators.start()
    assert coordinators.active() is first
    second = coordinators.start()
    with AdminClient([first.address], retry_total_s=10) as client:
        table = client.create_table("db.t", [Column("id", "BIGINT")], ["id"], 1)
        tb = TableBucket(table.table_id, 0)
        commit_snapshot(client, tb, 1, 10)
        expired_lease(client, persisted, "gap", {tb: 1})
        client.acquire_lease("long", {tb: 1}, 600_000)

    stopping_at = now_ms()
    first.stop()  # the lease expired while it was active; no timer ran
    assert coordinators.active() is second
    served_at = time.time() * 1000
    assert (second.reinit_stats["graced"], second.reinit_stats["expired"]) == (1, 0)
    # where the reinitialization's time went, step by step (logged with the stats)
    assert list(second.reinit_stats["ms"]) == ["tables", "assignments", "log_ends", "snapshots", "leases", "checks"]
    with AdminClient([second.address], retry_total_s=10) as client:
        lease = client.describe_lease("gap")
        assert stopping_at + GRACE_MS <= lease.expiration_time <= served_at + GRACE_MS
        stored = persisted()["gap"]
        assert (stored.expiration_time, stored.graced) == (lease.expiration_time, True)  # written back

    past_deadline(lease.expiration_time)  # the grace runs out; still no timer
    assert "gap" in persisted()
    third = coordinators.start()
    second.stop()
    assert coordinators.active() is third
    assert (third.reinit_stats["graced"], third.reinit_stats["expired"]) == (0, 1)
    assert set(persisted()) == {"long"}  # dropped, not granted a second grace
    with AdminClient([third.address], retry_total_s=10) as client:
        with pytest.raises(errors.LeaseNotFoundError):
            client.describe_lease("gap")
        assert [lease.lease_id for lease in client.list_leases()] == ["long"]
        assert leased_by(client, tb) == ("long",)


# -- owners: one reader per lease id, across retries and failovers ------------------------------------------


def test_an_owned_lease_is_refused_to_another_owner_before_and_after_a_failover(coordinators, persisted):
    first = coordinators.start()
    assert coordinators.active() is first
    second = coordinators.start()  # a standby: its mirror carries the owner
    with AdminClient([first.address], retry_total_s=10) as client:
        table = client.create_table("db.t", [Column("id", "BIGINT")], ["id"], 2)
        tb0, tb1 = (TableBucket(table.table_id, b) for b in range(2))
        for tb in (tb0, tb1):
            commit_snapshot(client, tb, 1, 10)
            commit_snapshot(client, tb, 2, 20)
        acquired = client.acquire_lease("L", {tb0: 1}, 600_000, owner="stream-1")
        # the answer was lost: the retry has the same outcome
        retried = client.acquire_lease("L", {tb0: 1}, 600_000, owner="stream-1")
        assert (retried.acquired, retried.unavailable) == (acquired.acquired, acquired.unavailable) == ({tb0: 1}, {})
        with pytest.raises(errors.LeaseOwnedError, match="lease 'L' belongs to the reader with owner token "
                                                         "'stream-1'"):
            client.acquire_lease("L", {tb0: 2, tb1: 2}, 600_000, owner="batch-9")
        with pytest.raises(errors.LeaseOwnedError):
            client.acquire_lease("L", {tb0: 2}, 600_000)  # no owner: not the owner either
        assert client.release_lease("L", [tb0], owner="batch-9") == ReleaseResult("L", False, False)
        assert client.drop_lease("L", owner="batch-9") is False
        stored = persisted()["L"]
        assert (stored.owner, dict(stored.buckets)) == ("stream-1", {tb0: 1})
        assert client.describe_lease("L").owner == "stream-1"

    first.stop()
    assert coordinators.active() is second
    with AdminClient([second.address], retry_total_s=10) as client:
        assert client.describe_lease("L").owner == "stream-1"
        with pytest.raises(errors.LeaseOwnedError):
            client.acquire_lease("L", {tb1: 2}, 600_000, owner="batch-9")
        assert client.acquire_lease("L", {tb1: 2}, 600_000, owner="stream-1").acquired == {tb1: 2}
        assert dict(client.describe_lease("L").buckets) == {tb0: 1, tb1: 2}
        assert client.drop_lease("L") is True  # the operator's drop: any lease
        assert client.drop_lease("L") is False  # retried
        assert client.acquire_lease("L", {tb0: 2}, 600_000, owner="batch-9").acquired == {tb0: 2}
        assert persisted()["L"].owner == "batch-9"


def test_cli_acquire_of_another_readers_lease_fails_naming_it(active, client, tbs, persisted):
    client.acquire_lease("L", {tbs[0]: 1}, 60_000, owner="spark-7")
    cli = ("--bootstrap", active.address, "lease", "acquire", "L", "--table", "db.t", "--snapshot", "1=1",
           "--duration", "1m")
    message = assert_one_line_error(run(*cli))
    assert "lease 'L' belongs to the reader with owner token 'spark-7'" in message
    assert "kvlease lease drop L" in message
    mine = run(*cli, "--owner", "spark-7", "--json")
    assert mine.exit_code == 0, mine.output
    shown = run("--bootstrap", active.address, "lease", "describe", "L", "--json")
    assert json.loads(shown.stdout)["owner"] == "spark-7"
    assert dict(persisted()["L"].buckets) == {tbs[0]: 1, tbs[1]: 1}


# -- the CLI -----------------------------------------------------------------------------------------------


def test_cli_release_of_a_bucket_not_held_exits_0_and_says_so(active, client, tbs, persisted):
    client.acquire_lease("L", {tbs[0]: 1}, 60_000)
    cli = ("--bootstrap", active.address, "lease", "release")

    not_held = run(*cli, "L", "--table", "db.t", "--bucket", "1")
    assert not_held.exit_code == 0, not_held.output
    assert not_held.stdout.strip() == "lease L holds none of db.t bucket(s) 1: nothing released"
    assert client.describe_lease("L").buckets == {tbs[0]: 1}

    released = run(*cli, "L", "--table", "db.t", "--bucket", "0,1", "--json")
    assert released.exit_code == 0, released.output
    assert json.loads(released.stdout) == {"lease_id": "L", "table": "db.t", "buckets": [0, 1],
                                           "released": True, "lease_remains": False}
    retried = run(*cli, "L", "--table", "db.t", "--bucket", "0,1")
    assert retried.exit_code == 0, retried.output
    assert retried.stdout.strip() == "no lease L (nothing to release)"
    assert "L" not in persisted()

    out_of_range = run(*cli, "L", "--table", "db.t", "--bucket", "4")
    assert "out of range" in assert_one_line_error(out_of_range)
    assert "does not exist" in assert_one_line_error(run(*cli, "L", "--table", "db.nope", "--bucket", "0"))

