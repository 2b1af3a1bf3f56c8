"""``kvlease demo``: a local cluster, a Spark streaming query through failovers, and the summary.

The public module of ``ops/demo/``: the CLI imports from here.

- :mod:`~kvlease.ops.demo.lifecycle`: the demo itself (cluster and Spark lifecycle, cleanup, the summary); the
  scenario it runs (a writer, a streaming query, failovers, the checks) is :mod:`kvlease.ops.streaming`'s, which
  the ``spark-failover`` drill runs too.
- :mod:`~kvlease.ops.demo.partitioned`: the demo's partitioned table (orders by day: written, its partitions
  listed, one read back).
"""

from __future__ import annotations

from kvlease.ops.demo.lifecycle import (DEFAULT_ROWS, DEMO_PLAN, MIN_ROWS, Interrupted, keep_hint, render, run_demo,
                                        summary)

__all__ = ["DEFAULT_ROWS", "DEMO_PLAN", "Interrupted", "MIN_ROWS", "keep_hint", "render", "run_demo", "summary"]
