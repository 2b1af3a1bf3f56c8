"""A process's Prometheus registry and its HTTP endpoint (``metrics.port``)."""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

#: How often the endpoint's thread looks whether it is to stop, i.e. the longest :meth:`close` waits
#: (prometheus_client's ``start_http_server`` looks every 0.5 s: each server's stop waited for it).
STOP_POLL_S = 0.05


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        """No line on stderr per scrape."""


class MetricsRegistry:
    """Subclasses add their metrics to ``self.registry``; :meth:`serve` exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint (port 0: a free one); returns its port."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (_ThreadingServer,), {"address_family": family})
        self._server = make_server(host, port, make_wsgi_app(self.registry), server_class, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(STOP_POLL_S,),
                                        name="metrics-http", daemon=True)
        self._thread.start()
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()  # returns within STOP_POLL_S
            self._server.server_close()
            self._server = None
