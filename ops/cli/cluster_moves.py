"""``kvlease cluster decommission|recommission|rebalance|reassignments``: moving bucket replicas between tablet
servers.

They talk to the active coordinator (``--cluster`` or ``--bootstrap``), like the
table commands; the moves are the coordinator's (``client/moves_admin.py``).
``--wait`` polls the moves in progress until the ones started are done, with
progress on stderr; past ``--timeout`` it is an error (the moves go on). A
decommissioned server takes no new replicas until ``cluster recommission``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import click

from kvlease.common import errors
from kvlease.ops.cli.app import State, catch_errors, common_options, pass_state
from kvlease.ops.cli.cluster import cluster_group
from kvlease.ops.cli.values import POSITIVE_DURATION, int64

#: How often --wait asks for the moves in progress.
POLL_S = 0.5


def move_key(move: dict) -> tuple[str, str | None, int]:
    """What a move moves: (table path, partition name or None, bucket)."""
    return move["table"], move.get("partition"), move["bucket"]


def move_text(move: dict) -> str:
    """One move, for people: ``db.t/0: to [3, 1], leaving [2] (waiting for 3 to catch up)`` (a partition's bucket:
    ``db.t/20261127/0: …``)."""
    where = f"{move['table']}/{move['partition'] + '/' if move.get('partition') else ''}{move['bucket']}"
    if move["state"] == "done":
        return f"{where}: on {move['target']} (no move in progress)"
    waiting = f"waiting for {', '.join(map(str, move['waiting']))} to catch up" if move["waiting"] else "completing"
    return f"{where}: to {move['target']}, leaving {move['removing']} ({waiting})"


def wait_for_moves(state: State, keys: Iterable[tuple[str, str | None, int]], timeout_ms: int,
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """Until none of ``keys`` (:func:`move_key`) is being moved; progress on stderr (text mode).
    InvalidRequestError naming what is left once ``timeout_ms`` passed."""
    keys = set(keys)
    deadline = time.monotonic() + timeout_ms / 1000.0
    shown = None
    while True:
        left = [m for m in state.client.list_reassignments() if move_key(m) in keys]
        if not left:
            return
        progress = f"{len(left)} move(s) in progress; " + "; ".join(move_text(m) for m in left[:5])
        if progress != shown and not state.json_mode:
            click.echo(f"{progress} …", err=True)
            shown = progress
        if time.monotonic() >= deadline:
            raise errors.InvalidRequestError(
                f"{len(left)} move(s) not complete within the --timeout (they go on; `kvlease cluster "
                f"reassignments` shows them): " + "; ".join(move_text(m) for m in left[:5]))
        sleep(POLL_S)


def _moves_summary(moves: list[dict]) -> str:
    return "; ".join(move_text(m) for m in moves[:20]) + (f" and {len(moves) - 20} more" if len(moves) > 20 else "")


@cluster_group.command("decommission")
@click.option("--tablet", "tablet_id", type=int64(), required=True, metavar="ID",
              help="The tablet server to empty (live, or gone for good).")
@click.option("--wait", is_flag=True, help="Wait until every replica left it.")
@click.option("--timeout", "timeout_ms", type=POSITIVE_DURATION, default="30m", show_default=True,
              help="How long --wait waits.")
@common_options
@pass_state
@catch_errors
def cluster_decommission(state: State, tablet_id: int, wait: bool, timeout_ms: int) -> None:
    """Move every bucket replica off a tablet server to the least loaded live ones (each new replica copies
    its bucket and joins the ISR, then the server leaves it and deletes its copy), and mark it decommissioned:
    no new table, rebalance or move places a replica on it until `cluster recommission`. Safe to run again:
    it answers the moves in progress. Nothing starts if a bucket cannot move (no other live server with room,
    or none of its replicas live: for a server gone for good, `bucket restore --accept-data-loss --tablet N`
    brings such a bucket back)."""
    moves = state.client.decommission_tablet(tablet_id)
    if wait and moves:
        wait_for_moves(state, [move_key(m) for m in moves], timeout_ms)
    doc = {"tablet": tablet_id, "moves": moves, "waited": wait}
    if not moves:
        text = f"tablet server {tablet_id} holds no bucket replica: nothing to move (decommissioned)"
    elif wait:
        text = f"tablet server {tablet_id} decommissioned: {len(moves)} replica(s) moved off it"
    else:
        text = (f"decommissioning tablet server {tablet_id}: {len(moves)} move(s) in progress: "
                f"{_moves_summary(moves)}")
    state.output.message(text, doc)


@cluster_group.command("recommission")
@click.option("--tablet", "tablet_id", type=int64(), required=True, metavar="ID",
              help="The decommissioned tablet server to take new replicas again.")
@common_options
@pass_state
@catch_errors
def cluster_recommission(state: State, tablet_id: int) -> None:
    """Let a decommissioned tablet server take new replicas again (new tables, `cluster rebalance`, moves).
    Moves already started off it go on. Safe to run again."""
    was = state.client.recommission_tablet(tablet_id)
    if was:
        text = (f"tablet server {tablet_id} recommissioned: it takes new replicas again (`kvlease cluster "
                f"rebalance` moves replicas to it)")
    else:
        text = f"tablet server {tablet_id} is not decommissioned: nothing to change"
    state.output.message(text, {"tablet": tablet_id, "was_decommissioned": was})


@cluster_group.command("rebalance")
@click.option("--leaders", "leaders_only", is_flag=True,
              help="Only the leaders: spread the preferred leaders and elect them; no replica moves.")
@click.option("--wait", is_flag=True, help="Wait until the moves started are complete.")
@click.option("--timeout", "timeout_ms", type=POSITIVE_DURATION, default="30m", show_default=True,
              help="How long --wait waits.")
@common_options
@pass_state
@catch_errors
def cluster_rebalance(state: State, leaders_only: bool, wait: bool, timeout_ms: int) -> None:
    """Even out bucket replicas over the live tablet servers (e.g. after servers joined), spread the buckets'
    preferred leaders (their first replica: a replica list is reordered, no data moves) and move each leader
    back to its bucket's preferred replica when that one is live and in sync (e.g. after a restart). With
    --leaders only the leaders. Safe to run again: a balanced cluster starts nothing."""
    started = state.client.rebalance(leaders_only=leaders_only)
    moves = [m for m in started if m["kind"] == "move"]
    leaders = [m for m in started if m["kind"] == "leader"]
    if wait and moves:
        wait_for_moves(state, [move_key(m) for m in moves], timeout_ms)
    parts = []
    if moves:
        parts.append(f"{len(moves)} replica move(s) {'done' if wait else 'started'}: {_moves_summary(moves)}")
    if leaders:
        parts.append(f"{len(leaders)} bucket(s) led by their preferred replica: " + ", ".join(
            leader_text(m) for m in leaders[:20]) + (f" and {len(leaders) - 20} more" if len(leaders) > 20 else ""))
    balanced = "the leaders are balanced" if leaders_only else "the cluster is balanced"
    text = "; ".join(parts) if parts else f"{balanced}: nothing to move"
    state.output.message(text, {"moves": moves, "leaders": leaders, "waited": wait})


def leader_text(change: dict) -> str:
    """One leader change: ``db.t/0 2 -> 1``, or ``db.t/0 2 (now preferred)`` when its leader became its
    preferred replica (its replica list reordered)."""
    where = f"{change['table']}/{change['bucket']}"
    if change["old_leader"] == change["new_leader"]:
        return f"{where} {change['new_leader']} (now preferred)"
    return f"{where} {change['old_leader']} -> {change['new_leader']}"


@cluster_group.command("reassignments")
@common_options
@pass_state
@catch_errors
def cluster_reassignments(state: State) -> None:
    """The bucket moves in progress: where each goes and which new replicas have not caught up yet."""
    moves = state.client.list_reassignments()
    text = f"{len(moves)} move(s) in progress: {_moves_summary(moves)}" if moves else "no move in progress"
    state.output.message(text, {"moves": moves})
