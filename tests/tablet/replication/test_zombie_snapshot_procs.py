"""A deposed leader's snapshot (issue 39): real tablet server processes (RF 2), an in-process coordinator on the
test's ZooKeeper, file:// remote storage.

Leader L is paused (SIGSTOP) past its ZooKeeper session; the coordinator elects the follower F, which commits
snapshot 2. L is resumed as a zombie: the coordinator's pushes to it are held back (the window in which a
resumed leader has not heard yet that it was deposed, made as long as the test needs), and it is asked twice
for a snapshot of the bucket. Its leader lease lapsed: it uploads nothing, commits nothing and leaves no file
behind; F's committed snapshots stay byte for byte.
"""

from __future__ import annotations

import signal
import threading
import zlib
from pathlib import Path

import grpc
import pytest

from kvlease.client.admin import AdminClient
from kvlease.client.table import TableClient
from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.model import SnapshotHandle
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.proto import tablet_pb2_grpc as pbg
from kvlease.coordinator.notifier import LeadershipNotifier
from kvlease.coordinator.server import CoordinatorServer
from kvlease.ops.local_cluster import ServerProcess, free_ports
from kvlease.ops.wait import wait_until
from tests.support.snapshot_manifests import storage_of
from tests.tablet.replication.test_replicated_buckets import SCHEMA

pytestmark = [pytest.mark.zk, pytest.mark.slow, pytest.mark.timeout(120)]

TABLET = {"zookeeper.session-timeout": "1500ms", "replica.fetch.wait-max": "100ms",
          "replica.max-lag": "2s",  # the new leader drops the paused one from its ISR (the zombie's own try is refused)
          "kv.snapshot.interval": "1h",  # every snapshot is asked for by the test
          "log.flush.fsync": False}


class HeldPushes:
    """Holds back the coordinator's pushes to one tablet server (the rest go out) until :meth:`release`."""

    def __init__(self, monkeypatch) -> None:
        self.server_id: int | None = None
        self.held: list[tuple] = []
        self._lock = threading.Lock()
        real = LeadershipNotifier.push

        def push(notifier, server_id, *args, **kwargs):
            with self._lock:
                if server_id == self.server_id:
                    self.held.append((notifier, server_id, args, kwargs))
                    return
            real(notifier, server_id, *args, **kwargs)

        self._real = real
        monkeypatch.setattr(LeadershipNotifier, "push", push)

    def hold(self, server_id: int) -> None:
        with self._lock:
            self.server_id = server_id

    def release(self) -> None:
        with self._lock:
            self.server_id, held, self.held = None, self.held, []
        for notifier, server_id, args, kwargs in held[-1:]:  # the latest says everything
            self._real(notifier, server_id, *args, **kwargs)


class Tablets:
    def __init__(self, make_config, base: Path) -> None:
        self.make_config = make_config
        self.base = base
        self.procs: dict[int, ServerProcess] = {}
        self.addresses: dict[int, str] = {}

    def start(self, server_id: int) -> None:
        (port,) = free_ports(1)
        values = {name: (v if isinstance(v, (bool, int, str)) else str(v))
                  for name, v in self.make_config(TABLET).as_dict().items()}
        values.update({cfg.TABLET_ID.name: server_id, cfg.TABLET_PORT.name: port,
                       cfg.TABLET_DATA_DIR.name: str(self.base / f"t{server_id}" / "data")})
        self.procs[server_id] = ServerProcess(self.base / f"t{server_id}", "tablet", values)
        self.addresses[server_id] = f"127.0.0.1:{port}"

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()

    def logs(self) -> str:
        return "\n".join(f"==> tablet {i} <==\n{p.log_tail(60)}" for i, p in self.procs.items())


def trigger(address: str, table_id: int) -> tuple[int, str]:
    """TriggerSnapshot of bucket 0 sent to this server itself (not routed): (error code, message)."""
    with grpc.insecure_channel(address) as channel:
        response = pbg.TabletServiceStub(channel).TriggerSnapshot(
            pb.TriggerSnapshotRequest(table_id=table_id, buckets=[0], wait=True), timeout=30)
    return response.error.code, response.error.message


