"""The drills' invariants as pure checkers: what a drill observed in, a :class:`~kvlease.ops.drills.Check` out.

No cluster, clock or I/O in here: a drill records what it did and what it read
back (frozen records below), and each checker compares. Tests feed them planted
violations. Outcomes of calls are three-valued: ``ok`` (acknowledged: it must
hold exactly), ``not_found`` (a definite "no such lease"), ``unknown`` (the
answer was lost or an error came back: it may or may not have been applied).

Lease models are sets of possibilities (:class:`Possible`): a lease may be
absent and/or present with a deadline in ``[lo, hi]`` and, per bucket, one of a
set of snapshot ids (``None``: not held). An acknowledged call narrows it to
what the answer says; an unknown one widens it to "before or after". A lease
read back must be one of the possibilities, and every source (the active
coordinator's describe and list, ZooKeeper + files) must agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from kvlease.common.model import TableBucket
from kvlease.ops.check import Check
from kvlease.ops.drills.zk_txnlog import Txn

OK, NOT_FOUND, UNKNOWN = "ok", "not_found", "unknown"

#: A lease as read back: ``(expiration_time ms, {bucket: snapshot_id})``; None: no such lease.
LeaseView = tuple[int, Mapping[TableBucket, int]]


def bucket_name(tb: TableBucket) -> str:
    return f"{tb.table_id}/{tb.bucket}" if tb.partition_id is None else f"{tb.table_id}/p{tb.partition_id}/{tb.bucket}"


def show_view(view: LeaseView | None) -> str:
    if view is None:
        return "no lease"
    expiration, buckets = view
    held = ", ".join(f"{bucket_name(tb)}={sid}" for tb, sid in sorted(buckets.items(), key=lambda i: i[0].sort_key()))
    return f"deadline {expiration}, {{{held}}}"


# -- leases: the calls, and what they allow -------------------------------------------------------------


@dataclass(frozen=True)
class LeaseOp:
    """One lease call of a drill client and what came of it (wall-clock seconds ``t0``..``t1``)."""

    lease_id: str
    kind: str  # acquire | renew | release | drop
    t0: float
    t1: float
    outcome: str  # OK | NOT_FOUND | UNKNOWN
    duration_ms: int = 0
    snapshots: Mapping[TableBucket, int] = field(default_factory=dict)  # acquire: asked for
    bucket: TableBucket | None = None  # release: the bucket
    expiration: int = 0  # acquire / renew answer
    acquired: Mapping[TableBucket, int] = field(default_factory=dict)  # acquire answer
    remains: bool = False  # release answer: lease_remains
    error: str = ""  # the error's type name (NOT_FOUND / UNKNOWN)
    address: str = ""  # the coordinator that answered (OK)


@dataclass(frozen=True)
class Present:
    lo: int
    hi: int
    buckets: Mapping[TableBucket, frozenset]  # a bucket missing here: certainly not held

    def get(self, tb: TableBucket) -> frozenset:
        return self.buckets.get(tb, frozenset({None}))


@dataclass(frozen=True)
class Possible:
    """What a lease may be now: absent (``may_be_absent``) and/or like ``present``."""

    may_be_absent: bool = True
    present: Present | None = None

    def admits(self, view: LeaseView | None) -> bool:
        if view is None:
            return self.may_be_absent
        if self.present is None:
            return False
        expiration, held = view
        p = self.present
        return p.lo <= expiration <= p.hi and all(held.get(tb) in p.get(tb) for tb in set(held) | set(p.buckets))

    def describe(self) -> str:
        parts = ["no lease"] if self.may_be_absent else []
        if self.present is not None:
            p = self.present
            when = str(p.lo) if p.lo == p.hi else f"{p.lo}..{p.hi}"
            held = ", ".join(f"{bucket_name(tb)}∈{sorted(s, key=lambda x: (x is not None, x or 0))}"
                             if len(s) > 1 else f"{bucket_name(tb)}={next(iter(s))}"
                             for tb, s in sorted(p.buckets.items(), key=lambda i: i[0].sort_key()) if s != {None})
            parts.append(f"deadline {when}, {{{held}}}")
        return " or ".join(parts) or "nothing (contradictory history)"


ABSENT = Possible(True, None)


def _join(a: Possible, b: Possible) -> Possible:
    if a.present is None or b.present is None:
        return Possible(a.may_be_absent or b.may_be_absent, a.present or b.present)
    pa, pb = a.present, b.present
    buckets = {tb: pa.get(tb) | pb.get(tb) for tb in set(pa.buckets) | set(pb.buckets)}
    return Possible(a.may_be_absent or b.may_be_absent, Present(min(pa.lo, pb.lo), max(pa.hi, pb.hi), buckets))


def _deadline(t: float, duration_ms: int, late: bool = False) -> int:
    return int(t * 1000) + (1 if late else 0) + duration_ms


def _applied(state: Possible, op: LeaseOp) -> Possible:
    """Every state ``op`` may leave when applied to ``state`` at some time in ``[t0, t1]``."""
    lo, hi = _deadline(op.t0, op.duration_ms), _deadline(op.t1, op.duration_ms, late=True)
    p = state.present
    if op.kind == "acquire":
        asked = {tb: frozenset({sid, None}) for tb, sid in op.snapshots.items()}  # None: it was unavailable
        out = Possible(True, Present(lo, hi, asked)) if state.may_be_absent else Possible(False, None)
        if p is not None:
            merged = dict(p.buckets)
            merged.update({tb: p.get(tb) | {sid} for tb, sid in op.snapshots.items()})
            out = _join(out, Possible(False, Present(lo, hi, merged)))
        return out
    if op.kind == "renew":
        return Possible(False, replace(p, lo=lo, hi=hi)) if p is not None else Possible(False, None)
    if op.kind == "release":
        freed = Possible(True, None)
        if p is None:
            return freed
        return _join(freed, Possible(False, replace(p, buckets={**p.buckets, op.bucket: frozenset({None})})))
    return ABSENT  # drop


def step(state: Possible, op: LeaseOp) -> tuple[Possible, str | None]:
    """The lease after ``op``, and a violation if the answer contradicts every possibility."""
    if op.outcome == UNKNOWN:
        return _join(state, _applied(state, op)), None
    p = state.present
    if op.kind == "acquire":
        if not op.expiration:  # nothing acquired and nothing held: no lease
            if state.may_be_absent and not op.acquired:
                return ABSENT, None
            return ABSENT, f"acquire answered no lease, but it was {state.describe()}"
        exact = {tb: frozenset({sid}) for tb, sid in op.acquired.items()}
        options = []
        if state.may_be_absent:
            options.append(Possible(False, Present(op.expiration, op.expiration, exact)))
        if p is not None:
            options.append(Possible(False, Present(op.expiration, op.expiration, {**p.buckets, **exact})))
        if not options:  # a contradictory history (reported already): take the answer as it is
            options.append(Possible(False, Present(op.expiration, op.expiration, exact)))
        out = options[0] if len(options) == 1 else _join(*options)
        unasked = set(op.acquired) - set(op.snapshots)
        changed = {tb for tb, sid in op.acquired.items() if op.snapshots.get(tb) != sid}
        if unasked or changed:
            return out, f"acquire of {show_view((0, op.snapshots))} answered {show_view((op.expiration, op.acquired))}"
        return out, None
    if op.kind == "renew":
        if op.outcome == NOT_FOUND:
            return ABSENT, None if state.may_be_absent else f"renew found no lease, but it was {state.describe()}"
        if p is None:
            return ABSENT, "renew succeeded, but the lease was dropped"
        return Possible(False, replace(p, lo=op.expiration, hi=op.expiration)), None
    if op.kind == "release":
        if p is None:
            return ABSENT, None if not op.remains else "release says the lease remains, but it was dropped"
        left = {**p.buckets, op.bucket: frozenset({None})}
        if op.remains:
            if not any(s - {None} for s in left.values()):
                return ABSENT, (f"release of {bucket_name(op.bucket)} says the lease remains, "
                                f"but it was {state.describe()}")
            return Possible(False, replace(p, buckets=left)), None
        if state.may_be_absent or all(None in s for s in left.values()):
            return ABSENT, None
        return ABSENT, f"release of {bucket_name(op.bucket)} says the lease is gone, but it was {state.describe()}"
    return ABSENT, None  # drop: acknowledged (dropped or not, no lease now)


def replay(ops: Sequence[LeaseOp]) -> tuple[Possible, list[str]]:
    """The possibilities after one lease's calls (in the order its client made them) and the contradictions."""
    state, contradictions = ABSENT, []
    for op in ops:
        state, problem = step(state, op)
        if problem:
            contradictions.append(f"{op.kind} at {op.t1:.3f}: {problem}")
    return state, contradictions


