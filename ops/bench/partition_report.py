"""The text report and the target rows of ``kvlease bench partitions`` (:mod:`kvlease.ops.bench.partitions`): pure
functions of its figures."""

from __future__ import annotations

from typing import Any

from kvlease.ops.bench.partition_phases import IDLE_TARGET, LATEST_TARGET
from kvlease.ops.bench.suite import Row


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def target_rows(figures: dict[str, Any]) -> list[Row]:
    s, f, r = figures["settings"], figures["failover"], figures["retention"]
    idle_one, idle_big = figures["idle"]["one_table"], figures["idle"]["big"]
    one, big = figures["lease_latest"]["one"], figures["lease_latest"]["big"]
    leases = f["leases"]
    return [
        Row.limit(f"failover, {s['partitions']:,} partitions", f["failover_s"], f["session_timeout_s"], "s",
                  f["target_s"]),
        Row.limit("leases lost or changed by the failover", leases["missing"] + leases["extra"] + leases["changed"],
                  leases["before"], "leases", 0),
        _ratio_at_most(f"idle loop CPU, {s['partitions']:,} partitions / one table", idle_big["loop_cpu_ms_per_s"],
                       idle_one["loop_cpu_ms_per_s"], "ms/s", IDLE_TARGET),
        _ratio_at_most(f"lease acquire --latest, {s['partitions']:,} partitions / one", big["median_total_ms"],
                       one["median_total_ms"], "ms", LATEST_TARGET),
        Row.limit(f"retention dropping {r['partitions']:,} partitions at once", r["gone_s"], None, "s", r["target_s"]),
    ]


def _ratio_at_most(metric: str, measured: float, anchor: float, unit: str, target: float) -> Row:
    """``measured / anchor``, at most ``target`` (a ratio; an anchor below 0.001 counts as 0.001)."""
    return Row(metric, measured, anchor, unit, measured / max(anchor, 0.001), target, at_most=True)


def report(figures: dict[str, Any]) -> str:
    s, c = figures["settings"], figures["create"]
    cpu = c["cpu_ms_per_partition"]
    lines = [
        f"kvlease bench partitions ({figures['host']['cpus']} CPUs; {s['partitions']:,} partitions x {s['buckets']} "
        f"buckets x RF {s['replication_factor']} = {figures['bucket_replicas']:,} bucket replicas on {s['tablets']} "
        f"tablet servers; 2 coordinators; session timeout {s['session_timeout_ms'] / 1000:g} s)",
        f"creating the partitions  {c['seconds']:.1f} s ({c['per_s']:.1f} /s; a create took "
        f"{c['first_tenth_mean_ms']:.1f} ms on average over the first tenth, {c['last_tenth_mean_ms']:.1f} ms over "
        f"the last; the coordinator idle again {c['settled_after_s']:.1f} s after the last)",
        "   CPU per partition: " + ", ".join(f"{role} {ms:.1f} ms" for role, ms in cpu.items())
        + f"; {c['isr_changes']:,} ISR changes meanwhile",
        f"   snapshot 1 of every bucket: {figures['initial_commits']['snapshots']:,} commits in "
        f"{figures['initial_commits']['seconds']:.1f} s",
        *_idle_lines(figures),
        *_latest_lines(figures),
        *_failover_lines(figures),
        *_retention_lines(figures),
    ]
    k = figures["committer"]
    lines.append(f"snapshots committed meanwhile: {k['commits']:,} in {k['seconds']:.0f} s ({k['per_s']:.1f} /s of "
                 f"{k['rate_asked_per_s']:g} asked; handles with a manifest, no data), {k['errors']} errors"
                 + (f" (first: {k['first_errors']})" if k["errors"] else ""))
    if "run_s" in figures:
        lines.append(f"run: {figures['run_s']:.0f} s end to end")
    return "\n".join(lines)


