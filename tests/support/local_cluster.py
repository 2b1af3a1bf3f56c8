"""An in-process cluster for tests: one coordinator and tablet servers (ids 1..N) on a real ZooKeeper,
over real gRPC on loopback. Tablets can stop and restart."""

from __future__ import annotations

from kvlease.common.tables import TableInfo
from kvlease.ops.wait import wait_until


class LocalCluster:
    """One coordinator and tablet servers (ids 1..N) in this process; tablets can stop and restart."""

    def __init__(self, make_config, base_dir, tablets: int, tablet_overrides: dict | None = None,
                 client_config=None) -> None:
        """``client_config`` (a Config) is the admin client's, e.g. with TLS settings; default: none."""
        from kvlease.client.admin import AdminClient
        from kvlease.coordinator.server import CoordinatorServer

        self.make_config = make_config
        self.base_dir = base_dir
        self.tablet_overrides = dict(tablet_overrides or {})
        self.coordinator = CoordinatorServer(make_config()).start()
        self.tablets = {}
        assert self.coordinator.wait_active(30), "no active coordinator"
        self.admin = AdminClient([self.coordinator.address], client_config, retry_total_s=10)
        for i in range(1, tablets + 1):
            self.start_tablet(i)

    def tablet_config(self, i: int):
        return self.make_config({"tablet.id": i, "tablet.port": 0, "tablet.data-dir": str(self.base_dir / f"t{i}"),
                                 "log.flush.fsync": False, "kv.snapshot.interval": "1h", **self.tablet_overrides})

    def start_tablet(self, i: int):
        from kvlease.tablet.server import TabletServer

        self.tablets[i] = TabletServer(self.tablet_config(i)).start()
        wait_until(lambda: i in {s.id for s in self.admin.list_tablet_servers()}, 30, f"tablet {i} registered")
        return self.tablets[i]

    def stop_tablet(self, i: int) -> None:
        self.tablets.pop(i).stop()
        wait_until(lambda: i not in {s.id for s in self.admin.list_tablet_servers()}, 30, f"tablet {i} gone")

    def create_table(self, path: str, columns, primary_key, buckets: int) -> TableInfo:
        info = self.admin.create_table(path, columns, primary_key, buckets)

        def led():  # every bucket has a live leader
            _, leaders = self.admin.get_table_assignment(info.table_id)
            return len(leaders) == buckets and all(b.leader_address for b in leaders.values())
        wait_until(led, 30, f"{path}: every bucket led")
        return info

    def close(self) -> None:
        for server in self.tablets.values():
            server.stop()
        self.admin.close()
        self.coordinator.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
