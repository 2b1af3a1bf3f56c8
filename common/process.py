"""Running a server process: ``python -m kvlease.coordinator|tablet --config FILE``.

Parses the arguments, sets up logging, raises the soft open-file limit to
the hard one (a tablet server holds files of thousands of buckets), loads the
config (a bad one is a one-line error, exit 2), starts the server and serves
until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import resource
import signal
import sys
import threading
from typing import Callable

from kvlease.common.config import Config, ConfigError
from kvlease.common.errors import KvLeaseError

log = logging.getLogger(__name__)

_NR_OPEN = 1 << 20


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
    log.info("open-file limit: %d", raise_open_file_limit())
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


def raise_open_file_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (all an unprivileged process may; an unlimited
    hard limit counts as 2**20, Linux's default ``fs.nr_open``); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _NR_OPEN if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # a sandbox may refuse: keep the soft limit
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft
    return target