def leases_as_acknowledged(history: Mapping[str, Sequence[LeaseOp]],
                           readbacks: Mapping[str, Mapping[str, LeaseView | None]]) -> Check:
    """Every lease reads back, from every source (e.g. ``describe``, ``list``, ``zookeeper+files``),
    as its acknowledged calls say, and the sources agree. A lease missing from a source's map is read
    as "no lease" there; leases a source shows that no client touched are violations too."""
    violations: list[str] = []
    for lease_id in sorted(history):
        possible, contradictions = replay(history[lease_id])
        violations += [f"lease {lease_id}: {c}" for c in contradictions]
        seen = {source: views.get(lease_id) for source, views in readbacks.items()}
        for source, view in seen.items():
            if not possible.admits(view):
                violations.append(f"lease {lease_id}: {source} reads {show_view(view)}, acknowledged calls "
                                  f"allow {possible.describe()}")
        if len({show_view(v) for v in seen.values()}) > 1:
            violations.append(f"lease {lease_id}: sources disagree: "
                              + "; ".join(f"{s}: {show_view(v)}" for s, v in seen.items()))
    for source, views in readbacks.items():
        for lease_id in sorted(set(views) - set(history)):
            if views[lease_id] is not None:
                violations.append(f"lease {lease_id}: {source} shows it, but no client acquired it")
    return Check.of("acknowledged leases read back as acknowledged (" + ", ".join(readbacks) + ")",
                    violations, checked=len(history))


