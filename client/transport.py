"""How every client talks to a server: channels, the one retry policy, gRPC failures as kvlease errors.

- :class:`Channels` keeps one gRPC channel per server address (thread-safe).
- :class:`RetryPolicy` is the one retry object (model: kazoo's ``KazooRetry``):
  bounded exponential backoff with full jitter that never sleeps past its
  budget; the errors it retries are one tuple, :data:`RETRIABLE`; the sleep is
  injected so tests move no real clock.
- :func:`rpc_error` maps a failed gRPC call to the project's typed error, at
  this boundary only.
- :class:`UnknownOutcomes` keeps giving up on a call from hiding an attempt
  whose outcome is unknown.
"""

from __future__ import annotations

import contextlib
import numbers
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import grpc
import tenacity

from kvlease.client.lookup_port import LookupPorts
from kvlease.common import errors
from kvlease.common.redaction import protect
from kvlease.common.security.grpc_auth import with_credentials
from kvlease.common.tls import TlsFiles

from kvlease.common.limits import GRPC_MESSAGE_OPTIONS, MAX_MESSAGE_BYTES  # noqa: F401 (MAX_MESSAGE_BYTES: re-exported)

GRPC_OPTIONS = (
    *GRPC_MESSAGE_OPTIONS,  # the same sizes as every server's
    ("grpc.enable_retries", 0),  # RetryPolicy retries, after refreshing the routing
    # a restarted server is found again within a second, not after gRPC's default backoff (up to 2 min)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
#: What gRPC reports when TLS does not match: a TLS server closes a plaintext connection (and, under mutual
#: TLS, one without a client certificate) right away; a TLS client fails its handshake with a plaintext server.
_TLS_HINTS = re.compile(r"socket closed|handshake|ssl", re.IGNORECASE)
#: The handshake failed because this client did not accept the server's certificate (OpenSSL/BoringSSL's
#: words for it): the same however often it is tried.
_CERT_REJECTED = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate signature failure|unable to get local issuer "
                            r"certificate|self.signed certificate|certificate has expired", re.IGNORECASE)
#: What a client retries: every error a later attempt may not meet (see common.errors).
RETRIABLE: tuple[type[BaseException], ...] = errors.RETRIABLE


class Channels:
    """One gRPC channel per address, created on first use; ``close`` closes them all.

    With ``tls`` (see :meth:`kvlease.common.tls.TlsFiles.from_config`) every channel is
    a TLS channel verifying the server against the CA; this is the one place
    kvlease makes a channel to a coordinator or tablet server.
    """

    def __init__(self, options: tuple = GRPC_OPTIONS, *, tls: TlsFiles | None = None,
                 credentials: tuple[str, str] | None = None, lookup_ports: bool = True) -> None:
        self._options = list(options)
        self.tls = tls
        self.credentials = credentials  # (username, password) sent on every call
        protect([credentials[1]] if credentials else [])
        self._credentials = tls.channel_credentials() if tls is not None else None
        self._channels: dict[str, tuple[grpc.Channel, grpc.Channel]] = {}  # address -> (raw, with credentials)
        #: (address, stub class) -> stub: a stub builds a callable per method, too dear to make per call
        self._stubs: dict[tuple[str, Any], Any] = {}
        self._lock = threading.Lock()
        #: Tablet servers' lookup ports (client/lookup_port.py), if ``lookup_ports``: only for a client without TLS
        #: and users, as the port has neither
        self.lookup_ports = LookupPorts() if lookup_ports and tls is None and credentials is None else None

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            pair = self._channels.get(address)
            if pair is None:
                if self._credentials is None:
                    raw = grpc.insecure_channel(address, options=self._options)
                else:
                    raw = grpc.secure_channel(address, self._credentials, options=self._options)
                channel = raw if self.credentials is None else with_credentials(raw, *self.credentials)
                pair = self._channels[address] = (raw, channel)
            return pair[1]

    def stub(self, address: str, stub_class: Callable[[grpc.Channel], Any]) -> Any:
        stub = self._stubs.get((address, stub_class))
        if stub is None:
            channel = self.get(address)
            with self._lock:
                if self._channels.get(address, (None, None))[1] is not channel:
                    return stub_class(channel)  # closed meanwhile: not kept
                stub = self._stubs.setdefault((address, stub_class), stub_class(channel))
        return stub

    def addresses(self) -> list[str]:
        """The addresses a channel is open to."""
        with self._lock:
            return sorted(self._channels)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
            self._stubs = {}
        for raw, _channel in channels:
            raw.close()
        if self.lookup_ports is not None:
            self.lookup_ports.close()


