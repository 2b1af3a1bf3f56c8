"""The coordinator process: gRPC endpoint, HA election, epoch, reinitialization.

Every coordinator serves gRPC. All of them join kazoo's Election recipe; the
winner bumps ``/coordinators/epoch`` (its version is the fencing token),
publishes ``/coordinators/active``, reinitializes from ZooKeeper + remote
storage, and only then serves. It steps down when its ZooKeeper session is
lost or a write finds the epoch moved (another coordinator took over), and
joins the election again.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import grpc
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from kvlease.common import config as cfg
from kvlease.common import errors, zkpaths
from kvlease.common.limits import GRPC_SERVER_OPTIONS
from kvlease.common.redaction import protect
from kvlease.common.proto import coordinator_pb2_grpc as pb_grpc
from kvlease.common.proto import security_pb2_grpc as security_pb_grpc
from kvlease.common.security.client import internal_credentials
from kvlease.common.security.server import server_security
from kvlease.common.storage import RemoteStorage, open_storage
from kvlease.common.tls import TlsFiles, add_port
from kvlease.common.zk import dumps, loads, make_client
from kvlease.coordinator.controller import Controller, LeaderRebalance
from kvlease.coordinator.fencing import FencedWriter, bump_epoch
from kvlease.coordinator.loop import EventLoop
from kvlease.coordinator.metrics import CoordinatorMetrics
from kvlease.coordinator.notifier import LeadershipNotifier
from kvlease.coordinator.orphan_files import orphan_timing
from kvlease.coordinator import requests as rq
from kvlease.coordinator.security_service import SecurityService
from kvlease.coordinator.service import INTERNAL_METHODS, CoordinatorService
from kvlease.leases.mirror import LeaseMirror
from kvlease.leases.store import LEASE_FILES

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class CoordinatorServer:
    def __init__(self, config: cfg.Config, clock_ms: Callable[[], int] = wall_clock_ms,
                 storage: RemoteStorage | None = None) -> None:
        self.config = config
        protect(config.secrets())  # out of every log line and error message of this process
        self.storage = storage
        self.clock_ms = clock_ms
        self.metrics = CoordinatorMetrics()
        self.metrics_port: int | None = None
        self.address = ""
        self.epoch = 0
        self.active_address = ""
        self._state = "standby"  # standby | initializing | active
        self._loop: EventLoop | None = None
        self._step_down = threading.Event()
        self._stopping = threading.Event()
        self._election = None
        self._lock = threading.Lock()
        self.zk = None
        self._grpc = None
        self._thread: threading.Thread | None = None
        self.reinit_stats: dict = {}
        self._mirror: LeaseMirror | None = None  # a standby's warm copy of the leases

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> "CoordinatorServer":
        c = self.config
        self.tls = TlsFiles.from_config(c, server=True)  # a bad file is refused before anything starts
        self.security = server_security(c)
        self.internal_credentials = internal_credentials(c)  # how this coordinator calls tablet servers
        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=c[cfg.COORDINATOR_RPC_THREADS],
                                                    thread_name_prefix="coordinator-rpc"),
                                 options=list(GRPC_SERVER_OPTIONS),  # the same message sizes as every client's
                                 interceptors=self.security.interceptors(INTERNAL_METHODS))
        pb_grpc.add_CoordinatorServiceServicer_to_server(
            CoordinatorService(self, timeout_s=c[cfg.CLIENT_REQUEST_TIMEOUT] / 1000.0, security=self.security),
            self._grpc)
        security_pb_grpc.add_SecurityServiceServicer_to_server(
            SecurityService(self, self.security, internal_user=c[cfg.INTERNAL_USERNAME]), self._grpc)
        host = c[cfg.COORDINATOR_HOST]
        port = add_port(self._grpc, c, cfg.COORDINATOR_HOST, cfg.COORDINATOR_PORT, self.tls)
        self.address = f"{host}:{port}"
        if c[cfg.METRICS_PORT] >= 0:
            try:
                self.metrics_port = self.metrics.serve(host, c[cfg.METRICS_PORT])
            except OSError as exc:  # metrics are not worth failing the coordinator for (as a tablet server)
                log.warning("no metrics endpoint on %s:%s: %s", host, c[cfg.METRICS_PORT], exc)
        if self.storage is None:
            self.storage = open_storage(c[cfg.REMOTE_DATA_DIR], c)
        self.zk = make_client(c)
        self.zk.add_listener(self._on_zk_state)
        self.security.start(self.zk)  # users and ACLs mirrored before the first call is served
        for path in zkpaths.ROOTS:
            self.zk.ensure_path(path)
        self.zk.DataWatch(zkpaths.ACTIVE, self._on_active_changed)
        self.zk.ChildrenWatch(zkpaths.TABLET_SERVERS, self._on_tablets_changed)
        self._start_mirror()
        self._grpc.start()
        self._thread = threading.Thread(target=self._campaign, name="coordinator-election", daemon=True)
        self._thread.start()
        log.info("coordinator %s started (metrics port %s)", self.address, self.metrics_port)
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._step_down.set()
        if self._election is not None:
            self._election.cancel()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._stop_mirror()
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        if getattr(self, "security", None) is not None:
            self.security.stop()
        self.metrics.close()

    def wait_active(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._state == "active":
                return True
            time.sleep(0.02)
        return False

    @property
    def is_active(self) -> bool:
        return self._state == "active"

    # -- what the service asks -----------------------------------------------------------

    def serving_loop(self) -> EventLoop:
        """The loop of the active coordinator; ZooKeeperUnavailableError first if this coordinator cannot reach
        ZooKeeper (it cannot write, and cannot know whether it still is the active one: nothing is served),
        then CoordinatorNotReadyError or NotCoordinatorError."""
        problem = self.zookeeper_problem()
        if problem is not None:
            raise errors.ZooKeeperUnavailableError(problem)
        loop = self._loop
        if self._state == "active" and loop is not None:
            return loop
        if self._state == "initializing":
            raise errors.CoordinatorNotReadyError("the coordinator is reinitializing", active_address=self.address)
        raise errors.NotCoordinatorError(f"{self.address} is a standby coordinator",
                                         active_address=self.active_address)

    def zookeeper_problem(self) -> str | None:
        """Why this coordinator cannot use ZooKeeper now (its connection is down), or None: the kazoo state, read."""
        if self.zk is None or self.zk.connected:
            return None
        return (f"coordinator {self.address} cannot reach ZooKeeper at {self.config[cfg.ZK_ADDRESS]} "
                f"({cfg.ZK_ADDRESS.name}; connection {str(self.zk.state).lower()}): nothing was done")

    def info(self) -> dict:
        active = self._state == "active"
        return {"active": active, "active_address": self.address if active else self.active_address,
                "epoch": self.epoch, "address": self.address, "remote_data_dir": self.config[cfg.REMOTE_DATA_DIR],
                "s3_endpoint": self.config[cfg.S3_ENDPOINT], "s3_region": self.config[cfg.S3_REGION]}

    # -- ZooKeeper callbacks (kazoo's thread: never block) -------------------------------------

    def _on_zk_state(self, state: str) -> None:
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost: stepping down")
            self._step_down.set()
        elif state == KazooState.CONNECTED:
            # kazoo's ChildrenWatch calls back after a reconnection only if the ids differ, so a tablet
            # server that restarted under its id meanwhile (a new incarnation) would go unnoticed
            self._on_tablets_changed(None)

    def _on_tablets_changed(self, _children) -> None:
        loop = self._loop
        if loop is not None and self._state == "active":
            loop.submit(rq.TabletServersChanged())

    def _on_active_changed(self, data, _stat) -> None:
        try:
            node = loads(data) if data else None
        except ValueError:
            node = None
        self.active_address = (node or {}).get("address", "")
        if node and node.get("address") != self.address:
            self.epoch = int(node.get("epoch", 0))

    # -- the election ---------------------------------------------------------------

    def _campaign(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self.zk.connected:
                    time.sleep(0.1)
                    continue
                self._step_down.clear()
                self._election = self.zk.Election(zkpaths.ELECTION, self.address)
                self._election.run(self._lead)
            except Exception as exc:  # session lost while waiting or leading: try again
                if not self._stopping.is_set():
                    log.warning("election round ended: %s", exc)
                    time.sleep(0.2)

    def _controller(self, notifier: LeadershipNotifier) -> Controller:
        """The controller of this process's term as the active coordinator, from its config."""
        c = self.config
        return Controller(self.zk, self.storage, num_retained=c[cfg.SNAPSHOT_NUM_RETAINED],
                          max_lease_ms=c[cfg.LEASE_MAX_DURATION], grace_ms=c[cfg.LEASE_FAILOVER_GRACE],
                          clock_ms=self.clock_ms, metrics=self.metrics, notify=notifier.push,
                          tls=self.tls, credentials=self.internal_credentials,
                          default_replication=(c[cfg.DEFAULT_REPLICATION_FACTOR], c[cfg.DEFAULT_MIN_INSYNC_REPLICAS]),
                          unclean_election=c[cfg.UNCLEAN_LEADER_ELECTION],
                          leader_rebalance=LeaderRebalance(c[cfg.AUTO_LEADER_REBALANCE],
                                                           c[cfg.LEADER_IMBALANCE_CHECK_INTERVAL],
                                                           c[cfg.LEADER_IMBALANCE_PER_SERVER_PERCENTAGE]),
                          leader_lease_ms=c[cfg.ZK_SESSION_TIMEOUT],  # a bound: a tablet's lease is shorter
                          orphans=orphan_timing(c), auto_partition_interval_ms=c[cfg.AUTO_PARTITION_CHECK_INTERVAL])

    def _start_loop(self, controller: Controller, notifier: LeadershipNotifier) -> EventLoop:
        """The event loop of this term, started; the notifier hands it the pushes tablet servers took
        (a new leader then serves without waiting out the old one's lease: coordinator/leader_leases.py)."""
        c = self.config
        loop = EventLoop(controller, max_batch=c[cfg.LOOP_MAX_BATCH], tick_interval_ms=c[cfg.LEASE_CHECK_INTERVAL],
                         on_fatal=self._on_fatal, metrics=self.metrics)
        loop.start()
        notifier.on_delivered = lambda server_id, seq: loop.submit(rq.PushDelivered(server_id, seq))
        notifier.on_undelivered = lambda server_id: loop.submit(rq.PushUndelivered(server_id))
        return loop

    def _lead(self) -> None:
        if self._stopping.is_set():
            return
        self._state = "initializing"
        controller = None
        notifier = None
        try:
            epoch, version = bump_epoch(self.zk)
            writer = FencedWriter(self.zk, version)
            self._publish_active(epoch, version)
            self.epoch = epoch
            log.info("coordinator %s elected, epoch %d: reinitializing", self.address, epoch)
            notifier = LeadershipNotifier(epoch, tls=self.tls, credentials=self.internal_credentials)
            controller = self._controller(notifier)
            with self._lock:
                mirror, self._mirror = self._mirror, None
            try:  # the mirror is exact once the epoch is bumped (no lease write can commit any more)
                self.reinit_stats = controller.reinitialize(writer, mirror=mirror, defer_orphans=True)
            finally:
                if mirror is not None:
                    log.info("lease mirror at election: %s", mirror.stats)
                    mirror.stop()  # the controller owns the leases now
            loop = self._start_loop(controller, notifier)
            loop.submit(rq.TabletServersChanged())  # learn the live servers and tell them what they lead
            threading.Thread(target=self._list_orphans, args=(loop,), name="orphan-lease-files",
                             daemon=True).start()
            self._loop = loop
            self._state = "active"
            self.metrics.active.set(1)
            self.metrics.epoch.set(epoch)
            if epoch > 1:
                self.metrics.failovers.inc()
            log.info("coordinator %s active (epoch %d)", self.address, epoch)
            self._step_down.wait()
        except Exception as exc:
            log.exception("coordinator %s could not lead: %s", self.address, exc)
        finally:
            self._state = "standby"
            self.metrics.active.set(0)
            loop, self._loop = self._loop, None
            if loop is not None:
                loop.stop(errors.NotCoordinatorError("the coordinator stepped down"))
            if notifier is not None:
                notifier.close()
            if controller is not None:
                controller.close()
            self._unpublish_active()
            if not self._stopping.is_set():
                self._start_mirror()
            log.info("coordinator %s stepped down", self.address)

    # -- the standby's lease mirror -------------------------------------------------------

    def _start_mirror(self) -> None:
        with self._lock:
            if self._mirror is None:
                self._mirror = LeaseMirror(self.zk, self.storage).start()

    def _stop_mirror(self) -> None:
        with self._lock:
            mirror, self._mirror = self._mirror, None
        if mirror is not None:
            mirror.stop()

    def _list_orphans(self, loop: EventLoop) -> None:
        """List the lease files off the loop; the loop deletes those no lease names (a barrier)."""
        try:
            listed = self.storage.list(LEASE_FILES)
        except errors.StorageError as exc:  # retried at the next failover
            log.warning("could not list lease files for orphans: %s", exc)
            return
        future = loop.submit(rq.RemoveOrphanLeaseFiles(tuple(listed)))
        future.add_done_callback(lambda f: f.exception() is None and log.info(
            "orphan lease files: %d of %d listed", len(f.result()), len(listed)))

    def _on_fatal(self, exc: Exception) -> None:
        log.error("coordinator %s stepping down: %s", self.address, exc)
        self._step_down.set()

    def _publish_active(self, epoch: int, version: int) -> None:
        data = dumps({"address": self.address, "epoch": epoch})
        for _attempt in range(2):
            txn = self.zk.transaction()
            txn.check(zkpaths.EPOCH, version)
            txn.create(zkpaths.ACTIVE, data, ephemeral=True)
            results = txn.commit()
            if not any(isinstance(r, Exception) for r in results):
                return
            if isinstance(results[1], NodeExistsError):  # ours from an earlier term of this session
                try:
                    self.zk.delete(zkpaths.ACTIVE)
                except NoNodeError:
                    pass
                continue
            raise errors.CoordinatorFencedError(f"could not publish the active coordinator: {results}")
        raise errors.CoordinatorFencedError("could not publish the active coordinator")

    def _unpublish_active(self) -> None:
        try:
            data, _ = self.zk.get(zkpaths.ACTIVE)
            if (loads(data) or {}).get("address") == self.address:
                self.zk.delete(zkpaths.ACTIVE)
        except Exception:  # session gone: the ephemeral node goes with it
            pass
