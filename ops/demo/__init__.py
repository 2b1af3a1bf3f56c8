"""``kvlease demo`` and the streaming-failover scenario it shares with the drills.

The public module of ``ops/demo/``: the CLI and the drills import from here.

- :mod:`~ops.demo.lifecycle`: the demo itself (cluster and Spark lifecycle, cleanup, the summary);
- :mod:`~ops.demo.stream_failover`: the scenario (a writer, a streaming query, coordinator
  failovers, the checks), also run by the ``spark-failover`` drill;
- :mod:`~ops.demo.leader_kill`: the scenario's optional tablet failover (``kill -9`` of a bucket
  leader's tablet server mid-stream, then started again);
- :mod:`~ops.demo.stream_query`, :mod:`~ops.demo.feed_check`, :mod:`~ops.demo.change_writer`: its
  query, its checkers (pure functions of the output), its writer;
- :mod:`~ops.demo.chaos_stream`: the same query and checkers around the chaos drill's faults;
- :mod:`~ops.demo.spark`: a local Spark session with the kvlease source.
"""

from __future__ import annotations

from ops.demo.chaos_stream import ChaosStream
from ops.demo.lifecycle import DEFAULT_ROWS, DEMO_PLAN, MIN_ROWS, Interrupted, keep_hint, render, run_demo, summary
from ops.demo.spark import local_session, stop_local_session
from ops.demo.stream_failover import Outcome, Plan
from ops.demo.stream_failover import run as run_failover

__all__ = ["ChaosStream", "DEFAULT_ROWS", "DEMO_PLAN", "Interrupted", "MIN_ROWS", "Outcome", "Plan", "keep_hint",
           "local_session", "render", "run_demo", "run_failover", "stop_local_session", "summary"]