def _idle_lines(figures: dict[str, Any]) -> list[str]:
    one, big = figures["idle"]["one_table"], figures["idle"]["big"]
    row = target_rows(figures)[2]
    return [f"idle loop CPU   {big['loop_cpu_ms_per_s']:.3f} ms/s with the partitions vs "
            f"{one['loop_cpu_ms_per_s']:.3f} ms/s with one table: {row.value:.2f} x, target <= {IDLE_TARGET:g} x: "
            f"{_met(row.met)}",
            f"   whole coordinator process {big['process_cpu_ms_per_s']:.3f} vs "
            f"{one['process_cpu_ms_per_s']:.3f} ms/s; "
            f"each tablet server meanwhile {big['tablet_cpu_ms_per_s']:.0f} vs {one['tablet_cpu_ms_per_s']:.0f} ms/s; "
            f"ISR changes {big['isr_changes']} vs {one['isr_changes']} (sampled {big['seconds']:.1f} s each, after "
            f"the coordinator settled: {big['settled_after_s']:.0f} s vs {one['settled_after_s']:.0f} s)",
            f"   tablet servers (of {figures['bucket_replicas'] // figures['settings']['tablets']:,} replicas each): "
            + ", ".join(f"{t.get('buckets')} led, {t.get('open_buckets')} open of at most {t.get('max_open_buckets')}"
                        if "error" not in t else t["error"] for t in big.get("tablets", []))]


def _latest_lines(figures: dict[str, Any]) -> list[str]:
    one, big = figures["lease_latest"]["one"], figures["lease_latest"]["big"]
    row = target_rows(figures)[3]
    return [f"lease acquire --latest  {big['median_total_ms']:.1f} ms for {big['buckets']:,} buckets vs "
            f"{one['median_total_ms']:.1f} ms for {one['buckets']}: {row.value:.1f} x, target <= {LATEST_TARGET:g} x: "
            f"{_met(row.met)}",
            f"   medians of {len(big['rounds_ms'])}: CPU of the active coordinator "
            f"{big.get('median_coordinator_cpu_ms', 0):.0f} vs {one.get('median_coordinator_cpu_ms', 0):.0f} ms, of the "
            f"client {big.get('median_client_cpu_ms', 0):.0f} vs {one.get('median_client_cpu_ms', 0):.0f} ms; rounds "
            f"{big['rounds_ms']} vs {one['rounds_ms']} ms"]


def _failover_lines(figures: dict[str, Any]) -> list[str]:
    f = figures["failover"]
    leases = f["leases"]
    split = ""
    if "kill_to_elected_s" in f:
        split = f"; kill -> elected {f['kill_to_elected_s']:.3f} s" + (
            f", reinitialization {f['reinit_s']:.3f} s" if "reinit_s" in f else "")
    return [f"failover        {f['failover_s']:.3f} s, target <= {f['target_s']:g} s (session timeout + 2 s): "
            f"{_met(f['failover_s'] <= f['target_s'])}{split}",
            *([f"   {f['reinit_stats']}"] if "reinit_stats" in f else []),
            f"   leases after it: {'intact' if leases['intact'] else 'NOT intact'} ({leases['after']} of "
            f"{leases['before']} holding {f['lease_buckets']:,} buckets; missing {leases['missing']}, extra "
            f"{leases['extra']}, changed {leases['changed']})"]


def _retention_lines(figures: dict[str, Any]) -> list[str]:
    r = figures["retention"]
    made = r["created"]
    split = ""
    if "alter_to_first_drop_s" in r:
        split = (f"; alter -> first drop {r['alter_to_first_drop_s']:.2f} s, first -> last drop "
                 f"{r['first_to_last_drop_s']:.2f} s")
    return [f"retention       {r['partitions']} partitions dropped at once in {r['gone_s']:.2f} s, target <= "
            f"{r['target_s']:g} s: {_met(r['gone_s'] <= r['target_s'])} (check every {r['check_interval_s']:g} s"
            f"{split})",
            f"   made first by hand: {made['seconds']:.1f} s ({made['first_tenth_mean_ms']:.0f} -> "
            f"{made['last_tenth_mean_ms']:.0f} ms a create); CPU of the drops: "
            + ", ".join(f"{role} {sec:.1f} s" for role, sec in r["cpu_s"].items())]
