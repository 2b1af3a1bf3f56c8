"""Fuzzing the kvlease command line: random arguments for every command exit 0, 1 or 2,
with at most one ``error:`` line on stderr and never a traceback or an internal error.

The command tree is walked (every command ``kvlease --help`` lists, and theirs);
each command gets random tokens: its own option names, values of the kinds its
parameters take (numbers beyond the wire types, durations without a unit, names
with newlines, Unicode digits, …) and random text. Without a cluster
(``unit``: a closed address, no retries) and against an in-process cluster
(``zk``: one coordinator, one tablet server, a table ``db.t``). Commands that
start or stop processes (cluster start/stop, demo, bench, drill) get their
argument checks fuzzed with the work itself replaced by a stub.
"""

from __future__ import annotations

import json
import types

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlease.common.tables import Column
from click.testing import CliRunner

from kvlease.ops.cli import kvlease
from tests.support.cli_runner import NO_ENV


def commands(group: click.Group = kvlease, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    """Every command (the root group imports each one's modules when it is looked up)."""
    found = {}
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            found.update(commands(command, path + (name,)))
        else:
            found[path + (name,)] = command
    return found


COMMANDS = commands()

#: Values that have broken or could break a parser: beyond int32/int64, no unit, newlines, Unicode digits.
TRICKY = ["0", "1", "-1", "5", "5s", "0s", "10m", "99999999999999999999d", str(2**31), str(2**40), str(2**63),
          str(10**20), str(10**23), "-" + str(10**23), "99999999999=1", "0=99999999999999999999", "0=1", "1,2",
          "²", "١٢", "1_000", "1e3", "nan", "inf", "db.t", "db.t\n", "db.nl\n", "db", "a.b.c", "", " ", "\n", "-",
          "--", "L1", "L1\n", "x" * 200, "id BIGINT", "id BIGINT, v STRING", "id\n BIGINT", "id", "id\n",
          "[1, 2]", '["a,b"]', "[", "{}", "1970-01-01T00:00:00Z", "9999-12-31T23:59:59", "0001-01-01",
          "2024-05-01T12:00:00.5+14:00", "file:///tmp/x", "s3://b/p", "hdfs://x", "\x00", "\ud800", "é"]


def option_names(command: click.Command) -> list[str]:
    return [name for param in command.params if isinstance(param, click.Option) for name in param.opts]


def tokens(command: click.Command) -> st.SearchStrategy[list[str]]:
    token = st.one_of(st.sampled_from(option_names(command) or ["--json"]), st.sampled_from(TRICKY),
                      st.integers().map(str), st.text(max_size=12))
    return st.lists(token, max_size=8)


#: What ``put`` may read on stdin: random bytes, or lines that are nearly rows of db.t.
ROW = st.fixed_dictionaries({}, optional={"id": st.one_of(st.integers(), st.text(max_size=5), st.none()),
                                         "v": st.one_of(st.text(max_size=5), st.integers(), st.booleans()),
                                         "x": st.integers()})
STDIN = st.one_of(st.binary(max_size=60),
                  st.lists(st.one_of(ROW.map(json.dumps), st.sampled_from(TRICKY)),
                           max_size=4).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")))


def run(args: list[str], stdin: bytes = b""):
    return CliRunner().invoke(kvlease, args, input=stdin, env=NO_ENV, prog_name="kvlease")


def check(result, args) -> None:
    shown = f"kvlease {' '.join(map(repr, args))}\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), shown + repr(result.exception)
    assert result.exit_code in (0, 1, 2), shown
    assert "Traceback" not in result.output and "internal error" not in result.output, shown
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) <= 1, shown
    if result.exit_code == 2 and "Commands:" in result.stderr:
        return  # a group without its command: its help (click's NoArgsIsHelpError)
    if result.exit_code in (1, 2):  # any failure, usage errors too: one line
        assert len(result.stderr.strip().splitlines()) == 1 and errors, shown


@pytest.fixture
def stubbed_side_effects(monkeypatch, tmp_path):
    """cluster start/stop, demo, bench and drill check their arguments, then do nothing."""
    from kvlease.ops import bench as bench_suite
    from kvlease.ops import local_cluster
    from kvlease.ops import demo as demo_run
    from kvlease.ops.cli import plugins

    monkeypatch.setattr(local_cluster, "start", lambda *a, **k: None)
    monkeypatch.setattr(local_cluster, "stop", lambda *a, **k: {"stopped": []})
    monkeypatch.setattr(demo_run, "run_demo", lambda *a, **k: {"ok": True})
    monkeypatch.setattr(demo_run, "render", lambda doc: "demo")
    monkeypatch.setattr(demo_run, "keep_hint", lambda doc: "kept")
    monkeypatch.setattr(bench_suite, "main", lambda name, args, json_output=False: 0)
    real_load = plugins.load_drill

    def load_drill(name):
        module = real_load(name)
        return types.SimpleNamespace(main=lambda *a, **k: 0, OPTIONS=getattr(module, "OPTIONS", None))

    monkeypatch.setattr(plugins, "load_drill", load_drill)
    monkeypatch.chdir(tmp_path)  # relative paths a command might create land in the test's temp dir


NO_CLUSTER = ("--bootstrap", "127.0.0.1:1", "--retry-timeout", "0s")


@pytest.mark.unit
@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_random_arguments_without_a_cluster(path, stubbed_side_effects):
    command = COMMANDS[path]

    @settings(max_examples=30, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(args=tokens(command), stdin=STDIN)
    def fuzz(args, stdin):
        full = [*NO_CLUSTER, *path, *args]
        check(run(full, stdin), full)

    fuzz()


@pytest.mark.zk
def test_random_arguments_against_a_cluster(make_config, tmp_path, stubbed_side_effects):
    from tests.support.local_cluster import LocalCluster

    c = LocalCluster(make_config, tmp_path / "cluster", tablets=1)
    try:
        c.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)
        address = ("--bootstrap", c.coordinator.address, "--retry-timeout", "1s")
        data_paths = sorted(p for p in COMMANDS if p[0] not in ("cluster", "demo", "bench", "drill"))

        @settings(max_examples=300, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        @given(data=st.data())
        def fuzz(data):
            path = data.draw(st.sampled_from(data_paths))
            table = data.draw(st.sampled_from([["db.t"], []]))  # mostly a table that exists, to get further
            args = [*table, *data.draw(tokens(COMMANDS[path]))]
            if "--follow" in args:  # would poll until Ctrl-C
                args = [a for a in args if a != "--follow"]
            full = [*address, *path, *args]
            check(run(full, data.draw(STDIN)), full)
            if not any(t.path == "db.t" for t in c.admin.list_tables()):  # `table drop db.t` was drawn
                c.create_table("db.t", [Column("id", "BIGINT"), Column("v", "STRING")], ["id"], 2)

        fuzz()
    finally:
        c.close()
