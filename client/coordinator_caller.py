"""The one way to the active coordinator: :class:`CoordinatorCaller` sends every coordinator call.

It owns the gRPC channels (one per coordinator address), finds the active
coordinator from a bootstrap list, follows ``NOT_COORDINATOR`` answers to the
address they name, and retries retriable errors with
:class:`kvlease.client.transport.RetryPolicy` (bounded exponential backoff with
jitter). Which calls are resent after a lost answer is decided here, by name
(:data:`READS`, :data:`IDEMPOTENT`). Every failure is raised as a
:mod:`kvlease.common.errors` exception.

The admin client (:class:`kvlease.client.admin.AdminClient`) owns one; its parts
(users and ACLs, moves, data loss, health) and a tablet server's own calls
(:class:`kvlease.client.server_calls.ServerCalls`) are given its :meth:`CoordinatorCaller.call`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, Sequence

import grpc

from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.proto import coordinator_pb2 as pb
from kvlease.common.proto import coordinator_pb2_grpc as pb_grpc
from kvlease.common.security.client import credentials
from kvlease.common.tls import TlsFiles
from kvlease.common.wire import error_from_pb, raise_for
from kvlease.client.admin_types import CoordinatorInfo
from kvlease.client.bootstrap import parse_bootstrap, refuse_path
from kvlease.client.transport import RETRIABLE, Channels, RetryPolicy, UnknownOutcomes, rpc_error

#: Coordinator calls that change nothing: one that timed out is simply asked again.
READS = frozenset({
    "GetTable", "GetTableAssignment", "ListTables", "ListTabletServers", "GetLatestKvSnapshots", "ListKvSnapshots",
    "ListKvSnapshotLeases", "DescribeKvSnapshotLease", "ListUsers", "ListAcls", "ListReassignments",
    "ListPartitions", "GetSchemaHistory",
})

#: Coordinator calls whose retry after a lost answer has the same outcome: reads, and the lease
#: calls (acquire and renew set the same snapshots and a deadline from now; release and drop of
#: what is already gone answer false). Table DDL and snapshot commits are not resent blindly.
IDEMPOTENT = READS | frozenset({
    "AcquireKvSnapshotLease", "AcquireKvSnapshotLeases", "RenewKvSnapshotLease", "ReleaseKvSnapshotLease",
    "DropKvSnapshotLease",
    # SecurityService: AddUser of a user that exists with the same password answers created=false,
    # the others answer false when nothing changed (see coordinator/security_service.py)
    "AddUser", "RemoveUser", "AddAcl", "RemoveAcl",
    # replication (a tablet server's calls, client/server_calls.py): an AlterIsr resent after its answer was lost
    # finds the ISR it asked for and answers it; a controlled shutdown sent again moves what is left; a
    # resignation resent finds the leadership over and answers the bucket's state
    "AlterIsr", "ControlledShutdown", "ResignLeadership",
    # moves (client/moves_admin.py): the same target answers the move in progress, a decommission the moves off
    # the server, a rebalance of a balanced cluster starts nothing, a recommission of one not marked answers false
    "ReassignBucket", "DecommissionTablet", "RecommissionTablet", "Rebalance",
    # partitions (client/partitions_admin.py): an alter to the settings the table has changes nothing; a schema
    # change (client/schemas_admin.py) sent again finds itself made and answers the table (common/schema_changes.py)
    "AlterTable",
})

#: Calls that are idempotent when their request says so: a create of a partition that may exist (a writer's
#: dynamic creation: the partition there is answered).
IDEMPOTENT_IF = {"CreatePartition": lambda request: request.ignore_if_exists}

#: What an idempotent call also retries: an unknown outcome, the client's (its deadline passed) or the
#: coordinator's own (its ZooKeeper connection dropped during the write, or it did not answer in time;
#: it steps down): the call is sent again to whoever is active then.
RETRIABLE_IF_IDEMPOTENT = RETRIABLE + (errors.OutcomeUnknownError,)


class CoordinatorCall(Protocol):
    """What the parts built on a caller are given: :meth:`CoordinatorCaller.call` (or a stand-in in tests)."""

    def __call__(self, method: str, request, stub_class: type = ...,
                 answered: tuple[type[errors.KvLeaseError], ...] = ...) -> Any: ...


class CoordinatorCaller:
    """Thread-safe; one gRPC channel per coordinator address. ``with`` closes it."""

    def __init__(self, bootstrap: str | Sequence[str], config: cfg.Config | None = None, *,
                 request_timeout_s: float | None = None, retry_total_s: float | None = None,
                 locate: Callable[[], str] | None = None, owner: str = "coordinator caller") -> None:
        """``bootstrap``: coordinator addresses, ``"host:port[,host:port…]"`` or a list (a cluster directory
        is refused). ``config``: TLS and credentials (``security.*``), timeouts; ``locate`` (optional) names
        the active coordinator's address now (e.g. from ZooKeeper); it is asked whenever the current address
        is unreachable. ``owner``: what a call after :meth:`close` names as closed (``this AdminClient is
        closed``)."""
        config = config or cfg.Config(env={})
        self._locate = locate
        refuse_path(bootstrap)
        self._bootstrap = parse_bootstrap(bootstrap)
        self._address = self._bootstrap[0]
        self._next_bootstrap = 1
        self.timeout_s = request_timeout_s or config[cfg.CLIENT_REQUEST_TIMEOUT] / 1000.0
        self.retry = RetryPolicy(retry_total_s if retry_total_s is not None else config[cfg.CLIENT_RETRY_TOTAL] / 1000.0,
                                 config[cfg.CLIENT_RETRY_MAX_WAIT] / 1000.0)
        self.tls = TlsFiles.from_config(config)  # None: plaintext
        self.credentials = credentials(config)  # None: security off, or the mutual-TLS certificate identifies us
        self._channels = Channels(tls=self.tls, credentials=self.credentials)
        self._owner = owner
        self._closed = False
        self._lock = threading.Lock()

    @property
    def bootstrap(self) -> list[str]:
        """The coordinator addresses this caller was given."""
        return list(self._bootstrap)

    @property
    def address(self) -> str:
        """The coordinator address requests currently go to."""
        return self._address

    def close(self) -> None:
        """Close its channels (idempotent); a call after it is InvalidRequestError."""
        self._closed = True
        self._channels.close()

    def __enter__(self) -> "CoordinatorCaller":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_open(self) -> None:
        """InvalidRequestError once closed (else a call would open new channels that nothing closes again)."""
        if self._closed:
            raise errors.InvalidRequestError(f"this {self._owner} is closed")

    def stub(self, address: str, stub_class: type = pb_grpc.CoordinatorServiceStub):
        """The ``stub_class`` stub of ``address``'s channel."""
        return self._channels.stub(address, stub_class)

    def move_to(self, error: errors.KvLeaseError, tried: str) -> None:
        """After ``error`` from ``tried``: go to the address it names, else the one ``locate`` names, else the
        next bootstrap address (unless another thread moved on already)."""
        with self._lock:
            if self._address != tried:
                return  # another thread already moved on
            active = getattr(error, "active_address", "") or (self._locate() if self._locate else "")
            if active and active != tried:
                self._address = active
            else:
                self._address = self._bootstrap[self._next_bootstrap % len(self._bootstrap)]
                self._next_bootstrap += 1

    def _rpc_error(self, exc: grpc.RpcError, method: str, address: str, idempotent: bool) -> errors.KvLeaseError:
        return rpc_error(exc, method, address, timeout_s=self.timeout_s, idempotent=idempotent, peer="coordinator",
                         tls=self.tls is not None, client_cert=self.tls is not None and self.tls.cert is not None)

    def call_once(self, method: str, request, stub_class: type = pb_grpc.CoordinatorServiceStub,
                  answered: tuple[type[errors.KvLeaseError], ...] = ()):
        """One call to the current address, never retried; ``answered``: errors returned in the response (for
        the caller to read with its other fields) instead of raised."""
        self.check_open()
        address = self._address
        try:
            response = getattr(self.stub(address, stub_class), method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            # a change that timed out may have been applied (OutcomeUnknownError): resent only if applying
            # it twice gives the same outcome (IDEMPOTENT); otherwise the caller decides. A read is asked again.
            err = self._rpc_error(exc, method, address, idempotent=method in READS)
            if isinstance(err, (errors.NetworkError, errors.OutcomeUnknownError)):
                self.move_to(err, address)
            raise err from None
        if answered and isinstance(error_from_pb(response.error), answered):
            return response
        try:
            raise_for(response.error)
        except (errors.NotCoordinatorError, errors.CoordinatorFencedError) as exc:
            self.move_to(exc, address)
            raise errors.NotCoordinatorError(exc.message, active_address=getattr(exc, "active_address", "")) from None
        except errors.ZooKeeperUnavailableError as exc:  # another coordinator of the list may reach it
            self.move_to(exc, address)
            raise
        except errors.OutcomeUnknownError as exc:  # the coordinator's own: named like a call that timed out
            said = "may or may not" in exc.message or method in READS  # a read changes nothing
            applied = "" if said else "; it may or may not have been applied"
            raise errors.OutcomeUnknownError(f"{method} to coordinator {address}: {exc.message}{applied}",
                                             **exc.details) from None
        return response

    def call(self, method: str, request, stub_class: type = pb_grpc.CoordinatorServiceStub,
             answered: tuple[type[errors.KvLeaseError], ...] = ()):
        """``method`` of the active coordinator's service ``stub_class`` (default CoordinatorService), retried
        while retriable (an unknown outcome only for :data:`IDEMPOTENT` calls); ``answered``: errors returned
        in the response instead of raised (see :meth:`call_once`)."""
        idempotent = method in IDEMPOTENT or (method in IDEMPOTENT_IF and IDEMPOTENT_IF[method](request))
        retry_on = RETRIABLE_IF_IDEMPOTENT if idempotent else RETRIABLE
        unknown = UnknownOutcomes()
        attempt = self.call_once if method in READS else unknown.watch(self.call_once)
        try:
            return self.retry.call(attempt, method, request, stub_class, answered, retry_on=retry_on)
        except RETRIABLE as exc:
            raise unknown.given_up(exc) from None

    def coordinator_info(self, address: str | None = None) -> CoordinatorInfo:
        """What ``address`` (default: the current one) says about itself; never retried."""
        self.check_open()
        target = address or self._address
        try:
            response = self.stub(target).CoordinatorInfo(pb.CoordinatorInfoRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._rpc_error(exc, "CoordinatorInfo", target, idempotent=True) from None
        raise_for(response.error)
        return CoordinatorInfo(response.address, response.active, response.active_address, response.epoch,
                               response.remote_data_dir, response.s3_endpoint, response.s3_region)
