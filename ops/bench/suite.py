"""The benchmark suite: one interface for every benchmark module of ``ops/bench/``, the runner, the table.

``kvlease bench NAME [--json] [--plot FILE.png] [OPTIONS]`` and ``python -m
ops.bench.NAME [...]`` both come here (:func:`main`). NAME is one of
:data:`SUITE` or ``all`` (every one of them, one after another, in this
process). A benchmark module provides:

- ``OPTIONS``: a tuple of :class:`Option`, its knobs (``--rows`` …); an
  option's flag names the keyword of ``run`` (``--raw-writes`` ->
  ``raw_writes``) and carries the default;
- ``run(*, progress, **options) -> dict``: starts what it needs, measures
  kvlease and its anchor in the same run, stops everything it started, and
  returns the figures (JSON-able); ``progress(text)`` tells what it is doing;
- ``target_rows(figures) -> list[Row]``: what the targets judge (pure);
- ``report(figures) -> str``: the detailed text report.

Output: the text report of each benchmark, then one table of its rows (for
``all``, one combined table); with ``--json`` exactly one JSON document,
``{"machine": {...}, "benchmarks": {NAME: {"options", "figures", "rows"} or
{"options", "error"}}}`` (rows as :meth:`Row.doc` writes them). ``--plot`` draws the rows
(:mod:`kvlease.ops.bench.plot`). Progress goes to stderr. Bad options raise
:class:`UsageError` before anything runs. A benchmark that fails under
``all`` is recorded as an error and the others still run; the exit code is
then 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from kvlease.common import errors
from kvlease.ops.bench.machine import machine

#: name -> what it measures (the ``kvlease bench --help`` line); ``all`` runs them in this order.
SUITE = {
    "leases": "lease acquires/s vs raw ZooKeeper creates/s; coordinator failover vs the session timeout",
    "writes": "PutKv upserts/s vs raw RocksDB WriteBatch rows/s; lookups; incremental snapshot size",
    "scan": "live scans (unary, stream) rows/s vs raw RocksDB iteration; tablet server peak RSS",
    "bootstrap": "Spark batch read of a table vs Spark reading the same rows from Parquet; streaming tail",
    "replication": "upserts/s at replication factor 3 vs 1; write latency; tablet failover, 1M rows vs 10k",
    "rebuild": "rebuild of a wiped replica from the remote snapshot + a changelog tail vs a plain download",
    "partitions": "1,000 partitions: coordinator failover, idle loop CPU and lease acquire --latest vs one "
                  "table; retention dropping 100 at once",
    "lookups": "point lookups rows/s; with --prefix, prefix lookups of the same rows and their ratio",
    "freshness": "change feed: ms from a write's acknowledgement to a long-polling log reader (RF 1, 3) and to Spark",
}
#: name -> its module (the registry: a new benchmark is a module of ``ops/bench/`` and a line here and in SUITE).
MODULES = {"leases": "kvlease.ops.bench.leases", "writes": "kvlease.ops.bench.writes", "scan": "kvlease.ops.bench.scan",
           "bootstrap": "kvlease.ops.bench.bootstrap", "replication": "kvlease.ops.bench.replication",
           "rebuild": "kvlease.ops.bench.rebuild", "partitions": "kvlease.ops.bench.partitions",
           "lookups": "kvlease.ops.bench.lookups",
           "freshness": "kvlease.ops.bench.freshness"}
ALL = "all"
MB = 1 << 20

Progress = Callable[[str], None]


class UsageError(errors.InvalidRequestError):
    """A bad benchmark name or option; raised before anything runs."""


# -- options ----------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = _whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{errors.show(text)} is not positive")
    return value


def non_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{errors.show(text)} is not a whole number >= 0")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{errors.show(text)} is not a whole number") from None


def at_least(low: int, why: str) -> Callable[[str], int]:
    """An option type: a whole number of at least ``low`` (``why`` says why in the error)."""
    def parse(text: str) -> int:
        value = positive_int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{errors.show(text)} is below {low:,}: {why}")
        return value
    parse.__name__ = f"at_least_{low}"
    return parse


def at_most(high: int, why: str) -> Callable[[str], int]:
    """An option type: a positive whole number of at most ``high`` (``why`` says why in the error)."""
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{errors.show(text)} is above {high:,}: {why}")
        return value
    parse.__name__ = f"at_most_{high}"
    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{errors.show(text)} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{errors.show(text)} is not a positive number")
    return value


def plot_path(text: str) -> str:
    """A ``.png`` file in a directory that exists and is writable (checked before a long run)."""
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{errors.show(text)} is not a .png file name")
    directory = path.parent
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(f"directory {errors.show(str(directory))} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{errors.show(text)} is a directory")
    existed = path.exists()
    try:  # writing it is the check: os.access says yes to root even where nothing can be created (/proc)
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {errors.show(text)}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)
    return text


@dataclass(frozen=True)
class Option:
    """A benchmark's knob: ``--rows N``, passed to its ``run`` as ``rows=``; ``type=bool``: a switch (``--secure``)."""

    flag: str
    type: Callable[[str], Any]
    default: Any
    help: str
    metavar: str = "N"

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


