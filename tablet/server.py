"""The tablet server process: gRPC endpoint, ZooKeeper registration, snapshot timer.

It registers the ephemeral ``/tabletservers/ids/{tablet.id}`` with its
address and its capacity ``max_buckets`` (``tablet.buckets.max``; again after
a lost session); the coordinator then pushes the buckets it leads. Every
``kv.snapshot.interval`` each changed bucket is snapshotted to remote storage
and committed to the coordinator. The bucket keeper (``tablet/replicas/keeper.py``)
opens newly led buckets and reopens failed ones in the background; the metrics
endpoint exports the server's health (``tablet/replicas/health.py``) and its replica rebuilds
(``tablet/replication/rebuild_progress.py``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from kvlease.common import config as cfg
from kvlease.common import errors, zkpaths
from kvlease.common.limits import GRPC_SERVER_OPTIONS
from kvlease.common.malloc import limit_arenas
from kvlease.common.redaction import protect
from kvlease.common.proto import tablet_pb2_grpc as pb_grpc
from kvlease.common.storage import RemoteStorage, open_storage
from kvlease.common.tls import TlsFiles, add_port
from kvlease.common.zk import dumps, loads, make_client
from kvlease.client.admin import AdminClient
from kvlease.client.coordinator_caller import CoordinatorCaller
from kvlease.client.server_calls import ServerCalls
from kvlease.common.security.client import internal_client_config
from kvlease.common.security.server import server_security
from kvlease.tablet.bucket.open_buckets import fd_limit
from kvlease.tablet.expiry import ExpiryRounds
from kvlease.tablet.lookup_port import LookupPort, LookupPortCollector, lookup_answers
from kvlease.tablet.periodic import Periodic
from kvlease.tablet.replicas import lost_data
from kvlease.tablet.replicas.health import HealthCollector
from kvlease.tablet.replicas.keeper import BucketKeeper
from kvlease.tablet.replicas.manager import ReplicaManager
from kvlease.tablet.log.waits import LogWaits
from kvlease.tablet.replication.fetch_service import ReplicaFetchService
from kvlease.tablet.replication.fetcher import Fetchers
from kvlease.tablet.replication.isr_changes import IsrKeeper
from kvlease.tablet.replication.leader_lease import LeaderLease, LeaseRenewer, lease_duration_ms
from kvlease.tablet.replication.rebase import RebaseCollector
from kvlease.tablet.replication.rebuild_progress import RebuildCollector
from kvlease.client.transport import Channels
from kvlease.tablet.replicas.step_down import StepDown
from kvlease.tablet.scan import wire as scan_wire
from kvlease.tablet.scan.service import ScanService
from kvlease.tablet.service import INTERNAL_METHODS, TabletService

log = logging.getLogger(__name__)

GRPC_OPTIONS = list(GRPC_SERVER_OPTIONS)  # the same message sizes as every client's


class TabletServer:
    def __init__(self, config: cfg.Config, storage: RemoteStorage | None = None) -> None:
        self.config = config
        protect(config.secrets())  # out of every log line and error message of this process
        self.server_id = config[cfg.TABLET_ID]
        self.storage = storage
        self.address = ""
        self.incarnation = uuid.uuid4().hex
        self.dir_id = ""
        self.zk = None
        self.admin: AdminClient | None = None
        self.server_calls: ServerCalls | None = None  # this server's own calls (ISR, shutdown, losses)
        self.replicas: ReplicaManager | None = None
        self.scans: ScanService | None = None
        self.keeper: BucketKeeper | None = None
        self.fetchers: Fetchers | None = None
        self.fetches_service: ReplicaFetchService | None = None
        self.isr_keeper: IsrKeeper | None = None
        self.step_down: StepDown | None = None
        self.snapshot_rounds: SnapshotRounds | None = None
        self.expiry_rounds: ExpiryRounds | None = None
        self.metrics_port: int | None = None
        self.lookups: LookupPort | None = None  # Lookup over plain TCP (tablet/lookup_port.py)
        self._grpc = None
        self._stopping = threading.Event()
        self._register_needed = threading.Event()
        self._registrations = 0  # the ZooKeeper sessions this process registered in (a lost one: again)
        self._strays_checked = 0  # the registration after whose first push the stray copies were removed
        self._threads: list[threading.Thread] = []
        #: How long a renewal of its leader lease lasts (tablet/replication/leader_lease.py); registered, so that the
        #: coordinator knows how long a new leader of its buckets waits when it may still hold one.
        self.lease_ms = lease_duration_ms(config[cfg.ZK_SESSION_TIMEOUT])
        self.lease: LeaderLease | None = None
        self.lease_renewer: LeaseRenewer | None = None

    def start(self) -> "TabletServer":
        c = self.config
        limit_arenas(c[cfg.TABLET_MALLOC_ARENA_MAX])  # before this server's threads start (common/malloc.py)
        self.tls = TlsFiles.from_config(c, server=True)  # a bad file is refused before anything starts
        if self.storage is None:
            self.storage = open_storage(c[cfg.REMOTE_DATA_DIR], c)
        self.security = server_security(c)  # a bad setting is refused before anything starts
        self.zk = make_client(c)
        self.security.start(self.zk)  # users and ACLs mirrored before the first call is served
        self.admin = AdminClient([self._active_coordinator() or "127.0.0.1:0"], internal_client_config(c),
                                 locate=self._active_coordinator)  # as the cluster's own principal
        self.server_calls = ServerCalls(self.admin.caller.call)  # the same channels, coordinator and retries
        self.dir_id = lost_data.data_dir_id(c[cfg.TABLET_DATA_DIR], self.server_id)  # registered: a new one = lost data
        self.lease = LeaderLease(self.lease_ms / 1000.0)
        self.replicas = ReplicaManager(c[cfg.TABLET_DATA_DIR], c, self.storage, self.admin,
                                       current_epoch=self._zk_coordinator_epoch, table_gone=self._zk_table_gone,
                                       server_id=self.server_id, lease=self.lease, server_calls=self.server_calls,
                                       partition_table=self._zk_partition_table)
        self.lease_renewer = LeaseRenewer(self.lease, self.zk, self.server_id).start()
        self.log_ends = lost_data.LogEndReporter(self.replicas, self.server_calls)  # what a restore would lose
        self.replicas.dir_id = self.dir_id
        self._start_replication()
        self.scans = ScanService(self.replicas, c, security=self.security).start()
        self.scans.metrics.registry.register(HealthCollector(self.replicas, self.step_down))
        self.scans.metrics.registry.register(RebuildCollector(self.replicas, self.fetchers))
        self.scans.metrics.registry.register(RebaseCollector(self.fetchers))
        self.scans.metrics.registry.register(LookupPortCollector(lambda: self.lookups))
        self.keeper = BucketKeeper(self.replicas).start()
        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=c[cfg.TABLET_RPC_THREADS],
                                                    thread_name_prefix="tablet-rpc"), options=GRPC_OPTIONS,
                                 interceptors=[*self.security.interceptors(INTERNAL_METHODS),
                                               scan_wire.SerializedScans()])
        service = TabletService(self.replicas, self.scans, self.security, fetches=self.fetches_service,
                                log_waits=self.log_waits)
        pb_grpc.add_TabletServiceServicer_to_server(service, self._grpc)
        host = c[cfg.TABLET_HOST]
        port = add_port(self._grpc, c, cfg.TABLET_HOST, cfg.TABLET_PORT, self.tls)
        self.address = f"{host}:{port}"
        self._start_lookup_port(service, host)
        if c[cfg.METRICS_PORT] >= 0:
            try:
                self.metrics_port = self.scans.metrics.serve(host, c[cfg.METRICS_PORT])
            except OSError as exc:  # metrics are not worth failing the server for
                log.warning("no metrics endpoint on %s:%s: %s", host, c[cfg.METRICS_PORT], exc)
        self._grpc.start()
        self.zk.add_listener(self._on_zk_state)
        self._register_at_start()
        self.snapshot_rounds = SnapshotRounds(c[cfg.SNAPSHOT_INTERVAL] / 1000.0, self.replicas, self.log_ends).start()
        self.expiry_rounds = ExpiryRounds(c[cfg.ROW_TTL_CHECK_INTERVAL] / 1000.0, c[cfg.ROW_TTL_MAX_ROWS],
                                          self.replicas, self._notify_news).start()  # tablet/expiry.py
        registrar = threading.Thread(target=self._registrar, name="zk-register", daemon=True)
        registrar.start()
        self._threads.append(registrar)
        log.info("tablet server %d serving on %s, lookups also on port %s (at most %d buckets, %d with open files; "
                 "open-file limit %d)", self.server_id, self.address, self.lookups.port if self.lookups else "(none)",
                 self.replicas.max_buckets, self.replicas.budget.capacity, fd_limit())
        return self

    def _start_lookup_port(self, service: TabletService, host: str) -> None:
        """Lookup over plain TCP beside gRPC (tablet/lookup_port.py), unless it is off or security is on (that
        port has no TLS and no users); a port that cannot be had is logged, and lookups go over gRPC."""
        port = self.config[cfg.TABLET_LOOKUP_PORT]
        if port < 0 or self.security.enabled:
            return
        try:
            self.lookups = LookupPort(self.address, lookup_answers(service.Lookup), host, port,
                                      self.config[cfg.TABLET_LOOKUP_CONNECTIONS]).start()
        except OSError as exc:
            log.warning("no lookup port on %s:%s (lookups go over gRPC): %s", host, port, exc)
            return
        service.lookup_port = self.lookups.port

    def _notify_news(self) -> None:
        """A log here grew or its HW moved: wake followers' fetches and clients' FetchLog long polls."""
        self.fetches_service.notify()
        self.log_waits.notify()

    def _start_replication(self) -> None:
        """The leader's fetch service, the follower's fetch threads and the ISR keeper (docs/bucket-store.md,
        "Replication")."""
        c = self.config
        self.fetches_service = ReplicaFetchService(self.replicas)
        self.log_waits = LogWaits(max(1, c[cfg.TABLET_RPC_THREADS] // 2))  # FetchLog long polls (tablet/log/waits.py)
        self.replicas.on_commit = self._notify_news
        credentials = None
        if c[cfg.SECURITY_ENABLED]:
            credentials = (c[cfg.INTERNAL_USERNAME], c[cfg.INTERNAL_PASSWORD])
        self._replica_channels = Channels(tls=self.tls, credentials=credentials)
        self.fetchers = Fetchers(self.server_id, self.replicas.followed, self._replica_channels,
                                 wait_ms=c[cfg.REPLICA_FETCH_WAIT_MAX], max_bytes=c[cfg.REPLICA_FETCH_MAX_BYTES],
                                 storage=self.storage, admin=self.admin, io_threads=c[cfg.SNAPSHOT_UPLOAD_THREADS],
                                 rebuild_bytes_per_s=c[cfg.REPLICA_REBUILD_MAX_BYTES_PER_S],
                                 rebase_interval_ms=c[cfg.REPLICA_REBASE_INTERVAL])
        self.replicas.role_listeners.append(self.fetchers.update)
        self.replicas.role_listeners.append(self._remove_stray_copies)
        self.isr_keeper = IsrKeeper(self.server_id, self.replicas.leaderships, self.server_calls.alter_isr,
                                    max_lag_ms=c[cfg.REPLICA_MAX_LAG]).start()
        self.replicas.on_isr_due = self.isr_keeper.wake
        self.step_down = StepDown(self.server_id, self.replicas, self.server_calls.resign_leadership,  # step_down.py
                                  after_s=c[cfg.REPLICA_LEADER_FAILURE_TIMEOUT] / 1000.0).start()

    def _controlled_shutdown(self) -> None:
        """Ask the coordinator to move this server's leaderships of replicated buckets away, and wait until
        it did (``tablet.controlled-shutdown.timeout``): a rolling restart then has no unavailability. The
        follower fetches stop first (a stopping follower must not rejoin an ISR); an unreachable coordinator
        ends the wait at once (nobody can move them then), and so does the last leadership with another
        in-sync replica going (e.g. the coordinator's push that shrank its ISR to this server alone, as its
        follower died: the coordinator answers it cannot move that one, and asking again changes nothing)."""
        if self.fetchers is not None:
            self.fetchers.stop()
        if self.replicas is None or self.admin is None or not self._movable_leaderships():
            return
        deadline = time.monotonic() + self.config[cfg.CONTROLLED_SHUTDOWN_TIMEOUT] / 1000.0
        with CoordinatorCaller([self._active_coordinator() or "127.0.0.1:0"], internal_client_config(self.config),
                               locate=self._active_coordinator, retry_total_s=2.0) as caller:
            calls = ServerCalls(caller.call)
            while time.monotonic() < deadline:
                if not self._movable_leaderships():
                    log.info("controlled shutdown: no leadership left with another in-sync replica")
                    return
                try:
                    remaining = calls.controlled_shutdown(self.server_id)
                except errors.KvLeaseError as exc:
                    log.warning("controlled shutdown: %s (stopping without it)", exc)
                    return
                if remaining == 0:  # moved: wait (briefly) for the push that makes this server a follower
                    settle = time.monotonic() + 2.0
                    while time.monotonic() < settle and self._movable_leaderships():
                        time.sleep(0.05)
                    log.info("controlled shutdown: leaderships moved away")
                    return
                time.sleep(0.2)
        log.warning("controlled shutdown did not move every leadership away in time: stopping anyway")

    def _movable_leaderships(self) -> list:
        return [r for r in self.replicas.replicas()
                if r.replicated and len(r.lead.isr if r.lead is not None else r.role.isr) > 1]

    def stop(self) -> None:
        self._controlled_shutdown()
        self._stopping.set()
        self._register_needed.set()
        for thread in self._threads:
            thread.join(timeout=30)
        if self.snapshot_rounds is not None:
            self.snapshot_rounds.stop()
        if self.expiry_rounds is not None:
            self.expiry_rounds.stop()
        if self.fetches_service is not None:
            self.fetches_service.close()  # followers' long polls answer now, not at their wait's end
            self.log_waits.close()  # and clients' FetchLog long polls
        if self.lookups is not None:
            self.lookups.stop()
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()
        if self.keeper is not None:
            self.keeper.stop()
        if self.isr_keeper is not None:
            self.isr_keeper.stop()
        if self.lease_renewer is not None:
            self.lease_renewer.stop()
        if self.step_down is not None:
            self.step_down.stop()
        if self.fetchers is not None:
            self.fetchers.stop()
        if self.zk is not None:
            try:
                self.zk.delete(zkpaths.tablet_server(self.server_id))
            except Exception:
                pass
            self.zk.stop()
            self.zk.close()
        if self.replicas is not None:
            self.replicas.close()  # ends every bucket's scan sessions first
        if self.scans is not None:
            self.scans.close()
        if self.admin is not None:
            self.admin.close()
        if getattr(self, "security", None) is not None:
            self.security.stop()

    # -- ZooKeeper -------------------------------------------------------------------------

    def _active_coordinator(self) -> str:
        try:
            data, _ = self.zk.get(zkpaths.ACTIVE)
            return (loads(data) or {}).get("address", "")
        except Exception:  # no active coordinator right now
            return ""

    def _zk_coordinator_epoch(self) -> int:
        """The active coordinator's epoch as ZooKeeper has it now (``/coordinators/epoch``; its data
        names the epoch its version fences; 0: no coordinator was ever elected)."""
        try:
            self.zk.sync(zkpaths.EPOCH)  # read what the quorum has, not a lagging server's view
            data, stat = self.zk.get(zkpaths.EPOCH)
        except NoNodeError:
            return 0
        except Exception as exc:  # connection loss and the like: the coordinator retries its push
            raise errors.NetworkError(f"cannot read the coordinator epoch from ZooKeeper: {exc!r}") from None
        try:
            return int((loads(data) or {}).get("epoch", stat.version))
        except (ValueError, TypeError, AttributeError):
            return stat.version

    def _zk_table_gone(self, physical_id: int) -> bool:
        """ZooKeeper has no ``/tables/{physical_id}``: the table, or the partition (the coordinator keeps a
        partition's node by its id), was dropped (ids are never reused)."""
        path = zkpaths.table(physical_id)
        try:
            self.zk.sync(path)
            return self.zk.exists(path) is None
        except Exception as exc:
            raise errors.NetworkError(f"cannot learn from ZooKeeper whether table (or partition) {physical_id} "
                                      f"exists: {exc!r}") from None

    def _zk_partition_table(self, partition_id: int) -> int | None:
        """The id of the table ZooKeeper has partition ``partition_id`` of (its ``/tables/{partition_id}`` node
        names it); None if it has no such partition (no node, or a table's)."""
        path = zkpaths.table(partition_id)
        try:
            self.zk.sync(path)
            data, _stat = self.zk.get(path)
        except NoNodeError:
            return None
        except Exception as exc:
            raise errors.NetworkError(f"cannot learn from ZooKeeper whether partition {partition_id} exists: "
                                      f"{exc!r}") from None
        node = loads(data) or {}
        is_partition = isinstance(node, dict) and node.get("partition_id") == partition_id
        return node.get("table_id") if is_partition and isinstance(node.get("table_id"), int) else None

    def _remove_dropped_tables(self) -> None:
        try:
            self.replicas.remove_dropped_tables()
        except errors.KvLeaseError as exc:  # tried again at the next registration
            log.warning("cannot remove the data of dropped tables: %s", exc)

    def _remove_stray_copies(self) -> None:
        """After the first push this process took since it registered in ZooKeeper (at start, and again
        in each new session after a lost one; a role listener: it runs after every push taken whole, i.e.
        from a confirmed coordinator epoch; before any push it does nothing), delete the copies of buckets
        moved off this server while it was down or cut off (``ReplicaManager.remove_stray_copies``); a
        ZooKeeper error tries again after the next push.

        Once per registration, not on every push: a server registered hears of every move through
        ``removed``; one whose session was lost was no live server to the coordinator, which tells no
        such server anything, so a move completed meanwhile is learnt only from the push that follows its
        registration. At start no stray bucket was ever opened by this process; after a lost session the
        push has closed the buckets it no longer holds before this runs (writes, fetches and snapshots of
        them ended, as for ``removed``). On every push a push built from a coordinator's passing mistake
        would delete data at once, and each push would cost a listing of the data dir."""
        registration = self._registrations
        if self._strays_checked == registration:
            return
        try:
            choice = self.replicas.remove_stray_copies()
        except OSError as exc:  # an unreadable data dir: the push stands, tried again after the next one
            log.warning("cannot look for stray bucket copies: %s", exc)
            return
        if choice is not None and not choice.unchecked:
            self._strays_checked = registration

    def _register_at_start(self) -> None:
        """Register; a node left by this server's previous life (kill -9) goes away when
        its session expires, so wait up to twice the session timeout for that."""
        deadline = time.monotonic() + 2 * self.config[cfg.ZK_SESSION_TIMEOUT] / 1000.0 + 1.0
        while True:
            try:
                self._register()
                self._remove_dropped_tables()
                return
            except errors.KvLeaseError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _register(self) -> None:
        path = zkpaths.tablet_server(self.server_id)
        self.zk.ensure_path(zkpaths.TABLET_SERVERS)
        self.zk.ensure_path(zkpaths.tablet_demotions(self.server_id))  # before it is live: the coordinator bumps it
        data = dumps({"address": self.address, "incarnation": self.incarnation,
                      "max_buckets": self.config[cfg.TABLET_MAX_BUCKETS], "dir_id": self.dir_id,
                      "lease_ms": self.lease_ms})
        while True:
            try:
                self.zk.create(path, data, ephemeral=True)
                self._registrations += 1  # a new session: the next push looks for stray copies again
                return
            except NodeExistsError:
                try:
                    current, stat = self.zk.get(path)
                except NoNodeError:  # a previous life's node expired between the two calls: create again
                    continue
            if stat.ephemeralOwner == self.zk.client_id[0]:
                return  # ours already
            raise errors.KvLeaseError(
                f"tablet server id {self.server_id} is already registered by another live process "
                f"({(loads(current) or {}).get('address')})")

    def _on_zk_state(self, state: str) -> None:
        if state == KazooState.LOST and not self._stopping.is_set():  # stop() ends the session itself
            log.warning("ZooKeeper session lost: registering again once reconnected")
            self._register_needed.set()

    def _registrar(self) -> None:
        while not self._stopping.is_set():
            self._register_needed.wait()
            if self._stopping.is_set():
                return
            try:
                if self.zk.connected:
                    self._register()
                    self._register_needed.clear()
                    self._remove_dropped_tables()
                    continue
            except (errors.KvLeaseError, NoNodeError, Exception) as exc:  # retried below
                log.warning("registration failed: %s", exc)
            self._stopping.wait(0.5)


class SnapshotRounds(Periodic):
    """Every ``kv.snapshot.interval``: snapshot the buckets that changed, then report the log ends (a round
    that raises, a full disk's, is logged and the next one runs on time)."""

    name = "snapshot-timer"

    def __init__(self, interval_s: float, replicas: ReplicaManager, log_ends: lost_data.LogEndReporter) -> None:
        super().__init__(interval_s)
        self.replicas = replicas
        self.log_ends = log_ends

    def run_once(self) -> int:
        self.replicas.snapshot_changed()
        self.log_ends.run_once()
        return 0
