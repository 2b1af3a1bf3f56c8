"""``kvlease table create``'s merge engine options and ``put --partial/--retract``: refused as usage errors (exit 2,
the problem named) before anything is sent."""

from __future__ import annotations

import pytest

from tests.support.cli_runner import run

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("options, message", [
    (["--merge-engine", "aggregation", "--agg", "who=sum"], "column 'who' is STRING: sum takes"),
    (["--merge-engine", "versioned", "--version-column", "who"], "version column 'who' is STRING"),
    (["--merge-engine", "versioned"], "needs a version column"),
    (["--merge-engine", "first_row", "--agg", "total=sum"], "options of the aggregation merge engine"),
    (["--merge-engine", "aggregation", "--version-column", "total"], "option of the versioned merge engine"),
    (["--merge-engine", "first_row", "--delete-behavior", "allow"], "first_row merge engine refuses every delete"),
    (["--agg", "total=sum"], "--agg needs a merge engine"),
    (["--merge-engine", "aggregation", "--agg", "total"], "expected COL=FUNCTION"),
    (["--merge-engine", "aggregation", "--agg", "total=median"], "unknown aggregate function 'median'"),
    (["--merge-engine", "aggregation", "--agg", "id=sum"], "primary key column"),
])
def test_bad_merge_engine_options_are_usage_errors_before_anything_is_sent(options, message):
    result = run("table", "create", "shop.bad", "--schema", "id BIGINT, total BIGINT, who STRING", "--primary-key",
                 "id", "--buckets", "1", "--bootstrap", "127.0.0.1:1", *options)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output and message in result.stderr, result.stderr


def test_put_partial_and_retract_exclude_each_other():
    result = run("put", "shop.t", "--partial", "--retract", "--bootstrap", "127.0.0.1:1")
    assert result.exit_code == 2 and "--partial and --retract exclude each other" in result.stderr