# -- snapshot files ---------------------------------------------------------------------------------------


def leased_files_exist(leased: Mapping[tuple[TableBucket, int], Iterable[str]],
                       manifests: Mapping[tuple[TableBucket, int], Sequence[str] | None],
                       existing: Iterable[str]) -> Check:
    """Every file of every snapshot a lease holds exists: its ``_METADATA`` manifest (``manifests``
    maps each leased snapshot to the files its manifest lists, None if the manifest is gone) and each
    file the manifest names (``existing``: the remote files found)."""
    present = set(existing)
    violations, checked = [], 0
    for (tb, sid), holders in sorted(leased.items(), key=lambda i: (i[0][0].sort_key(), i[0][1])):
        who = ", ".join(sorted(holders))
        files = manifests.get((tb, sid))
        checked += 1
        if files is None:
            violations.append(f"snapshot {sid} of bucket {bucket_name(tb)} (leased by {who}): manifest is gone")
            continue
        for path in files:
            checked += 1
            if path not in present:
                violations.append(f"snapshot {sid} of bucket {bucket_name(tb)} (leased by {who}): {path} is gone")
    return Check.of("no file of a leased snapshot deleted", violations, checked)


# -- lease files and ZooKeeper pointers -----------------------------------------------------------------------


@dataclass(frozen=True)
class PointerSample:
    """The lease nodes' file pointers and the lease files that existed, read at one moment (``when``)."""

    when: str
    pointers: Mapping[str, Sequence[str]]  # lease id -> metadata paths its node names
    existing: frozenset[str]


def pointers_resolve(samples: Sequence[PointerSample]) -> Check:
    """ZooKeeper never points at a missing file: in every sample, every path a lease node names exists."""
    violations, checked = [], 0
    for sample in samples:
        for lease_id, paths in sorted(sample.pointers.items()):
            for path in paths:
                checked += 1
                if path not in sample.existing:
                    violations.append(f"{sample.when}: lease {lease_id} points at {path}, which does not exist")
    return Check.of("ZooKeeper never points at a missing lease file", violations, checked)


