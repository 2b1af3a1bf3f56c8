"""``python -m coordinator --config FILE``: run one coordinator until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from common.process import run_server


def main(argv: list[str] | None = None) -> int:
    from coordinator.server import CoordinatorServer

    return run_server("python -m coordinator", "Run a kvlease coordinator.", CoordinatorServer,
                      lambda s: f"coordinator serving on {s.address} (metrics port {s.metrics_port})", argv)


if __name__ == "__main__":
    sys.exit(main())
