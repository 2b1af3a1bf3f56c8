"""``kvlease demo``: the end-to-end demo (:mod:`kvlease.ops.demo`)."""

from __future__ import annotations

import json
import time

import click

from kvlease.ops import demo as demo_run
from kvlease.ops.cli.app import State, catch_errors, kvlease, pass_state


def _printer():
    started = time.monotonic()

    def progress(text: str) -> None:
        click.echo(f"[{time.monotonic() - started:6.1f}s] {text}", err=True)

    return progress


@kvlease.command("demo")
@click.option("--dir", "directory", metavar="D",
              help="Work in D (new or empty; kept afterwards). Default: a fresh temp dir, removed at the end "
                   "unless --keep.")
@click.option("--rows", type=click.IntRange(min=demo_run.MIN_ROWS), default=demo_run.DEFAULT_ROWS,
              show_default=True, help="Rows loaded before the snapshot; the writer then makes as many changes.")
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end and print how to use it.")
@click.option("--json", "json_flag", is_flag=True, help="Print the summary as one JSON document on stdout.")
@pass_state
@catch_errors
def demo(state: State, directory: str | None, rows: int, keep: bool, json_flag: bool) -> None:
    """Run the end-to-end demo (about a minute; needs no cluster).

    \b
    1. starts a local cluster: 1 ZooKeeper node, 2 coordinators, 2 tablet
       servers, file:// remote storage, in a temp dir (or --dir D);
    2. creates the table demo.orders (replication factor 2), loads --rows
       rows and snapshots it;
    3. starts a Spark streaming query that bootstraps from those snapshots
       under a lease, then tails the changelog, writing into Parquet,
       while a writer keeps inserting, updating and deleting rows;
    4. kills the active coordinator with -9 in the middle (the query holds
       and renews its lease meanwhile) and keeps going on the standby;
    5. while the query tails, kills with -9 the tablet server leading some
       buckets: the other replicas take over, the writer and the query go
       on; the killed server is started again and catches up;
    6. lets the query catch up, stops it, and checks that the Parquet change
       rows, applied in offset order, equal the table.

    Progress goes to stderr, then a summary (rows, snapshots leased and
    released, both failovers' times, PASS/FAIL with the first differences). Exits 1
    on FAIL. Everything it started is stopped at the end, also on failure or
    Ctrl-C (exit 130), unless --keep.
    """
    ctx = click.get_current_context()
    json_mode = json_flag or state.json_mode
    try:
        doc = demo_run.run_demo(directory, rows=rows, keep=keep, progress=_printer())
    except demo_run.Interrupted as exc:
        click.echo(f"demo interrupted: {exc.message}", err=True)
        ctx.exit(130)
    if json_mode:
        click.echo(json.dumps(doc))
    else:
        click.echo(demo_run.render(doc))
        if keep:
            click.echo(demo_run.keep_hint(doc))
    if not doc["ok"]:
        ctx.exit(1)
