"""The text report and the target rows of ``kvlease bench leases`` (:mod:`kvlease.ops.bench.leases`): pure
functions of its figures."""

from __future__ import annotations

from typing import Any

from kvlease.ops.bench.lease_phases import FAILOVER_SLACK_S, SECURE_TARGET, TARGET_RATIO
from kvlease.ops.bench.suite import Row


def _secure_report(figures: dict[str, Any]) -> str:
    s, ratio = figures["settings"], figures["secure_to_plain"]
    lines = [f"kvlease bench leases --secure ({figures['host']['cpus']} CPUs; one coordinator each; "
             f"{s['threads']} threads; TLS + password + ACL checks vs none)"]
    for label, key in (("plain ", "plain"), ("secure", "secured")):
        a = figures[key]
        lines.append(f"{label}  acquire {a['per_s']:>9.1f} /s   p50 {a['p50_ms']} ms   p99 {a['p99_ms']} ms   "
                     f"({a['acquires']} leases in {a['seconds']:.1f} s, {a['errors']} errors)")
        if a["errors"]:
            lines.append(f"        errors (first): {a['first_errors']}")
    lines.append(f"secure/plain    {ratio['ratio']:>6.3f}      target >= {ratio['target']}: "
                 f"{'met' if ratio['met'] else 'NOT met'}")
    return "\n".join(lines)


def report(figures: dict[str, Any]) -> str:
    if figures.get("secure"):
        return _secure_report(figures)
    a, r, f, s = figures["acquire"], figures["raw_zookeeper"], figures["failover"], figures["settings"]
    ratio = figures["acquire_to_raw"]
    lines = [
        f"kvlease bench leases ({figures['host']['cpus']} CPUs; file:// remote, fsync {'on' if s['fsync'] else 'off'};"
        f" ZooKeeper session timeout {s['session_timeout_ms'] / 1000:g} s; 2 coordinator processes)",
        f"a. acquire        {a['per_s']:>9.1f} /s   p50 {a['p50_ms']} ms   p99 {a['p99_ms']} ms   "
        f"({a['acquires']} new leases by {s['threads']} threads sharing a client in {a['seconds']:.1f} s, "
        f"{a['errors']} errors)",
        f"b. raw ZooKeeper  {r['create_per_s']:>9.1f} creates/s   {r['set_per_s']:.1f} sets/s   "
        f"({r['writes']} pipelined, window {r['window']}; the faster of kazoo's stock handler "
        f"{r['by_handler']['stock']['create']:.1f} and PollHandler {r['by_handler']['poll']['create']:.1f} creates/s)",
        f"   acquire/raw    {ratio['ratio']:>9.3f}      target >= {ratio['target']}: "
        f"{'met' if ratio['met'] else 'NOT met'}",
        f"c. failover       {f['failover_s']:>9.3f} s    target <= {f['target_s']:g} s (session timeout + 2 s): "
        f"{'met' if f['met'] else 'NOT met'}",
        f"   {f['leases_held']} leases held, {f['leases_served_after']} served after; epoch "
        f"{f['epoch_before']} -> {f['epoch_after']}"
        + (f"; kill -> elected {f['kill_to_elected_s']:.3f} s" if "kill_to_elected_s" in f else "")
        + (f", reinitialization {f['reinit_s']:.3f} s" if "reinit_s" in f else ""),
    ]
    leases = f.get("leases")
    if leases:
        lines.append(f"   leases after the failover: {'intact' if leases['intact'] else 'NOT intact'} "
                     f"({leases['after']} of {leases['before']}; missing {leases['missing']}, extra {leases['extra']}, "
                     f"changed {leases['changed']})")
    fill = figures.get("fill")
    if fill and "seeded" in fill:  # (a run before seeding acquired the rest instead)
        lines.append(f"   setup: {fill['seeded']} leases seeded in {fill['seed_s']:.1f} s; cold start (both "
                     f"coordinators, the active loads every lease) {fill['cold_start_s']:.1f} s; standby's mirror "
                     f"loaded after {fill['mirror_loaded_s']:.1f} s")
    idle = figures.get("idle")
    if idle:
        b, h = idle["base"], idle["held"]
        lines.append(f"d. idle loop CPU   {h['loop_cpu_ms_per_s']:.3f} ms/s at {h['leases']} leases vs "
                     f"{b['loop_cpu_ms_per_s']:.3f} ms/s at {b['leases']}   target <= {idle['limit_ms_per_s']:.3f} "
                     f"(1.5 x + 1 ms/s): {'met' if idle['met'] else 'NOT met'}")
        lines.append(f"   whole coordinator process: {h['process_cpu_ms_per_s']:.3f} vs "
                     f"{b['process_cpu_ms_per_s']:.3f} ms/s (sampled {h['seconds']:.1f} s each)")
    if "run_s" in figures:
        lines.append(f"   run: {figures['run_s']:.0f} s end to end")
    cpu = a.get("cpu_ms_per_acquire", {})
    if cpu:
        lines.insert(2, "   CPU per acquire: " + ", ".join(f"{role} {ms:.2f} ms" for role, ms in cpu.items()))
    own = figures.get("acquire_client_per_thread")
    if own:
        lines.insert(3, f"a'. a client per thread {own['per_s']:.1f} /s   p50 {own['p50_ms']} ms   (acquire/raw "
                        f"{own['to_raw']:.3f}, not judged; CPU per acquire: "
                        + ", ".join(f"{role} {ms:.2f} ms" for role, ms in own.get("cpu_ms_per_acquire", {}).items())
                        + f"; {own['acquires']} leases, {own['errors']} errors)")
    if a["errors"]:
        lines.append(f"   acquire errors (first): {a['first_errors']}")
    return "\n".join(lines)


def target_rows(figures: dict[str, Any]) -> list[Row]:
    if figures.get("secure"):
        return [Row.ratio("secure / plain lease acquires", figures["secured"]["per_s"], figures["plain"]["per_s"],
                          "/s", SECURE_TARGET)]
    f = figures["failover"]
    rows = [
        Row.ratio("acquire / raw ZooKeeper creates", figures["acquire"]["per_s"],
                  figures["raw_zookeeper"]["create_per_s"], "/s", TARGET_RATIO),
        Row.limit(f"failover, {f['leases_held']:,} leases held", f["failover_s"],
                  f["session_timeout_s"], "s", f["session_timeout_s"] + FAILOVER_SLACK_S),
    ]
    if "leases" in f:
        leases = f["leases"]
        rows.append(Row.limit("leases lost or changed by the failover",
                              leases["missing"] + leases["extra"] + leases["changed"], leases["before"], "leases", 0))
    idle = figures.get("idle")
    if idle:
        b, h = idle["base"], idle["held"]
        rows.append(Row.limit(f"idle loop CPU, {h['leases']:,} vs {b['leases']:,} leases", h["loop_cpu_ms_per_s"],
                              b["loop_cpu_ms_per_s"], "ms/s", idle["limit_ms_per_s"]))
    return rows
