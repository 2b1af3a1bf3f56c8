"""Can Spark's Python workers import the source? Checked when it is registered, before any query plans.

Spark runs a Python data source in its own Python processes (``PYSPARK_PYTHON``,
default ``python3`` on the PATH), not in the driver's. When that python lacks
the project, every ``load()`` fails deep in Spark with ``No module named
'kvlease'``; :func:`check_workers` turns that into one line naming what to
set. Only a local master's workers run here, so only then can it be checked.
"""

from __future__ import annotations

import os
import subprocess
import sys

from kvlease.common.errors import InvalidRequestError

#: What a worker imports to run the source: the project's packages and the libraries they need.
WORKER_MODULES = ("kvlease", "pyarrow", "grpc", "numpy")
_PROBE = ("import importlib.util, sys\n"
          "missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]\n"
          "print(' '.join(missing))\n")


class WorkerPythonError(InvalidRequestError):
    """Spark's Python workers cannot import the source; the message says what to set."""


def missing_modules(python: str, env: dict[str, str] | None = None) -> list[str]:
    """The :data:`WORKER_MODULES` that ``python`` cannot find (with ``env``, default this process's).
    Raises :class:`WorkerPythonError` if ``python`` does not run."""
    try:
        done = subprocess.run([python, "-c", _PROBE, *WORKER_MODULES], capture_output=True, text=True, timeout=60,
                              env=os.environ.copy() if env is None else env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkerPythonError(f"Spark's Python workers would run {python!r}, which does not run ({exc}): set "
                                f"PYSPARK_PYTHON to the python that has kvlease installed ({sys.executable}) "
                                "before the SparkSession is built") from None
    if done.returncode != 0:
        raise WorkerPythonError(f"Spark's Python workers would run {python!r}, which fails "
                                f"({done.stderr.strip().splitlines()[-1:] or done.returncode}): set PYSPARK_PYTHON "
                                f"to the python that has kvlease installed ({sys.executable})")
    return done.stdout.split()


def check_workers(spark) -> None:
    """Raise :class:`WorkerPythonError` if ``spark``'s Python workers cannot import the source. Checked for a
    local master (its workers run on this machine, with this environment); other masters are not checked."""
    context = getattr(spark, "sparkContext", None)  # a Spark Connect session has none
    try:
        master, python = context.master, context.pythonExec
    except Exception:  # Spark Connect raises instead of returning nothing
        return
    if not str(master).startswith("local"):
        return
    missing = missing_modules(python)
    if missing:
        raise WorkerPythonError(
            f"Spark's Python workers run {python!r} (PYSPARK_PYTHON), which cannot import {', '.join(missing)}, "
            "so every kvlease read or write would fail in them (\"No module named …\"). Set "
            f"PYSPARK_PYTHON={sys.executable} (the python that has kvlease installed) in the environment before "
            "the SparkSession is built, and stop any session built without it")
