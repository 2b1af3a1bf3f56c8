"""Ctrl-C in the ``kvlease`` CLI: ``error: interrupted`` and exit code 130, every time, at any moment.

- :func:`interrupted` is where every KeyboardInterrupt ends (a command's own
  cleanup has run by then, while it unwound the command): the line, and from
  the console script the end of the process within :data:`CLOSE_S` (closing a
  gRPC channel whose call the interrupt cut short can hang: grpc/grpc#19973).
- :func:`install` (the console script only) defers a Ctrl-C that arrives while
  a module is being imported until the import is over. Third-party module code
  run from C (numpy's lazy submodules, Cython module inits, pyarrow's lazy
  import of pandas) may drop an exception raised inside it: the
  KeyboardInterrupt was lost and the command went on, e.g. ``log --follow``
  forever. Deferred, it is raised at the first bytecode after the import, by
  the same handler, rung again every :data:`RETRY_S` by a helper thread.

click's test runner (the unit tests) keeps Python's own handler and a plain
``Exit(130)``. This module imports nothing but the standard library: it is
installed before anything else of the CLI is loaded.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import _thread

CLOSE_S = 2.0  # after Ctrl-C the console script closes its clients for at most this long, then ends
RETRY_S = 0.02  # a deferred Ctrl-C is tried again this often
_IMPORT_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_console_script = False


def install() -> None:
    """Make this process the console script: Ctrl-C ends it (:func:`interrupted`) and is deferred while a
    module is being imported. Call from the main thread before the command runs."""
    global _console_script
    _console_script = True
    signal.signal(signal.SIGINT, _Handler())


class _Handler:
    """The SIGINT handler: KeyboardInterrupt now, or once the import running now is over."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a second Ctrl-C may run the handler inside itself
        self._pending = False

    def __call__(self, signum, frame) -> None:
        with self._lock:
            if _importing(frame):
                if not self._pending:
                    self._pending = True
                    threading.Thread(target=self._ring_again, name="deferred-ctrl-c", daemon=True).start()
                return
            self._pending = False
        raise KeyboardInterrupt

    def _ring_again(self) -> None:
        while True:
            time.sleep(RETRY_S)
            with self._lock:  # not after the handler raised: a second interrupt would cut the cleanup short
                if not self._pending:
                    return
                _thread.interrupt_main(signal.SIGINT)


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename in _IMPORT_MACHINERY:
            return True
        frame = frame.f_back
    return False


def interrupted(ctx) -> None:
    """A KeyboardInterrupt reached the CLI (``ctx``: the click context, if any): ``error: interrupted`` and
    exit code 130 (see the module docstring)."""
    import click

    click.echo("error: interrupted", err=True)
    if not _console_script:
        raise click.exceptions.Exit(130)
    state = ctx.find_root().obj if ctx is not None else None
    if state is not None:
        closer = threading.Thread(target=state.close, name="close-on-interrupt", daemon=True)
        closer.start()
        closer.join(CLOSE_S)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(130)
