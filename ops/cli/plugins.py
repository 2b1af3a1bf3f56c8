"""``kvlease bench NAME`` (the benchmark suite) and ``kvlease drill NAME`` (plug-ins).

``kvlease bench NAME [ARGS…]`` hands NAME and everything after it to
:func:`ops.bench_suite.main`, which parses the benchmark's own options, runs
it and prints (and plots) the figures; a bad name or option is one line
``error: …`` and exit code 2, before anything runs.

Plug-ins: ``kvlease drill NAME`` imports ``ops.drill_<NAME>`` and calls
``main(cluster_dir: str, json_output: bool)``. An int returned is the exit
code (anything else means 0); a module prints its own result (one JSON
document when ``json_output``) and raises :class:`common.errors.KvLeaseError`
for failures the CLI should report.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import click

from common import errors
from ops import bench_suite
from ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from ops.cli.cluster import cluster_dir

PLUGIN_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _plugins(prefix: str) -> list[str]:
    import ops

    return sorted(m.name[len(prefix):] for m in pkgutil.iter_modules(ops.__path__) if m.name.startswith(prefix))


def _load_plugin(kind: str, prefix: str, name: str):
    if not PLUGIN_NAME.match(name):
        raise click.BadParameter(f"{name!r} is not a {kind} name (lower-case letters, digits, _)",
                                 param_hint="'NAME'")
    module_name = f"ops.{prefix}{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        known = ", ".join(_plugins(prefix)) or "none yet"
        raise errors.InvalidRequestError(f"unknown {kind} {name!r} (available: {known})") from None


BENCH_HELP = "\n".join([
    "Run a benchmark: kvlease bench NAME [--json] [--plot FILE.png] [OPTIONS…].",
    "",
    "Each starts what it needs in a temp directory, measures kvlease and its anchor in the same run, "
    "and prints the ratios, their targets and whether each is met (--json: one JSON document). "
    "`kvlease bench NAME --help` lists NAME's options and says what it measures.",
    "",
    "\b",
    "NAME:",
    *(f"  {name:<10} {text}" for name, text in bench_suite.SUITE.items()),
    f"  {bench_suite.ALL:<10} every one above, one after another, then one combined table",
])


@kvlease.command("bench", help=BENCH_HELP, short_help="Run a benchmark (leases, writes, scan, bootstrap, all).",
                 context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("name", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@pass_state
@catch_errors
def bench(state: State, name: str | None, args: tuple[str, ...]) -> None:
    try:
        if name is None:
            raise bench_suite.UsageError("which benchmark? kvlease bench NAME, NAME one of "
                                         f"{', '.join([*bench_suite.SUITE, bench_suite.ALL])} (see --help)")
        code = bench_suite.main(name, args, json_output=state.json_mode)
    except bench_suite.UsageError as exc:
        click.echo(f"error: {exc.message}", err=True)
        code = 2
    if code:
        click.get_current_context().exit(code)


@kvlease.command("drill")
@click.argument("name")
@click.option("--dir", "directory", metavar="D", help="Cluster directory (default: --cluster).")
@common_options
@pass_state
@catch_errors
def drill(state: State, name: str, directory: str | None) -> None:
    """Run the failure drill ops/drill_NAME.py against a local cluster."""
    module = _load_plugin("drill", "drill_", name)
    code = module.main(cluster_dir(state, directory), json_output=state.json_mode)
    if isinstance(code, int) and code:
        click.get_current_context().exit(code)
