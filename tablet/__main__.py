"""``python -m kvlease.tablet --config FILE``: run one tablet server until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from kvlease.common import arrow_pandas
from kvlease.common.process import run_server


def main(argv: list[str] | None = None) -> int:
    arrow_pandas.without_pandas()  # never hands pandas objects to pyarrow (common/arrow_pandas.py)
    from kvlease.tablet.server import TabletServer

    return run_server("python -m kvlease.tablet", "Run a kvlease tablet server.", TabletServer,
                      lambda s: f"tablet server {s.server_id} serving on {s.address} (metrics port {s.metrics_port})",
                      argv)


if __name__ == "__main__":
    sys.exit(main())
