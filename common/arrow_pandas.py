"""How a kvlease process lets pyarrow learn whether pandas is there: once, before kvlease's Arrow code first
uses pyarrow (``common.logentry`` and ``common.codec_arrays`` call :func:`prepare` as they are imported).

pyarrow imports pandas lazily, on the first call that asks whether pandas is installed (``pa.array`` of
Python objects, ``pa.scalar``, ...), inside a Cython function that cannot raise: an exception during that
import is printed and dropped. A Ctrl-C arriving in that time (pandas takes ~0.35 s of CPU to import) was
lost: the CLI command went on as if never interrupted, and pyarrow went on believing pandas is missing.

- A process that never hands pandas objects to pyarrow says so before (:func:`without_pandas`): the tablet
  servers, the coordinators, and every CLI command but ``demo``, ``drill`` and ``bench`` (which may run
  Spark in the process). pyarrow's question is then answered "not installed" without importing pandas at
  all: each such process starts ~0.35 s of CPU sooner and holds ~40 MB less. A later call that cannot do
  without pandas (``to_pandas``) still imports it then.
- Any other process (Spark's Python workers, a user's program, the tests): pandas is imported here by a
  plain import statement, where a Ctrl-C interrupts it as it does any import.
"""

from __future__ import annotations

import functools
import importlib.abc
import sys

_without = False


def without_pandas() -> None:
    """This process never hands pandas objects to pyarrow: :func:`prepare` tells pyarrow pandas is absent.
    Too late once :func:`prepare` ran (then pyarrow knows about pandas already)."""
    global _without
    _without = True


class _NoPandas(importlib.abc.MetaPathFinder):
    """Makes ``import pandas`` fail while installed (for pyarrow's one question)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError(f"{name} is not imported by this kvlease process", name=name)
        return None


@functools.cache
def prepare() -> None:
    """Once per process, before kvlease's first use of pyarrow: see the module docstring."""
    if not _without or "pandas" in sys.modules:
        import pandas  # noqa: F401
        return
    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        import pyarrow as pa

        pa.array([0])  # pyarrow asks whether pandas is installed (the answer is kept) and gets "no"
    finally:
        sys.meta_path.remove(blocker)
