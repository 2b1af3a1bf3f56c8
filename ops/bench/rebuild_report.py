"""The text report and the target rows of ``kvlease bench rebuild`` (:mod:`kvlease.ops.bench.rebuild`): pure
functions of its figures."""

from __future__ import annotations

from typing import Any

from kvlease.ops.bench.suite import MB, Row

TARGET_RATIO = 0.5  # issue 31, issue 44: on file:// and S3, quiet and with a writer loading the leader


def cases(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (remote storage, load) case of the run, in the order measured."""
    return [case for run in figures["runs"] for case in run["cases"]]


def case_name(figures: dict[str, Any], case: dict[str, Any]) -> str:
    load = "quiet" if case["load"] == "quiet" else f"a writer at {figures['load_rows_per_s']:,} rows/s"
    return f"{case['remote']}://, {load}"


def _case_report(figures: dict[str, Any], case: dict[str, Any]) -> list[str]:
    best = min(case["rebuild"], key=lambda r: r["total_s"])
    durable = case["durable_download_s"]
    size = case["snapshot_bytes"] / MB
    ok = "ok" if case["rebuild_vs_download"] >= case["target_ratio"] else "BELOW TARGET"
    writer = (f"; the writer upserted {case['writer_rows']:,} rows ({case['writer_rows_per_s']:,.0f} rows/s)"
              if "writer_rows" in case else "")
    return [
        f"{case_name(figures, case)}{writer}",
        f"  download, each file fsynced      {case['download_rows_per_s']:>12,.0f} rows/s  "
        f"{case['download_mb_per_s']:>8,.1f} MB/s  (" + ", ".join(f"{s:.2f} s" for s in durable) + ")  the anchor",
        f"  the same into the page cache     {case['page_cache_download_rows_per_s']:>12,.0f} rows/s  "
        f"{size / min(case['download_s']):>8,.1f} MB/s  (" + ", ".join(f"{s:.2f} s" for s in case["download_s"])
        + ")  not durable",
        f"  rebuild of the wiped follower    {case['rebuild_rows_per_s']:>12,.0f} rows/s  "
        f"{case['rebuild_mb_per_s']:>8,.1f} MB/s  ("
        + ", ".join(f"{r['total_s']:.2f} s" for r in case["rebuild"]) + ")",
        f"  ratio rebuild / download         {case['rebuild_vs_download']:>12.2f}   "
        f"(target >= {case['target_ratio']}: {ok}; {case['rebuild_vs_page_cache_download']:.2f} of the page-cache copy)",
        f"  the best rebuild, from the follower's start: rebuild started {best.get('started_s', 0):.2f} s, "
        f"snapshot installed {best['installed_s']:.2f} s, tail applied {best['applied_s']:.2f} s (to offset "
        f"{best['log_end']:,}), in the ISR {best['in_isr_s']:.2f} s",
    ]


def report(figures: dict[str, Any]) -> str:
    lines = []
    for run in figures["runs"]:
        first = run["cases"][0]
        lines.append(
            f"{figures['rows']:,} rows (id BIGINT, v STRING 100 B), 1 bucket, snapshot of "
            f"{first['snapshot_bytes'] / MB:,.1f} MB in {first['snapshot_files']} files at log offset "
            f"{run['snapshot_log_offset']:,}; then {figures['tail_rows']:,} rows updated (log offsets "
            f"{run['snapshot_log_offset']:,}-{run['leader_log_end']:,}; the leader's log starts at "
            f"{run['leader_log_start']:,}); {run['remote']}:// remote storage, best of {figures['rounds']} "
            f"alternating rounds")
        for case in run["cases"]:
            lines.extend(_case_report(figures, case))
    return "\n".join(lines)


def target_rows(figures: dict[str, Any]) -> list[Row]:
    return [Row.ratio(f"rebuild / durable download, {case_name(figures, case)}, {figures['rows']:,} rows + "
                      f"{figures['tail_rows']:,} tail", case["rebuild_rows_per_s"], case["download_rows_per_s"],
                      "rows/s", TARGET_RATIO) for case in cases(figures)]
