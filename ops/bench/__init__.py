"""Benchmarks: ``kvlease bench NAME`` and ``python -m kvlease.ops.bench.NAME``.

The public module of ``ops/bench/``: the CLI imports from here.

- :mod:`~kvlease.ops.bench.suite`: the registry (:data:`SUITE`, :data:`MODULES`), the option parser, the
  runner and the table of targets; :mod:`~kvlease.ops.bench.plot`: the plot of the rows;
- one module per benchmark: :mod:`~kvlease.ops.bench.leases` (with :mod:`~kvlease.ops.bench.lease_phases` and
  :mod:`~kvlease.ops.bench.lease_report`), :mod:`~kvlease.ops.bench.writes`, :mod:`~kvlease.ops.bench.scan`,
  :mod:`~kvlease.ops.bench.bootstrap`, :mod:`~kvlease.ops.bench.replication`, :mod:`~kvlease.ops.bench.rebuild`; with them :mod:`~kvlease.ops.bench.scale` (the scale figures),
  :mod:`~kvlease.ops.bench.secure` (a secure set-up), :mod:`~kvlease.ops.bench.seed` (leases written straight into
  their persisted layout);
- stand-alone measurements: :mod:`~kvlease.ops.bench.codec` (``python -m kvlease.ops.bench.codec``) and
  :mod:`~kvlease.ops.bench.measure_buckets` (``python -m kvlease.ops.bench.measure_buckets``).
"""

from __future__ import annotations

from kvlease.ops.bench.suite import ALL, MODULES, SUITE, UsageError, main

__all__ = ["ALL", "MODULES", "SUITE", "UsageError", "main"]
