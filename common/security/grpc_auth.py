"""gRPC authentication: a server interceptor that turns ``username``/``password`` metadata into a principal,
and a client interceptor that adds that metadata to every call.

The server side answers a call without valid credentials in band, like every
other kvlease error: the method's response with ``error.code =
AUTHENTICATION_FAILED`` (a server-streaming method: a stream of that one
response), and the handler never runs. A method whose response has no
``error`` field (none today) is aborted with ``UNAUTHENTICATED``. Handlers
read the caller with :func:`current_principal`.
"""

from __future__ import annotations

import contextvars
from typing import Callable, Iterable

import grpc
from google.protobuf import descriptor_pool, message_factory

from kvlease.common.errors import AuthenticationFailedError, AuthorizationFailedError
from kvlease.common.wire import error_pb

USERNAME_KEY = "username"
PASSWORD_KEY = "password"
#: A password that is not printable ASCII (which is all an ASCII metadata value may hold) travels as its UTF-8
#: bytes in this binary metadata key instead (gRPC base64-encodes ``-bin`` values on the wire).
PASSWORD_BIN_KEY = "password-bin"


def _printable_ascii(text: str) -> bool:
    return all(" " <= c <= "~" for c in text)


def _password(metadata: dict) -> str | None:
    """The password a call carries (None: none, or bytes that are not UTF-8: authentication then fails)."""
    if PASSWORD_KEY in metadata:
        return metadata[PASSWORD_KEY]
    raw = metadata.get(PASSWORD_BIN_KEY)
    try:
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        return None

_PRINCIPAL: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvlease_principal", default=None)


def current_principal() -> str | None:
    """The authenticated principal of the call this handler serves (None outside an authenticated call)."""
    return _PRINCIPAL.get()


def _rejection(method: str, exc: AuthenticationFailedError | AuthorizationFailedError, streaming: bool) -> Callable:
    """A behavior that answers ``exc`` in band (or aborts UNAUTHENTICATED if the response cannot carry it)."""
    response_cls = None
    try:
        service, name = method.lstrip("/").rsplit("/", 1)
        descriptor = descriptor_pool.Default().FindServiceByName(service).methods_by_name[name]
        response_cls = message_factory.GetMessageClass(descriptor.output_type)
        if "error" not in descriptor.output_type.fields_by_name:
            response_cls = None
    except (KeyError, ValueError):
        pass

    def reject(request_or_iterator, context):
        if response_cls is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
        response = response_cls(error=error_pb(exc))
        return iter([response]) if streaming else response
    return reject


def _in_context(behavior: Callable, principal: str, streaming: bool) -> Callable:
    """``behavior`` run in its own context where :func:`current_principal` is ``principal``.

    A streaming handler's generator is advanced inside that context too (gRPC
    iterates it after the handler returned).
    """
    def run(request_or_iterator, context):
        ctx = contextvars.copy_context()
        ctx.run(_PRINCIPAL.set, principal)
        result = ctx.run(behavior, request_or_iterator, context)
        return _iterate_in(ctx, result) if streaming else result
    return run


def _iterate_in(ctx: contextvars.Context, iterator: Iterable):
    iterator = ctx.run(iter, iterator)
    while True:
        try:
            item = ctx.run(next, iterator)
        except StopIteration:
            return
        yield item


class AuthenticatingInterceptor(grpc.ServerInterceptor):
    """``authenticate(user, password, certificate_name) -> principal`` (or AuthenticationFailedError) on every call.

    ``certificate_name``: the common name of the client's verified certificate
    under mutual TLS, else None. ``exempt``: full method names served without
    credentials (e.g. a health check). ``internal``: full method names only
    ``is_internal(principal)`` may call; anyone else is answered
    ``AUTHORIZATION_FAILED`` and the handler never runs.
    """

    def __init__(self, authenticate: Callable[[str | None, str | None, str | None], str],
                 exempt: Iterable[str] = (), *, internal: Iterable[str] = (),
                 is_internal: Callable[[str], bool] = lambda _principal: False) -> None:
        self._authenticate = authenticate
        self._exempt = frozenset(exempt)
        self._internal = frozenset(internal)
        self._is_internal = is_internal

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method in self._exempt:
            return handler
        metadata = {key: value for key, value in (handler_call_details.invocation_metadata or ())}
        user, password = metadata.get(USERNAME_KEY), _password(metadata)
        streaming = handler.response_streaming
        internal_only = method in self._internal

        def wrap(behavior: Callable) -> Callable:
            def run(request_or_iterator, context):
                try:
                    principal = self._authenticate(user, password, certificate_name(context))
                    if internal_only and not self._is_internal(principal):
                        name = method.rsplit("/", 1)[-1]
                        raise AuthorizationFailedError(
                            f"{principal} may not call {name}: only the cluster's own principal may",
                            principal=principal, operation=name, resource="cluster")
                except (AuthenticationFailedError, AuthorizationFailedError) as exc:
                    return _rejection(method, exc, streaming)(request_or_iterator, context)
                return _in_context(behavior, principal, streaming)(request_or_iterator, context)
            return run
        return _replace(handler, wrap)


def certificate_name(context) -> str | None:
    """The common name of the peer's verified client certificate (mutual TLS), else None."""
    try:
        names = context.auth_context().get("x509_common_name")
    except (AttributeError, ValueError):
        return None
    return names[0].decode() if names else None


def _replace(handler: grpc.RpcMethodHandler, wrap: Callable[[Callable], Callable]) -> grpc.RpcMethodHandler:
    kinds = {
        (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
        (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
        (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
        (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
    }
    attr, make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(wrap(getattr(handler, attr)), request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, details: grpc.ClientCallDetails, metadata: list) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class CredentialsInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``username``/``password`` metadata to every call of a channel.

    The password travels in the clear unless the channel uses TLS: enable
    both together (``with_credentials`` does not check).
    """

    def __init__(self, username: str, password: str) -> None:
        secret = (PASSWORD_KEY, password) if _printable_ascii(password) else (PASSWORD_BIN_KEY, password.encode())
        self._metadata = ((USERNAME_KEY, username), secret)

    def _details(self, details):
        metadata = [item for item in (details.metadata or ())
                    if item[0] not in (USERNAME_KEY, PASSWORD_KEY, PASSWORD_BIN_KEY)]
        return _ClientCallDetails(details, metadata + list(self._metadata))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def with_credentials(channel: grpc.Channel, username: str, password: str) -> grpc.Channel:
    """``channel`` whose every call carries these credentials."""
    return grpc.intercept_channel(channel, CredentialsInterceptor(username, password))
