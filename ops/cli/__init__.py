"""The ``kvlease`` command line (console script ``ops.cli:main``).

:mod:`kvlease.ops.cli.app` holds the root group, the state the commands share and
its ``main``; :mod:`kvlease.ops.cli.values` parses values from text; every other
module is one command group and adds its commands to the root group when it
is imported. The root group imports only the modules of the command being run
(:data:`kvlease.ops.cli.app.COMMAND_MODULES`): ``kvlease table list`` does not pay for
Arrow, pandas or Spark, which only the data commands and the demo need.
Importing this package imports nothing but the standard library: a Ctrl-C at
any point of a command's start is ``error: interrupted`` and exit code 130,
never a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

# gRPC core logs each failed TLS handshake on stderr at INFO; the CLI's one-line error already says so.
# It reads this when grpc is first imported, which the commands do.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

__all__ = ["State", "kvlease", "main"]


def main(argv: Iterable[str] | None = None) -> None:
    """Console-script entry point (Ctrl-C: :mod:`kvlease.ops.cli.interrupts`, installed before anything is loaded)."""
    from kvlease.ops.cli import interrupts

    try:
        interrupts.install()
        from kvlease.ops.cli.app import kvlease
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    kvlease.main(args=list(argv) if argv is not None else None, prog_name="kvlease")


def __getattr__(name: str) -> Any:
    """``State`` and ``kvlease`` (the root group) come from :mod:`kvlease.ops.cli.app`, imported on first use."""
    if name in ("State", "kvlease"):
        from kvlease.ops.cli import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
