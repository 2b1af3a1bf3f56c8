"""The floor under a single-key lookup: a bare Python gRPC round trip on loopback, measured in the same run.

``echo_ms(calls)`` starts ``python -m kvlease.ops.bench.grpc_floor serve`` (a process of its own, as a tablet
server is: a sync gRPC server with a thread pool and one generic method that answers its request bytes),
times ``calls`` unary calls of 30 bytes one at a time from this process, stops the server and returns the
latencies in ms; :class:`EchoServer` keeps the server running between such timings (the lookups interleave
with them). ``kvlease bench lookups`` reports its p50/p99 beside the single-key lookups' (not judged):
on a 2-vCPU VM the round trip alone moves between runs with the scheduler's wake-ups (0.27-0.62 ms p50 on
2026-11-30), which no lookup can go below.
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent import futures

import grpc
import numpy as np

METHOD = "/kvlease.bench.Echo/Echo"
WARM_UP = 200


def serve() -> None:
    """Answer echo calls on a free loopback port (printed on stdout) until stdin closes."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handler = grpc.method_handlers_generic_handler(
        "kvlease.bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


class EchoServer:
    """The echo server process (``with EchoServer() as echo: echo.ms(calls)``), stopped on exit."""

    def __enter__(self) -> "EchoServer":
        self._proc = subprocess.Popen([sys.executable, "-m", "kvlease.ops.bench.grpc_floor", "serve"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = int(self._proc.stdout.readline())
            self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            self._call = self._channel.unary_unary(METHOD)
            for _ in range(WARM_UP):
                self._call(b"x" * 30, timeout=10)
        except BaseException:
            self.__exit__()
            raise
        return self

    def ms(self, calls: int) -> np.ndarray:
        """Latencies (ms) of ``calls`` echo round trips, one at a time."""
        out = np.empty(calls)
        for i in range(calls):
            started = time.perf_counter()
            self._call(b"x" * 30, timeout=10)
            out[i] = (time.perf_counter() - started) * 1000
        return out

    def __exit__(self, *exc: object) -> None:
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def echo_ms(calls: int) -> np.ndarray:
    """Latencies (ms) of ``calls`` echo round trips to a server process of its own."""
    with EchoServer() as echo:
        return echo.ms(calls)


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve()
