"""The text report and the target rows of ``kvlease bench scan`` (:mod:`kvlease.ops.bench.scan`): pure functions
of its figures."""

from __future__ import annotations

from typing import Any

from kvlease.ops.bench.suite import MB, Row

TARGETS = {"unary": 0.65, "stream": 0.75}  # ratio to raw, decoded rows (issue 12)
WIDE_TARGETS = {"stream": 0.6}  # --schema wide (issue 42)
MEMORY_TARGET_FACTOR = 2  # peak RSS above the RSS before <= 2 x (scanners x batch) + 32 MB
MEMORY_TARGET_SLACK = 32 * MB
SECURE_TARGET = 0.8  # secure rows/s over plain, at least
SECURE_KINDS = {"unary": False, "stream": True}  # kind -> streaming


def _secure_report(r: dict[str, Any]) -> str:
    lines = [f"kvlease bench scan --secure: {r['rows']:,} rows, 1 bucket, decoded rows, best of {r['rounds']} "
             "interleaved runs; mutual TLS + password + ACL checks vs none"]
    for kind in SECURE_KINDS:
        plain, secure = r["rows_per_s"]["plain"][kind], r["rows_per_s"]["secure"][kind]
        ratio = r["secure_to_plain"][kind]
        lines.append(f"  {kind:<6} plain {plain:>12,.0f} rows/s   secure {secure:>12,.0f} rows/s   = {ratio:.2f} "
                     f"(target >= {r['target']}: {'ok' if ratio >= r['target'] else 'BELOW TARGET'})")
    return "\n".join(lines)


def report(r: dict[str, Any]) -> str:
    if r.get("secure"):
        return _secure_report(r)
    mb = 1 << 20
    rate, ratio = r["rows_per_s"], r["ratio_to_raw"]

    def verdict(name: str) -> str:
        target = r["targets"].get(name)
        if target is None:
            return ""
        return f"(target >= {target}: {'ok' if ratio[name] >= target else 'BELOW TARGET'})"

    table = "20 columns of mixed types" if r.get("schema") == "wide" else "id STRING 16 chars, v STRING 100 B"
    lines = [f"{r['rows']:,} rows ({table}), 1 bucket, batches of "
             f"{r['batch_size_bytes'] / mb:g} MB; loaded at {r['load_rows_per_s']:,.0f} rows/s; best of {r['rounds']} "
             "interleaved runs",
             f"  raw rocksdict iteration in-process    {rate['raw']:>12,.0f} rows/s"]
    for name, label in (("unary_decoded", "KvBatchScanner, decoded rows"), ("stream_decoded", "KvStreamScanner, decoded rows"),
                        ("unary_records", "KvBatchScanner, records only"), ("stream_records", "KvStreamScanner, records only")):
        lines.append(f"  {label:<37} {rate[name]:>12,.0f} rows/s  = {ratio[name]:.2f} of raw {verdict(name)}")
    lines.append("  CPU per full scan (best run): elapsed / client CPU / tablet server CPU")
    for name, c in r["cpu"].items():
        if name != "raw":
            lines.append(f"    {name:<16} {c['elapsed_s']:.2f} s / {c['client_cpu_s']:.2f} s / {c['server_cpu_s']:.2f} s")
    lines.append("  tablet server peak RSS above its RSS before the scan (1 scanner, batch "
                 f"{r['batch_size_bytes'] / mb:g} MB):")
    for name, doc in r["server_memory"].items():
        lines.append(f"    {name:<16} +{doc['peak_above_before'] / mb:6.1f} MB (RSS before {doc['rss_before'] / mb:.0f} MB)")
    c = r["concurrent"]
    lines.append(f"  {c['scanners']} scanners open at once, {c['rows']:,} rows round-robin: {c['rows_per_s']:,.0f} rows/s, "
                 f"peak +{c['memory']['peak_above_before'] / mb:.1f} MB vs batch x scanners "
                 f"{c['batch_x_scanners'] / mb:g} MB ({c['memory']['method']})")
    return "\n".join(lines)


def memory_target(scanners: int, batch_bytes: int) -> int:
    """Bytes the tablet server's peak RSS may grow by while ``scanners`` read batches of ``batch_bytes``."""
    return MEMORY_TARGET_FACTOR * scanners * batch_bytes + MEMORY_TARGET_SLACK


def memory_formula(scanners: int, batch_bytes: int) -> str:
    """:func:`memory_target` spelled out, e.g. ``2 x (8 x 4 MB) + 32 MB``."""
    return (f"{MEMORY_TARGET_FACTOR} x ({scanners} x {batch_bytes / MB:g} MB) + {MEMORY_TARGET_SLACK / MB:g} MB")


def target_rows(figures: dict[str, Any]) -> list[Row]:
    if figures.get("secure"):
        rate = figures["rows_per_s"]
        return [Row.ratio(f"{kind}, secure / plain", rate["secure"][kind], rate["plain"][kind], "rows/s",
                          SECURE_TARGET) for kind in SECURE_KINDS]
    rate, raw, batch = figures["rows_per_s"], figures["rows_per_s"]["raw"], figures["batch_size_bytes"]
    one = max(doc["peak_above_before"] for doc in figures["server_memory"].values())
    concurrent = figures["concurrent"]
    scanners = concurrent["scanners"]
    if figures.get("schema") == "wide":
        ratios = [Row.ratio("stream, decoded / raw iteration (wide rows)", rate["stream_decoded"], raw, "rows/s",
                            WIDE_TARGETS["stream"])]
    else:
        ratios = [Row.ratio("stream, decoded / raw iteration", rate["stream_decoded"], raw, "rows/s", TARGETS["stream"]),
                  Row.ratio("unary, decoded / raw iteration", rate["unary_decoded"], raw, "rows/s", TARGETS["unary"])]
    return ratios + [
        Row.limit(f"server peak RSS above before, 1 scanner (worst kind); <= {memory_formula(1, batch)}",
                  one / MB, batch / MB, "MB", memory_target(1, batch) / MB),
        Row.limit(f"server peak RSS above before, {scanners} scanners; <= {memory_formula(scanners, batch)}",
                  concurrent["memory"]["peak_above_before"] / MB, scanners * batch / MB, "MB",
                  memory_target(scanners, batch) / MB),
    ]
