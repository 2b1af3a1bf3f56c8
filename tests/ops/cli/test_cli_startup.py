"""The CLI's start: only the command being run is imported, and a Ctrl-C at any point of it is one line.

Each case runs a fresh interpreter (what is imported depends on what the process imported before)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time

import click
import pytest

from kvlease.ops.cli.app import COMMAND_MODULES, kvlease

pytestmark = pytest.mark.unit

#: What the table commands never need (they talk to the coordinator: gRPC is theirs).
HEAVY = ("pyarrow", "pandas", "numpy", "pyspark", "kazoo", "rocksdict", "boto3")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_every_command_module_is_listed_with_the_commands_it_adds():
    """COMMAND_MODULES names, for each top-level command, every module that adds it or its subcommands: a
    command added by a module the map does not name would be missing unless something imported it."""
    for modules in COMMAND_MODULES.values():
        for module in modules:
            importlib.import_module(f"kvlease.ops.cli.{module}")
    added: dict[str, set[str]] = {}
    for name, command in kvlease.commands.items():
        found = {command.callback.__module__} if command.callback else set()
        if isinstance(command, click.Group):
            found |= {sub.callback.__module__ for sub in command.commands.values()}
        added[name] = {m.removeprefix("kvlease.ops.cli.") for m in found}
    assert added == {name: set(modules) for name, modules in COMMAND_MODULES.items()}


def test_a_command_imports_only_what_it_needs():
    result = python("import sys\n"
                    "from kvlease.ops.cli import main\n"
                    "try:\n"
                    "    main(['table', '--help'])\n"
                    "except SystemExit as exc:\n"
                    "    assert exc.code == 0, exc.code\n"
                    f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
                    "print('kvlease.ops.cli.data' in sys.modules, 'kvlease.ops.demo' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["[]", "False False"]


@pytest.mark.parametrize("argv", [["table", "list"], ["lease", "list"], ["partition", "list", "db.t"],
                                  ["snapshot", "list", "db.t"]])
def test_a_command_that_asks_the_coordinator_loads_no_arrow_or_pandas(argv):
    """The commands that talk to the coordinator only (no cluster answers here: each fails at once) load
    neither Arrow nor pandas, which take about a second of CPU to import."""
    result = python("import sys\n"
                    "from kvlease.ops.cli import main\n"
                    "try:\n"
                    f"    main(['--bootstrap', '127.0.0.1:1', '--retry-timeout', '0s', *{argv!r}])\n"
                    "except SystemExit as exc:\n"
                    "    assert exc.code == 1, exc.code\n"
                    f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("module,argv", [
    ("kvlease.ops.cli.app", ["table", "list"]),  # interrupted while the CLI itself loads
    ("kvlease.ops.cli.table", ["table", "list"]),  # while the command's module loads
    ("kvlease.ops.cli.data", ["get", "db.t", "{}"]),
    ("kvlease.client.admin", ["--bootstrap", "127.0.0.1:1", "table", "list"]),  # while the global options are read
])
def test_ctrl_c_while_the_cli_starts_is_one_line_and_exit_130(module, argv):
    """A KeyboardInterrupt raised by an import (as a Ctrl-C in the second it may take) is the CLI's usual
    ``error: interrupted`` and exit code 130, not a traceback."""
    result = python("import sys\n"
                    "class Interrupt:\n"
                    "    def find_spec(self, name, path=None, target=None):\n"
                    f"        if name == {module!r}:\n"
                    "            raise KeyboardInterrupt\n"
                    "sys.meta_path.insert(0, Interrupt())\n"
                    "from kvlease.ops.cli import main\n"
                    f"main({argv!r})\n")
    assert result.returncode == 130, result.stderr
    assert result.stderr == "error: interrupted\n"


def test_after_ctrl_c_a_close_that_hangs_does_not_keep_the_process_alive():
    """Closing a gRPC channel whose call a Ctrl-C cut short can hang (grpc/grpc#19973): the console script
    ends within its bounded close anyway, with the usual line and exit code."""
    started = time.monotonic()
    result = python("import sys, time\n"
                    "import kvlease.ops.cli.app as app\n"
                    "def close(self):\n"
                    "    print('closing', flush=True)\n"
                    "    time.sleep(600)\n"
                    "def client(self):\n"
                    "    raise KeyboardInterrupt  # as a Ctrl-C in the command's first call\n"
                    "app.State.close = close\n"
                    "app.State.client = property(client)\n"
                    "from kvlease.ops.cli import main\n"
                    "main(['table', 'list'])\n")
    assert (result.returncode, result.stderr, result.stdout) == (130, "error: interrupted\n", "closing\n")
    assert time.monotonic() - started < 60  # the close waited 2 s of its 600, not all of them


def test_a_ctrl_c_during_an_import_that_drops_exceptions_is_not_lost(tmp_path):
    """Module code run from C may drop an exception raised inside it (numpy's lazy submodules, Cython module
    inits, pyarrow's lazy import of pandas): a Ctrl-C arriving then was lost and the command went on. The
    console script defers it to the end of the import."""
    (tmp_path / "drops_exceptions.py").write_text(
        "import os, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C while this module is imported ...\n"
        "    time.sleep(0.5)\n"
        "except BaseException:\n"
        "    pass  # ... and a library that drops what it raised\n")
    result = python(f"import sys\n"
                    f"sys.path.insert(0, {str(tmp_path)!r})\n"
                    "class ImportFirst:\n"
                    "    def find_spec(self, name, path=None, target=None):\n"
                    "        if name == 'kvlease.ops.cli.table':\n"
                    "            import drops_exceptions\n"
                    "        return None\n"
                    "sys.meta_path.insert(0, ImportFirst())\n"
                    "from kvlease.ops.cli import main\n"
                    "main(['--bootstrap', '127.0.0.1:1', '--retry-timeout', '30s', 'table', 'list'])\n")
    assert (result.returncode, result.stderr) == (130, "error: interrupted\n")
