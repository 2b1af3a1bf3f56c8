"""A Spark bootstrap-then-tail query on a kvlease table through faults, and its output checked against the
table: what ``kvlease demo`` and the drills share.

The public module of ``ops/streaming/``: the demo, the drills and the benchmarks import from here.

- :mod:`~kvlease.ops.streaming.stream_failover`: the scenario (a writer, a streaming query, coordinator
  failovers, the checks) that ``kvlease demo`` shows and the ``spark-failover`` drill runs;
- :mod:`~kvlease.ops.streaming.leader_kill`: the scenario's optional tablet failover (``kill -9`` of a bucket
  leader's tablet server mid-stream, then started again);
- :mod:`~kvlease.ops.streaming.stream_query`, :mod:`~kvlease.ops.streaming.feed_check`, :mod:`~kvlease.ops.streaming.change_writer`:
  its query, its checkers (pure functions of the output), its writer;
- :mod:`~kvlease.ops.streaming.chaos_stream`: the same query and checkers around the chaos and tablet-failover
  drills' faults;
- :mod:`~kvlease.ops.streaming.spark`: a local Spark session with the kvlease source.
"""

from __future__ import annotations

from kvlease.ops.streaming.chaos_stream import BOOTSTRAP_BOUND_S, ChaosStream
from kvlease.ops.streaming.spark import local_session, stop_local_session
from kvlease.ops.streaming.stream_failover import Outcome, Plan
from kvlease.ops.streaming.stream_failover import run as run_failover

__all__ = ["BOOTSTRAP_BOUND_S", "ChaosStream", "Outcome", "Plan", "local_session", "run_failover", "stop_local_session"]
