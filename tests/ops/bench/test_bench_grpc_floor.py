"""The gRPC echo floor of ``kvlease bench lookups`` (ops/bench/grpc_floor.py): a real server process, real calls."""

import pytest

from kvlease.ops.bench import grpc_floor

pytestmark = pytest.mark.unit


def test_echo_round_trips_are_timed():
    ms = grpc_floor.echo_ms(50)
    assert len(ms) == 50 and (ms > 0).all() and (ms < 10_000).all()
