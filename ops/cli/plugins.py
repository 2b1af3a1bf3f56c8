"""``kvlease bench NAME`` / ``kvlease drill NAME``, which run plug-ins.

Plug-ins: ``kvlease bench NAME`` imports ``ops.bench_<NAME>`` and calls its
``main(json_output: bool)``; ``kvlease drill NAME`` imports
``ops.drill_<NAME>`` and calls ``main(cluster_dir: str, json_output: bool)``.
An int returned is the exit code (anything else, None or e.g. a dict of
figures, means 0); a module prints its own result (one JSON document when
``json_output``) and raises :class:`common.errors.KvLeaseError` for failures
the CLI should report.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import click

from common import errors
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


@kvlease.command("bench")
@click.argument("name")
@common_options
@pass_state
@catch_errors
def bench(state: State, name: str) -> None:
    """Run the benchmark ops/bench_NAME.py."""
    code = _load_plugin("benchmark", "bench_", name).main(json_output=state.json_mode)
    if isinstance(code, int) and code:
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
