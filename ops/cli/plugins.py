"""``kvlease bench NAME`` (the benchmark suite) and ``kvlease drill NAME`` (plug-ins).

``kvlease bench NAME [ARGS…]`` hands NAME and everything after it to
:func:`kvlease.ops.bench.main`, which parses the benchmark's own options, runs
it and prints (and plots) the figures; a bad name or option is one line
``error: …`` and exit code 2, before anything runs.

Drills: ``kvlease drill NAME`` imports the module the drill registry
(:data:`kvlease.ops.drills.DRILLS`) names for NAME (``coordinator-failover`` is
``ops/drills/coordinator_failover.py``) and calls ``main(cluster_dir: str,
json_output: bool, **options)`` with the drill options given on the command
line (``--rounds``, …; a module that lists the ones it takes in ``OPTIONS``
gets a usage error for any other). An int
returned is the exit code (anything else means 0); a module prints its own
result (one JSON document when ``json_output``) and raises
:class:`kvlease.common.errors.KvLeaseError` for failures the CLI should report.
``kvlease drill --help`` lists the drills with the first two paragraphs of
each module's docstring (read, not imported), by name.
"""

from __future__ import annotations

import re

import click

from kvlease.common import errors
from kvlease.ops import bench as bench_suite
from kvlease.ops.cli.app import State, catch_errors, cluster_dir_options, kvlease, pass_state
from kvlease.ops.cli.cluster import cluster_dir
from kvlease.ops.drills import DRILLS, SkipError, check_skip, drill_module, drill_summary

DRILL_NAME = re.compile(r"[a-z][a-z0-9_-]*")  # fullmatch: "$" matches before a final newline
#: Drill options of the command line -> the keyword a drill's main() gets (given ones only).
DRILL_OPTIONS = ("rounds", "clients", "seed", "outage", "seconds", "skip")


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


class DrillCommand(click.Command):
    """``kvlease drill --help`` ends with every drill and what it checks."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_paragraph()
        formatter.write_text("Drills:")
        with formatter.indentation():
            for name in sorted(DRILLS):
                formatter.write_paragraph()
                formatter.write_text(f"{name}:")
                with formatter.indentation():
                    for i, paragraph in enumerate(drill_summary(name)):
                        if i:
                            formatter.write_paragraph()
                        formatter.write_text(paragraph)
        super().format_epilog(ctx, formatter)


def load_drill(name: str):
    """The module of drill ``name`` (``coordinator-failover`` or ``coordinator_failover``)."""
    if not DRILL_NAME.fullmatch(name):
        raise click.BadParameter(f"{errors.show(name)} is not a drill name (lower-case letters, digits, -)", param_hint="'NAME'")
    module = drill_module(name)
    if module is None:
        known = ", ".join(sorted(DRILLS))
        raise errors.InvalidRequestError(f"unknown drill {errors.show(name)} (available: {known})")
    return module


@kvlease.command("drill", cls=DrillCommand)
@click.argument("name")
@click.option("--dir", "directory", metavar="D", help="Cluster directory (default: --cluster).")
@click.option("--rounds", type=click.IntRange(min=1), help="Faults to inject, one per round (per drill default).")
@click.option("--clients", type=click.IntRange(min=1), help="Lease client threads (lease drills; default 16).")
@click.option("--seed", type=int, help="Seed of the clients' random choices (default 0).")
@click.option("--outage", type=click.FloatRange(min=0.5), metavar="SECONDS",
              help="How long remote storage stays away (remote-outage; default 4).")
@click.option("--seconds", type=click.FloatRange(min=5), metavar="SECONDS",
              help="How long the writers write (partitions; default 30).")
@click.option("--skip", multiple=True, metavar="NAME", help="A drill `all` leaves out (repeatable).")
@cluster_dir_options
@pass_state
@catch_errors
def drill(state: State, name: str, directory: str | None, **given) -> None:
    """Run the failure drill NAME (ops/drills/NAME.py) against a local cluster: traffic through the
    public clients, one kind of fault, then its invariants checked. Prints a report (one JSON document
    with --json); exits 1 when an invariant broke."""
    module = load_drill(name)
    options = {key: value for key, value in given.items() if value not in (None, ())}
    accepted = getattr(module, "OPTIONS", None)
    if accepted is not None:
        for key in options:
            if key not in accepted:
                raise click.UsageError(f"drill {name} takes no --{key}")
    if options.get("skip"):
        try:
            check_skip(options["skip"])
        except SkipError as exc:
            raise click.BadParameter(exc.message, param_hint="'--skip'") from None
    code = module.main(cluster_dir(state, directory), json_output=state.json_mode, **options)
    if isinstance(code, int) and code:
        click.get_current_context().exit(code)
