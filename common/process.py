"""Running a server process: ``python -m coordinator|tablet --config FILE``.

Parses the arguments, sets up logging, loads the config (a bad one is a
one-line error, exit 2), starts the server and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Callable

from common.config import Config, ConfigError
from common.errors import KvLeaseError

log = logging.getLogger(__name__)


def run_server(prog: str, description: str, build: Callable[[Config], object],
               banner: Callable[[object], str], argv: list[str] | None = None) -> int:
    """``build(config)`` returns an object with ``start()`` and ``stop()``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
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
    server = build(config)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    try:
        server.start()
    except Exception as exc:  # one line, not a traceback: a start that fails is mostly the setup's fault
        if isinstance(exc, KvLeaseError):
            print(f"error: {exc.message}", file=sys.stderr)
        else:
            log.debug("start failed", exc_info=True)
            print(f"error: cannot start: {type(exc).__name__}: {exc} (--log-level DEBUG for a traceback)",
                  file=sys.stderr)
        try:
            server.stop()
        except Exception:  # stopping what half started must not hide why the start failed
            log.debug("stop after a failed start failed", exc_info=True)
        return 1
    print(banner(server), flush=True)
    done.wait()
    server.stop()
    return 0