@dataclass(frozen=True)
class RetryPolicy:
    """Retry for ``total_s`` in all, waiting ``0.05 * 2**n`` s with full jitter, at most ``max_wait_s``.

    It never sleeps past the budget: an attempt that would only start after
    ``total_s`` is not made, and the last error is raised as it was.
    """

    total_s: float = 30.0
    max_wait_s: float = 2.0
    sleep: Callable[[float], None] = tenacity.nap.sleep

    def retrying(self, retry_on: tuple[type[BaseException], ...] = RETRIABLE,
                 stop_event: threading.Event | None = None) -> tenacity.Retrying:
        """A tenacity ``Retrying`` for one operation (call it with the function and its arguments)."""
        stop = tenacity.stop_before_delay(self.total_s)
        if stop_event is not None:
            stop = stop | tenacity.stop_when_event_set(stop_event)
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(retry_on),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=self.max_wait_s),
            stop=stop, sleep=self.sleep, reraise=True)

    def call(self, func: Callable[..., Any], *args: Any, retry_on: tuple[type[BaseException], ...] = RETRIABLE) -> Any:
        """``func(*args)``, retried on ``retry_on`` within the budget.

        The first attempt runs bare: most calls need no retry, and building a
        tenacity ``Retrying`` costs about as much as a small RPC's client side.
        Only a retriable failure sets one up, with the budget less the time
        already spent and the same waits as if it had run the first attempt.
        """
        start = time.monotonic()
        try:
            return func(*args)
        except retry_on as exc:
            first: list[BaseException] = [exc]

        def attempt(*call_args: Any) -> Any:
            if first:
                raise first.pop()  # the attempt already made: tenacity waits, then tries again
            return func(*call_args)
        return self.but(total_s=self.total_s - (time.monotonic() - start)).retrying(retry_on)(attempt, *args)

    def but(self, **changes: Any) -> "RetryPolicy":
        """A copy with some fields changed (``policy.but(total_s=0)``)."""
        return replace(self, **changes)


class UnknownOutcomes:
    """The attempts of one call whose outcome is unknown (sent, no answer), so that giving up on a call
    never hides one: an idempotent call is resent after an unknown outcome, and if a later attempt is then
    refused and the retries run out, the call may still have been applied by the earlier one."""

    def __init__(self) -> None:
        self.first: errors.OutcomeUnknownError | None = None

    def note(self, exc: errors.OutcomeUnknownError) -> None:
        self.first = self.first or exc

    def watch(self, attempt: Callable) -> Callable:
        """``attempt``, noting an OutcomeUnknownError it raises."""
        def watched(*args):
            try:
                return attempt(*args)
            except errors.OutcomeUnknownError as exc:
                self.note(exc)
                raise
        return watched

    def given_up(self, last: errors.KvLeaseError,
                 first: errors.OutcomeUnknownError | None = None) -> errors.KvLeaseError:
        """What to raise when the retries ran out with ``last``: an OutcomeUnknownError if an attempt's
        outcome was unknown (``first``, else the first one noted), naming it and ``last``; else ``last``."""
        first = first or self.first
        if first is None or isinstance(last, errors.OutcomeUnknownError):
            return last
        return errors.OutcomeUnknownError(f"{first.message}; sent again until the retries ran out, the last "
                                          f"answer: {last.message}", **last.details)


class TlsMismatchError(errors.InvalidRequestError):
    """The server speaks TLS and this client does not, or the other way round: no retry can help."""


class NotServedError(errors.UnknownServerError):
    """The server does not serve the method (gRPC UNIMPLEMENTED): another kind of server, or an older one."""


#: OpenSSL's reasons for a handshake answered in something other than TLS (a plaintext server). Not
#: RECORD_LAYER_FAILURE: from OpenSSL 3.2 on it also covers a bad record from a TLS server.
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})


def tls_mismatch(address: str, client_tls: bool, timeout_s: float = 1.0, *, client_cert: bool = True) -> str | None:
    """Whether the server at ``address`` speaks TLS where this client does not, or the other way round, or
    demands a client certificate (mutual TLS) that this client (``client_cert`` false) does not have: a TLS
    handshake tells (nothing verified; nothing sent after it, and the server, offered HTTP/2, either speaks
    first or closes a connection without a certificate). The problem in a sentence, or None when there is
    none or the probe cannot tell (the server is gone, or answered ambiguously)."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    wants_cert = False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw:
            with context.wrap_socket(raw) as conn:
                server_tls = True
                if client_tls and not client_cert:
                    wants_cert = _closed_at_once(conn)
    except ssl.SSLError as exc:
        if exc.reason not in _NOT_TLS_REASONS:
            return None
        server_tls = False
    except (OSError, ValueError):
        return None
    if server_tls and not client_tls:
        return ("it speaks TLS and this client does not: give the cluster's CA (--ca-file, "
                "security.tls.ca-file) and, under mutual TLS, a client certificate and key")
    if client_tls and not server_tls:
        return "it does not speak TLS and this client does: drop the TLS settings, or turn TLS on in the cluster"
    if wants_cert:
        return ("it requires a client certificate (mutual TLS) and this client has none: give --cert-file PEM "
                "--key-file PEM (security.tls.cert-file, security.tls.key-file; a `kvlease cluster start --secure` "
                "directory D has them as D/certs/client.pem and D/certs/client-key.pem)")
    return None


def _closed_at_once(conn: ssl.SSLSocket) -> bool:
    """Whether a server closed the TLS connection ``conn`` (no client certificate given) instead of
    sending its HTTP/2 preface: under TLS 1.3 that is how a server demanding a client certificate answers."""
    try:
        return conn.recv(1) == b""
    except TimeoutError:  # a server that waits for the client to speak first: it took the connection
        return False
    except OSError:  # an alert (e.g. certificate required) or a reset: refused
        return True


def is_int(value: object) -> bool:
    """Whether a caller's argument is a whole number (an int or a numpy integer), a bool not counting as one."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@contextlib.contextmanager
