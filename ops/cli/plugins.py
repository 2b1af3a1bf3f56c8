"""``kvlease demo``, and ``kvlease bench NAME`` / ``kvlease drill NAME``, which run plug-ins.

Plug-ins: ``kvlease bench NAME`` imports ``ops.bench_<NAME>`` and calls its
``main(json_output: bool)``; ``kvlease drill NAME`` imports
``ops.drill_<NAME>`` (hyphens in NAME become underscores: ``coordinator-failover``
is ``ops/drill_coordinator_failover.py``) and calls ``main(cluster_dir: str,
json_output: bool, **options)`` with the drill options given on the command
line (``--rounds``, …; a module that lists the ones it takes in ``OPTIONS``
gets a usage error for any other). A module of that name without ``main`` is
no drill (``ops/drill_checks.py`` holds the drills' checkers).
An int returned is the exit code (anything else, None or e.g. a dict of
figures, means 0); a module prints its own result (one JSON document when
``json_output``) and raises :class:`common.errors.KvLeaseError` for failures
the CLI should report. ``kvlease drill --help`` lists the drills with the
first two paragraphs of each module's docstring (read, not imported).
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import click

from common import errors
from ops.cli.app import State, catch_errors, common_options, kvlease, pass_state
from ops.cli.cluster import cluster_dir
from ops.drill import drill_modules, drill_summary

PLUGIN_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
DRILL_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
#: Drill options of the command line -> the keyword a drill's main() gets (given ones only).
DRILL_OPTIONS = ("rounds", "clients", "seed", "outage", "skip")


@kvlease.command("demo")
@catch_errors
def demo() -> None:
    """Run the end-to-end demo."""
    click.echo("kvlease demo: not yet implemented (comes with the operations issue)")


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


class DrillCommand(click.Command):
    """``kvlease drill --help`` ends with every drill and what it checks."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        drills = drill_modules()
        formatter.write_paragraph()
        formatter.write_text("Drills:")
        with formatter.indentation():
            for name, path in drills.items():
                formatter.write_paragraph()
                formatter.write_text(f"{name}:")
                with formatter.indentation():
                    for i, paragraph in enumerate(drill_summary(path)):
                        if i:
                            formatter.write_paragraph()
                        formatter.write_text(paragraph)
        super().format_epilog(ctx, formatter)


def load_drill(name: str):
    """The module of drill ``name`` (``coordinator-failover`` or ``coordinator_failover``)."""
    if not DRILL_NAME.match(name):
        raise click.BadParameter(f"{name!r} is not a drill name (lower-case letters, digits, -)", param_hint="'NAME'")
    module = _load_plugin_module("drill_", name.replace("-", "_"))
    if module is None or not callable(getattr(module, "main", None)):
        known = ", ".join(drill_modules()) or "none yet"
        raise errors.InvalidRequestError(f"unknown drill {name!r} (available: {known})")
    return module


def _load_plugin_module(prefix: str, name: str):
    module_name = f"ops.{prefix}{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return None


@kvlease.command("drill", cls=DrillCommand)
@click.argument("name")
@click.option("--dir", "directory", metavar="D", help="Cluster directory (default: --cluster).")
@click.option("--rounds", type=click.IntRange(min=1), help="Faults to inject, one per round (per drill default).")
@click.option("--clients", type=click.IntRange(min=1), help="Lease client threads (lease drills; default 16).")
@click.option("--seed", type=int, help="Seed of the clients' random choices (default 0).")
@click.option("--outage", type=click.FloatRange(min=0.5), metavar="SECONDS",
              help="How long remote storage stays away (remote-outage; default 4).")
@click.option("--skip", multiple=True, metavar="NAME", help="A drill `all` leaves out (repeatable).")
@common_options
@pass_state
@catch_errors
def drill(state: State, name: str, directory: str | None, **given) -> None:
    """Run the failure drill NAME (ops/drill_NAME.py) against a local cluster: traffic through the
    public clients, one kind of fault, then its invariants checked. Prints a report (one JSON document
    with --json); exits 1 when an invariant broke."""
    module = load_drill(name)
    options = {key: value for key, value in given.items() if value not in (None, ())}
    accepted = getattr(module, "OPTIONS", None)
    if accepted is not None:
        for key in options:
            if key not in accepted:
                raise click.UsageError(f"drill {name} takes no --{key}")
    code = module.main(cluster_dir(state, directory), json_output=state.json_mode, **options)
    if isinstance(code, int) and code:
        click.get_current_context().exit(code)