def no_orphan_files(listed: Iterable[str], pointers: Mapping[str, Sequence[str]]) -> Check:
    """Every lease file on remote storage is one a lease node names (after the coordinator's cleanup)."""
    referenced = {path for paths in pointers.values() for path in paths}
    files = sorted(set(listed))
    return Check.of("no orphan lease file left after recovery",
                    [f"{path}: no lease node points at it" for path in files if path not in referenced], len(files))


# -- fencing: who wrote ZooKeeper --------------------------------------------------------------------------------

FENCED = ("/databases", "/tables", "/snapshots", "/leases")
#: Created empty (``ensure_path``) by any coordinator at start, before any epoch.
CONTAINERS = ("/databases", "/tables", "/snapshots", "/leases", "/leases/kv_snapshot")
EPOCH = "/coordinators/epoch"


def no_deposed_writes(txns: Sequence[Txn], root: str, since_zxid: int = 0) -> Check:
    """No write accepted from a deposed coordinator, as ZooKeeper's transaction log shows it.

    The epoch holder is the session that last set ``/coordinators/epoch``.
    Every committed create/set/delete of a table, snapshot or lease node
    (``FENCED``, but the empty containers) must be part of a multi-op whose
    version check names the epoch's current version, and come from the
    holder's session. ``txns`` are in zxid order from the cluster's start
    (to know the holder); writes before ``since_zxid`` are not judged.
    """
    root = root.rstrip("/")
    epoch_path = root + EPOCH
    fenced = tuple(root + p for p in FENCED)
    containers = {root + p for p in CONTAINERS}
    holder, version = None, None
    violations, checked = [], 0
    for txn in txns:
        check = next((op.version for op in txn.ops if op.kind == "check" and op.path == epoch_path), None)
        for op in txn.ops:
            if op.path == epoch_path and op.kind in ("create", "set"):
                holder, version = txn.session, op.version or 0
                continue
            if op.kind == "check" or not any(op.path == p or op.path.startswith(p + "/") for p in fenced):
                continue
            if op.kind == "create" and op.path in containers:
                continue
            if txn.zxid < since_zxid:
                continue
            checked += 1
            where = f"zxid {txn.zxid:#x}: {op.kind} {op.path[len(root):]} by session {txn.session:#x}"
            if holder is None:
                violations.append(f"{where} before any coordinator took an epoch")
            elif txn.session != holder:
                violations.append(f"{where}, but epoch version {version} was held by session {holder:#x}")
            elif check is None:
                violations.append(f"{where} without the epoch check (unfenced)")
            elif check != version:
                violations.append(f"{where} checked epoch version {check}, but it was {version}")
    return Check.of("no write accepted from a deposed coordinator (ZooKeeper transaction log)", violations, checked)


# -- calls that fail, and recovery --------------------------------------------------------------------------------

UNTYPED = ("KvLeaseError", "UnknownServerError")


def failures_clean(ops: Sequence[LeaseOp], bound_s: float) -> Check:
    """Every call ended within ``bound_s`` and every failure is a typed kvlease error (a specific
    class: not the root, not "unknown server error", not a Python exception)."""
    violations = []
    for op in ops:
        took = op.t1 - op.t0
        if took > bound_s:
            violations.append(f"lease {op.lease_id}: {op.kind} took {took:.1f}s (bound {bound_s:g}s)")
        if op.outcome == UNKNOWN and (op.error in UNTYPED or op.error.startswith("internal:")):
            violations.append(f"lease {op.lease_id}: {op.kind} failed with an untyped error: {op.error}")
    return Check.of(f"calls fail cleanly (typed errors, none longer than {bound_s:g}s)", violations, len(ops))


def recovered(recovery_s: Sequence[float | None], bound_s: float, what: str = "an acquire succeeds") -> Check:
    """After every fault (one entry per round) service came back within ``bound_s``."""
    violations = [f"round {i + 1}: {what} only after {r:.1f}s" if r is not None else
                  f"round {i + 1}: nothing within {bound_s:g}s" for i, r in enumerate(recovery_s)
                  if r is None or r > bound_s]
    return Check.of(f"{what} within {bound_s:g}s of each fault", violations, len(recovery_s))
