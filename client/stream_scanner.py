"""Live KV scans over one server-streaming ScanKvStream call (the contract is :mod:`kvlease.client.scanner`'s)."""

from __future__ import annotations

from typing import Any

import grpc

from kvlease.common import errors
from kvlease.common.proto import tablet_pb2 as pb
from kvlease.common.tables import TableInfo
from kvlease.common.wire import error_from_pb
from kvlease.client.routing import REROUTE
from kvlease.client.scanner import SESSION_LOST, BucketScanner
from kvlease.client.transport import rpc_error


class KvStreamScanner(BucketScanner):
    """One bucket through one server-streaming ScanKvStream call (same options as KvBatchScanner).

    The server pushes batches as gRPC flow control allows; closing early
    cancels the call, which ends the session. A stream has no replay: a
    transport failure mid-stream is a lost session (resumable after
    ``resume_key`` with ``resume=True``). The call has no deadline.
    """

    def __init__(self, route, table: TableInfo, bucket: int = 0, **options: Any) -> None:
        """``options`` as :class:`kvlease.client.scanner.BucketScanner` takes them."""
        self._call = None
        self._address = ""
        super().__init__(route, table, bucket, **options)

    def _open_scan(self, start_after_key: bytes | None, limit: int | None) -> Any:
        request = pb.ScanKvStreamRequest(bucket_scan_req=self._scan_req(start_after_key, limit),
                                         batch_size_bytes=self.batch_size_bytes)

        def attempt():
            address, stub = self._route.leader()
            call = stub.ScanKvStream(request)
            try:
                response = next(call)
            except StopIteration:
                raise errors.UnknownServerError(f"ScanKvStream to {address} ended without a response") from None
            except grpc.RpcError as exc:
                call.cancel()
                error = rpc_error(exc, "ScanKvStream", address, timeout_s=None, idempotent=True)
                if isinstance(error, REROUTE):
                    self._route.stale()
                raise error from None
            error = error_from_pb(response.error)
            if error is not None:
                call.cancel()
                if isinstance(error, REROUTE):
                    self._route.stale()
                raise error
            return address, call, response

        self._address, self._call, response = self._retry.retrying(errors.RETRIABLE)(attempt)
        if self.log_offset is None and response.HasField("log_offset"):
            self.log_offset = response.log_offset
        return response

    def _request_next(self) -> None:
        pass  # the server keeps sending

    def _next_response(self) -> Any:
        if self._pending_first is not None:
            response, self._pending_first = self._pending_first, None
            return response
        try:
            response = next(self._call)
        except StopIteration:
            error = errors.UnknownServerError(f"ScanKvStream from {self._address} ended before the last batch")
            return self._session_lost_or_raise(error)
        except grpc.RpcError as exc:
            return self._session_lost_or_raise(rpc_error(exc, "ScanKvStream", self._address, timeout_s=None, idempotent=True))
        error = error_from_pb(response.error)
        if error is None:
            return response
        return self._session_lost_or_raise(error)

    def _session_lost_or_raise(self, error: errors.KvLeaseError) -> Any:
        return self._session_lost(error) if isinstance(error, SESSION_LOST) else self._fail(error)

    def _end(self, server_closed: bool, wait: bool = True) -> None:
        self._pending_first = None
        call, self._call = self._call, None
        if call is not None and not server_closed:
            call.cancel()
