"""Benchmarks: ``kvlease bench NAME`` and ``python -m ops.bench.NAME``.

The public module of ``ops/bench/``: the CLI imports from here.

- :mod:`~ops.bench.suite`: the registry (:data:`SUITE`, :data:`MODULES`), the option parser, the
  runner and the table of targets; :mod:`~ops.bench.plot`: the plot of the rows;
- one module per benchmark: :mod:`~ops.bench.leases` (with :mod:`~ops.bench.lease_phases` and
  :mod:`~ops.bench.lease_report`), :mod:`~ops.bench.writes`, :mod:`~ops.bench.scan`,
  :mod:`~ops.bench.bootstrap`, :mod:`~ops.bench.replication`, :mod:`~ops.bench.rebuild`; with them :mod:`~ops.bench.scale` (the scale figures),
  :mod:`~ops.bench.secure` (a secure set-up), :mod:`~ops.bench.seed` (leases written straight into
  their persisted layout);
- stand-alone measurements: :mod:`~ops.bench.codec` (``python -m ops.bench.codec``) and
  :mod:`~ops.bench.measure_buckets` (``python -m ops.bench.measure_buckets``).
"""

from __future__ import annotations

from ops.bench.suite import ALL, MODULES, SUITE, UsageError, main

__all__ = ["ALL", "MODULES", "SUITE", "UsageError", "main"]
