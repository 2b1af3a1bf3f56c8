"""``python -m tablet --config FILE``: run one tablet server until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from common.config import Config, ConfigError
from common.errors import KvLeaseError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tablet", description="Run a kvlease tablet server.")
    parser.add_argument("--config", help="TOML config file (KVLEASE_* env vars override it)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        config = Config.load(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from tablet.server import TabletServer

    server = TabletServer(config)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    try:
        server.start()
    except KvLeaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        server.stop()
        return 1
    print(f"tablet server {server.server_id} serving on {server.address}", flush=True)
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
