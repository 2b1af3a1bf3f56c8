"""A process's Prometheus registry and its HTTP endpoint (``metrics.port``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


class MetricsRegistry:
    """Subclasses add their metrics to ``self.registry``; :meth:`serve` exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server = None

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint (port 0: a free one); returns its port."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
