"""``kvlease table create --replication-factor`` against a real coordinator (no tablet server): a replication
factor above the live tablet servers is a one-line error and nothing is created; describe shows the rest."""

from __future__ import annotations

import json

import pytest

from tests.support import coordinators
from tests.support.cli_runner import assert_one_line_error, run


@pytest.fixture
def coordinator(make_config):
    with coordinators.serving(make_config()) as server:
        yield server


def test_a_replication_factor_above_the_live_servers_is_a_clear_error(coordinator):
    b = ("--bootstrap", coordinator.address)
    create = (*b, "table", "create", "db.t", "--schema", "id BIGINT", "--primary-key", "id", "--buckets", "2")
    line = assert_one_line_error(run(*create, "--replication-factor", "2"))
    assert "replication factor 2 is more than the 0 live tablet server(s)" in line
    assert json.loads(run(*b, "table", "list", "--json").stdout) == {"tables": []}
    assert run(*create).exit_code == 0  # one replica: its buckets wait for a tablet server, as before
    doc = json.loads(run(*b, "table", "describe", "db.t", "--json").stdout)
    assert (doc["replication_factor"], doc["min_insync_replicas"]) == (1, 1)
    assert [(a["leader"], a["replicas"], a["isr"]) for a in doc["assignment"]] == [(-1, [], [])] * 2
    assert "none (offline)" in run(*b, "table", "describe", "db.t").stdout
