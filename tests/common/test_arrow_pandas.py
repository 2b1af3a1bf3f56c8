"""How a process lets pyarrow learn about pandas (common/arrow_pandas.py), each case in a fresh interpreter
(pyarrow asks once per process): a process that said it needs no pandas gets every codec answer right without
ever importing it, and can still convert to pandas later; any other imports pandas up front, where a Ctrl-C
is not lost (tests/ops/cli/test_cli_startup.py); the CLI says so for every command but those that may run Spark."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.unit


def python(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_codec_without_pandas_gives_the_answers_it_gives_with_it_and_pandas_is_there_when_asked_for():
    """The codec tests of Python values (dates, decimals, nested values from Python objects) and of every type's
    round trip, run in a process that never imported pandas: the same answers."""
    lines = python("import sys\n"
                   "from kvlease.common import arrow_pandas\n"
                   "arrow_pandas.without_pandas()\n"
                   "from tests.common import test_codec_types as t\n"
                   "t.test_python_values_come_back_as_written()\n"
                   "t.test_every_type_round_trips_exactly_through_values_and_slices()\n"
                   "import pyarrow as pa\n"
                   "assert pa.array([1, None]).to_pylist() == [1, None]\n"
                   "print('pandas' in sys.modules)\n"
                   "print(type(pa.table({'a': [1, 2]}).to_pandas()).__name__)  # imported now, when asked for\n")
    assert lines[-2:] == ["False", "DataFrame"]


def test_a_process_that_did_not_say_so_imports_pandas_before_pyarrow_asks():
    assert python("import sys\n"
                  "import kvlease.common.codec\n"
                  "print('pandas' in sys.modules)\n")[-1] == "True"


def test_prepare_runs_once():
    """The first call imports pandas (this process did not say it can do without); a second one does nothing."""
    assert python("import sys\n"
                  "from kvlease.common import arrow_pandas\n"
                  "arrow_pandas.prepare()\n"
                  "print('pandas' in sys.modules)\n"
                  "del sys.modules['pandas']  # a second run would import it again\n"
                  "arrow_pandas.prepare()\n"
                  "print('pandas' in sys.modules)\n")[-2:] == ["True", "False"]


@pytest.mark.parametrize("command,imported", [("get", False), ("put", False), ("log", False), ("scan", False),
                                              ("demo", True), ("drill", True)])
def test_the_cli_loads_pandas_only_for_the_commands_that_may_run_spark(command, imported):
    lines = python("import sys\n"
                   "from kvlease.ops.cli.app import kvlease\n"
                   "import click\n"
                   f"kvlease.get_command(click.Context(kvlease), {command!r})\n"
                   "import kvlease.common.codec, pyarrow as pa\n"
                   "pa.array([1])  # pyarrow's question, if not asked yet\n"
                   "print('pandas' in sys.modules)\n")
    assert lines[-1] == str(imported)
