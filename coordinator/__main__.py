"""``python -m kvlease.coordinator --config FILE``: run one coordinator until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from kvlease.common import arrow_pandas
from kvlease.common.process import run_server


def main(argv: list[str] | None = None) -> int:
    arrow_pandas.without_pandas()  # never hands pandas objects to pyarrow (common/arrow_pandas.py)
    from kvlease.coordinator.server import CoordinatorServer

    return run_server("python -m kvlease.coordinator", "Run a kvlease coordinator.", CoordinatorServer,
                      lambda s: f"coordinator serving on {s.address} (metrics port {s.metrics_port})", argv)


if __name__ == "__main__":
    sys.exit(main())