def arguments(call: str):
    """A request built from a caller's arguments: what protobuf refuses (a float where an int goes, a
    number out of its field's range, ...) is InvalidRequestError naming the call, not a raw exception."""
    try:
        yield
    except (TypeError, ValueError, OverflowError) as exc:
        raise errors.InvalidRequestError(f"{call}: bad argument: {exc}") from None


def rpc_error(exc: grpc.RpcError, method: str, address: str, *, timeout_s: float | None,
              idempotent: bool, peer: str = "tablet server", tls: bool | None = None,
              client_cert: bool = True) -> errors.KvLeaseError:
    """The typed error for a gRPC call to ``peer`` at ``address`` that failed in transport.

    UNAVAILABLE is a retriable :class:`~kvlease.common.errors.NetworkError`; a deadline
    is one too for an ``idempotent`` call and :class:`~kvlease.common.errors.OutcomeUnknownError`
    otherwise (it may have been applied), and so is CANCELLED: a call this client
    never cancels ends so when its server drops it as it stops (a gRPC server stopping
    answers ``CANCELLED`` to calls that reach it at that moment; a rolling restart
    or a stopped tablet server must not fail a call that its retry would carry to
    the new leader); a message over the size limit is an
    invalid request; anything else an unknown server error. With ``tls`` (whether
    this client speaks TLS; ``client_cert``: whether it has a client certificate)
    an UNAVAILABLE that looks like a TLS mismatch is checked with :func:`tls_mismatch`,
    and a proven one (a missing client certificate included) is a
    :class:`TlsMismatchError` at once instead of retries.
    """
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
    last = details.split("last error: ")[-1]  # gRPC's own words for what went wrong
    if code == grpc.StatusCode.UNAVAILABLE and _CERT_REJECTED.search(details):
        return TlsMismatchError(  # the same answer however often it is asked: not retried
            f"cannot reach {peer} {address}: its certificate does not verify against this client's CA "
            f"(security.tls.ca-file / --ca-file): is it the CA of this cluster? ({last})")
    if (code == grpc.StatusCode.UNAVAILABLE and _TLS_HINTS.search(details)
            and "Stream removed" not in details):  # a stream that broke had connected: its server went away
        why = tls_mismatch(address, tls, client_cert=client_cert) if tls is not None else None
        if why is not None:
            return TlsMismatchError(f"cannot reach {peer} {address}: {why}")
        return errors.NetworkError(
            f"cannot reach {peer} {address}: UNAVAILABLE ({last}); is it a TLS "
            "mismatch? (a TLS server closes plaintext connections and, under mutual TLS, those without a client "
            "certificate it accepts: check security.enabled and security.tls.* on both sides)", address=address)
    if code == grpc.StatusCode.UNAVAILABLE:
        return errors.NetworkError(f"cannot reach {peer} {address}: UNAVAILABLE ({last or 'no details'})",
                                   address=address)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        after = f" after {timeout_s:g}s" if timeout_s else ""
        if idempotent:
            return errors.NetworkError(f"{method} to {peer} {address} timed out{after}", address=address)
        return errors.OutcomeUnknownError(f"{method} to {peer} {address} timed out{after}; "
                                          "it may or may not have been applied", address=address)
    if code == grpc.StatusCode.CANCELLED:  # the server dropped the call (it stops): the docstring says why
        if idempotent:
            return errors.NetworkError(f"{method} to {peer} {address} was cancelled by the server ({details})",
                                       address=address)
        return errors.OutcomeUnknownError(f"{method} to {peer} {address} was cancelled by the server ({details}); "
                                          "it may or may not have been applied", address=address)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.InvalidRequestError(f"{method} to {address}: message too large ({details}); "
                                          "send smaller batches")
    if code == grpc.StatusCode.UNIMPLEMENTED:  # e.g. a tablet server's port given as a coordinator's
        return NotServedError(
            f"{method} to {peer} {address} failed: UNIMPLEMENTED: {address} does not serve {method}; is it a "
            f"{peer}'s address? (coordinators and tablet servers listen on different ports; an older server may "
            f"lack the call)", address=address)
    name = code.name if code is not None else "?"
    return errors.UnknownServerError(f"{method} to {peer} {address} failed: {name}: {details}", address=address)