def _default_text(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}" if isinstance(value, float) else str(value)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors raise :class:`UsageError` (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see --help)")


def parser(name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of benchmark ``name`` (or ``all``: every benchmark's options, each passed to
    the benchmarks that have it). Options not given are left out of the namespace."""
    names = benchmark_names(name)
    prog = prog or f"kvlease bench {name}"
    if name == ALL:
        description = "Every benchmark, one after another in one process, then one combined table:\n" + "\n".join(
            f"  {n:<10} {SUITE[n]}" for n in names)
        epilog = ("An option goes to every benchmark that has it; the others keep their defaults.\n"
                  "`kvlease bench NAME --help` says what each measures.")
    else:
        module = _module(name)
        description = f"{SUITE[name]}.\n" + (module.__doc__ or "").split("\n", 1)[-1]
        epilog = None
    p = _Parser(prog=prog, description=description, epilog=epilog, allow_abbrev=False,
                formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print exactly one JSON document (the figures) on stdout")
    p.add_argument("--plot", type=plot_path, metavar="FILE.png",
                   help="draw each ratio against its target into FILE.png (checked before the run)")
    by_flag: dict[str, list[tuple[str, Option]]] = {}
    for n in names:
        for option in _module(n).OPTIONS:
            by_flag.setdefault(option.flag, []).append((n, option))
    for flag, owners in by_flag.items():
        switch = owners[0][1].type is bool  # --secure: off unless given, no default to show
        if len(names) == 1:
            option = owners[0][1]
            text = option.help if switch else f"{option.help} (default: {_default_text(option.default)})"
        else:
            text = "; ".join(f"{n}: {o.help}" + ("" if switch else f" (default {_default_text(o.default)})")
                             for n, o in owners)
        if switch:
            p.add_argument(flag, action="store_true", help=text)
        else:
            p.add_argument(flag, type=owners[0][1].type, metavar=owners[0][1].metavar, help=text)
    return p


def benchmark_names(name: str) -> tuple[str, ...]:
    """The benchmarks ``name`` stands for: itself, or for ``all`` every one of :data:`SUITE` in order."""
    if name == ALL:
        return tuple(SUITE)
    if name in SUITE:
        return (name,)
    raise UsageError(f"unknown benchmark {name!r} (available: {', '.join([*SUITE, ALL])})")


def _module(name: str):
    """The module of a name in :data:`SUITE` (imported on first use: numpy, Spark …)."""
    return importlib.import_module(MODULES[name])


def options_for(module, given: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``module.run``: its defaults, overridden by the given options it has."""
    return {o.dest: given.get(o.dest, o.default) for o in module.OPTIONS}


# -- rows: what the targets judge -------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One judged figure: ``value`` (``measured / anchor``, or ``measured`` itself for a limit) against ``target``.

    ``unit`` is that of ``measured`` and ``anchor``; ``value_unit`` that of
    ``value`` and ``target`` (``""``: a ratio). ``at_most``: the target is an
    upper bound (``value <= target``), else a lower one (``value >= target``).
    """

    metric: str
    measured: float
    anchor: float | None
    unit: str
    value: float
    target: float
    at_most: bool = False
    value_unit: str = ""

    @classmethod
    def ratio(cls, metric: str, measured: float, anchor: float, unit: str, target: float) -> "Row":
        """kvlease's ``measured`` over its ``anchor``, at least ``target``."""
        return cls(metric, measured, anchor, unit, measured / anchor if anchor else 0.0, target)

    @classmethod
    def limit(cls, metric: str, measured: float, anchor: float | None, unit: str, target: float) -> "Row":
        """``measured`` itself, at most ``target`` (same unit)."""
        return cls(metric, measured, anchor, unit, measured, target, at_most=True, value_unit=unit)

    @property
    def met(self) -> bool:
        return self.value <= self.target if self.at_most else self.value >= self.target

    def doc(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> "Row":
        return cls(**{f.name: doc[f.name] for f in fields(cls)})

    def figures(self) -> tuple[str, str, str, str]:
        """Its measured value, anchor, ratio (or value) and target as the tables show them (the text table of
        ``kvlease bench``, the README's)."""
        return (figure_text(self.measured, self.unit), figure_text(self.anchor, self.unit),
                figure_text(self.value, self.value_unit),
                f"{'<=' if self.at_most else '>='} {figure_text(self.target, self.value_unit)}")


def figure_text(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def table_lines(doc: dict[str, Any]) -> list[str]:
    """The rows of every benchmark in ``doc`` as an aligned text table; a failed benchmark's error below it."""
    header = ("benchmark", "metric", "measured", "anchor", "ratio", "target", "met")
    lines, failures = [header], []
    for name, entry in doc["benchmarks"].items():
        if "error" in entry:
            lines.append((name, "(failed, see below)", "", "", "", "", "NO"))
            failures.append(f"{name}: error: {entry['error']}")
            continue
        for row in map(Row.from_doc, entry["rows"]):
            lines.append((name, row.metric, *row.figures(), "yes" if row.met else "NO"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines] + failures


# -- running ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    name: str
    entry: dict[str, Any]  # {"options", "figures", "rows"} or {"options", "error"}
    report: str = ""


def run_benchmarks(names: Sequence[str], given: dict[str, Any], progress: Progress,
                   keep_going: bool) -> Iterator[Result]:
    """Run ``names`` one after another; a failure is raised, or with ``keep_going`` recorded and the next runs."""
    for name in names:
        module = _module(name)
        options = options_for(module, given)
        progress(f"== bench {name}: " + ", ".join(f"{k}={_default_text(v)}" for k, v in options.items()))
        try:
            figures = module.run(progress=progress, **options)
        except Exception as exc:
            if not keep_going:
                raise
            progress(f"error: bench {name} failed: {type(exc).__name__}: {exc}")
            yield Result(name, {"options": options, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows = [row.doc() for row in module.target_rows(figures)]
        yield Result(name, {"options": options, "figures": figures, "rows": rows}, module.report(figures))


def main(name: str, argv: Sequence[str] = (), prog: str | None = None, json_output: bool = False) -> int:
    """Parse ``argv`` for benchmark ``name`` (or ``all``), run, print, plot; returns the exit code."""
    names = benchmark_names(name)
    args = vars(parser(name, prog).parse_args(list(argv)))
    json_mode = json_output or args.pop("json", False)
    plot_file = args.pop("plot", None)

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    doc: dict[str, Any] = {"machine": machine(), "benchmarks": {}}
    with _terminate_as_exit():
        for result in run_benchmarks(names, args, progress, keep_going=len(names) > 1):
            doc["benchmarks"][result.name] = result.entry
            if not json_mode and result.report:
                print(f"== {result.name} ==\n{result.report}\n", flush=True)
    doc["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(doc, indent=2) if json_mode else "\n".join(table_lines(doc)), flush=True)
    if plot_file:
        from kvlease.ops.bench.plot import plot

        plot(doc, plot_file)
        progress(f"plot written to {plot_file}")
    return 1 if any("error" in entry for entry in doc["benchmarks"].values()) else 0


@contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM ends a run as Ctrl-C does: the benchmark stops what it started and removes its temp
    directory on the way out (``SystemExit(143)``); a second SIGTERM during that clean-up is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, _frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("bench: terminated; stopping what it started", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def module_main(name: str) -> None:
    """``python -m kvlease.ops.bench.<name> [...]``: :func:`main` with ``sys.argv``; bad options are one line on stderr."""
    try:
        code = main(name, sys.argv[1:], prog=f"python -m kvlease.ops.bench.{name}")
    except UsageError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        code = 2
    raise SystemExit(code)