def contents(storage, paths) -> dict[str, int]:
    return {p: zlib.crc32(storage.read(p)) for p in sorted(paths)}


@pytest.fixture
def cluster(make_config, tmp_path, monkeypatch):
    pushes = HeldPushes(monkeypatch)
    coordinator = CoordinatorServer(make_config({"kv.snapshot.lease.expiration-check-interval": "100ms"})).start()
    tablets = Tablets(make_config, tmp_path)
    try:
        assert coordinator.wait_active(15)
        with AdminClient([coordinator.address], retry_total_s=20) as admin:
            for server_id in (1, 2):
                tablets.start(server_id)
            wait_until(lambda: len(admin.list_tablet_servers()) == 2, 30, "two tablet servers")
            yield admin, tablets, pushes, storage_of(make_config())
    except BaseException:
        print(tablets.logs())
        raise
    finally:
        tablets.close()  # kill -9, paused or not
        coordinator.stop()


def test_a_resumed_deposed_leader_writes_over_nothing_commits_nothing_and_leaves_nothing(cluster):
    admin, tablets, pushes, storage = cluster
    table = admin.create_table("db.zombie", SCHEMA, ["id"], 1, replication_factor=2, min_insync_replicas=1)
    state = wait_until(lambda: (s := admin.get_table_assignment(table.table_id)[1][0]).leader_address
                       and len(s.isr) == 2 and s, 30, "both replicas in sync")
    old, new = state.leader_id, next(r for r in state.replicas if r != state.leader_id)
    with TableClient(admin, "db.zombie", retry_total_s=30) as client:
        client.upsert([{"id": i, "v": "first"} for i in range(2000)])
        assert trigger(tablets.addresses[old], table.table_id) == (0, "")  # snapshot 1, by the leader
        client.upsert([{"id": i, "v": "second"} for i in range(1000, 3000)])  # in no snapshot yet

    pushes.hold(old)  # the zombie will not hear that it was deposed
    tablets.procs[old].popen.send_signal(signal.SIGSTOP)
    moved = wait_until(lambda: (s := admin.get_table_assignment(table.table_id)[1][0]).leader_id == new
                       and s.leader_address and s, 30, "the follower elected")
    assert moved.leader_epoch > state.leader_epoch

    def kept() -> dict[int, SnapshotHandle]:
        return {s.handle.snapshot_id: s.handle for s in admin.list_kv_snapshots(table.table_id)}

    # snapshot 2 by the new leader, of the same rows (once its HW passed them: the paused one left its ISR)
    wait_until(lambda: trigger(tablets.addresses[new], table.table_id)[0] == 0 and 2 in kept(), 20,
               "snapshot 2 by the new leader")
    committed = kept()
    assert sorted(committed) == [1, 2]
    referenced = set().union(*(h.file_paths() for h in committed.values()))
    before = contents(storage, referenced)

    tablets.procs[old].popen.send_signal(signal.SIGCONT)  # it still believes it leads, at its old epoch
    # its leader lease lapsed with its session (docs/architecture.md "Leader leases"): it starts no upload. (Had
    # it started one: its next snapshot id, 2, is the new leader's; the one name two uploads may share is the
    # manifest's, created exclusively first, and a commit of a deposed epoch is refused: tests/tablet/
    # test_snapshot_fencing.py and tests/coordinator/test_snapshot_fencing.py)
    for _ in range(2):
        refused = trigger(tablets.addresses[old], table.table_id)
        assert refused[0] == errors.ErrorCode.NOT_LEADER and "leader lease lapsed" in refused[1], refused
    assert sorted(kept()) == [1, 2]  # the zombie committed nothing
    assert contents(storage, referenced) == before  # the committed snapshots' files, byte for byte
    assert set(storage.list(f"kv/{table.table_id}")) == referenced  # and it left nothing behind

    pushes.release()
    wait_until(lambda: trigger(tablets.addresses[old], table.table_id)[0] == errors.ErrorCode.NOT_LEADER, 20,
               "the zombie to hear it follows")
    with TableClient(admin, "db.zombie", retry_total_s=30) as client:
        assert client.lookup([{"id": 2999}, {"id": 10}]) == [{"id": 2999, "v": "second"}, {"id": 10, "v": "first"}]
