"""``kvlease bench writes --engine aggregation`` and ``--partial``: writes through a merge engine or as partial
updates, next to last-write-wins in the same run (docs/benchmarks.md, "Merge engines and partial updates").

A part of :mod:`kvlease.ops.bench.writes`, run in each of its rounds after its upsert load: tables of
``(id BIGINT, v STRING ~100 B, n BIGINT)``: one last-write-wins, one with the aggregation engine
(``--engine aggregation``: ``n`` summed, ``v`` the default last_value_ignore_nulls) and one written by
partial updates (``--partial``), each loaded twice with the same keys: a first pass that inserts every row
and a second that updates every one (where an engine really folds: the stored rows are decoded, folded and
encoded again on the leader; the partial table's second pass writes only ``(id, n)``). Reported: rows/s of
each pass, their ratios to the run's raw RocksDB WriteBatch figure, and each update pass against
last-write-wins' (target >= 0.5).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from kvlease.common.merge_engine import parse_engine
from kvlease.common.tables import Column
from kvlease.ops.bench.machine import wait_idle
from kvlease.ops.bench.suite import Row

COLUMNS = [Column("id", "BIGINT"), Column("v", "STRING"), Column("n", "BIGINT")]
TARGET_VS_LWW = 0.5  # issue 43
ENGINES = ("none", "aggregation")


def engine_name(text: str) -> str:
    import argparse

    if text not in ENGINES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(ENGINES)}")
    return text


class _Partial:
    """A table client whose upserts are partial updates (what :func:`kvlease.ops.bench.writes.load` calls)."""

    def __init__(self, client) -> None:
        self.client = client

    def upsert(self, batch: pa.RecordBatch):
        return self.client.upsert(batch, partial=True)


def maker(make_narrow, columns: tuple[str, ...] | None = None):
    """Rows ``(id, v, n)`` of :func:`kvlease.ops.bench.writes.make_batch`'s ``(id, v)`` and ``n = id % 1000``
    (``columns``: only those)."""
    def make(ids: np.ndarray, salt: int = 0) -> pa.RecordBatch:
        base = make_narrow(ids, salt)
        batch = pa.record_batch({"id": base.column("id"), "v": base.column("v"),
                                 "n": pa.array(ids % 1000 + salt, pa.int64())})
        return batch.select(list(columns)) if columns else batch
    return make


def one_round(admin, round_: int, engine: str, partial: bool, rows: int, batch: int, threads: int,
              tablet_pid: int, load, make_narrow, progress) -> dict[str, float]:
    """Rows/s of the insert and the update pass into a last-write-wins table, the engine's table (``engine``)
    and a table written by partial updates (``partial``): ``{"lww_insert": …, "engine_update": …, …}``."""
    from kvlease.client.table import TableClient

    out = {}
    full, narrow = maker(make_narrow), maker(make_narrow, ("id", "n"))
    kinds = [("lww", None, False)]
    if engine == "aggregation":
        kinds.append(("engine", parse_engine("aggregation", aggregates={"n": "sum"}), False))
    if partial:
        kinds.append(("partial", None, True))
    for kind, table_engine, partial_writes in kinds:
        table = f"bench.merge_{kind}_{round_}"
        admin.create_table(table, COLUMNS, ["id"], 1, merge_engine=table_engine)
        wait_idle(tablet_pid)
        with TableClient(admin, table, parallelism=threads) as client:
            writer = _Partial(client) if partial_writes else client
            for pass_, make in (("insert", full), ("update", narrow if partial_writes else full)):
                progress(f"round {round_}: {kind} {pass_} pass of {rows:,} rows")
                out[f"{kind}_{pass_}"] = load(writer, rows, batch, threads, tablet_pid, make)["rows_per_s"]
        admin.drop_table(table)
    return out


def figures(rounds: list[dict[str, float]], baseline: float, engine: str, partial: bool) -> dict[str, Any]:
    """The best of each figure over the rounds, its ratio to raw RocksDB and (update pass) to last-write-wins."""
    best = {key: max(r[key] for r in rounds) for key in rounds[0]}
    kinds = [k for k in ("engine", "partial") if f"{k}_update" in best]
    return {"engine": engine, "partial": partial, "kinds": ["lww", *kinds],
            **{f"{k}_rows_per_s": v for k, v in best.items()},
            **{f"{k}_vs_rocksdb": v / baseline for k, v in best.items()},
            **{f"{k}_{p}_vs_lww": best[f"{k}_{p}"] / best[f"lww_{p}"] for k in kinds for p in ("insert", "update")},
            "target_vs_lww": TARGET_VS_LWW}


LABELS = {"lww": "last write wins     ", "engine": "aggregation (n=sum) ", "partial": "partial (id, n)     "}


def report(m: dict[str, Any]) -> list[str]:
    lines = ["  merge writes (table id BIGINT, v STRING 100 B, n BIGINT; insert pass, then update pass of every "
             "row): rows/s (/ raw WriteBatch)"]
    for kind in m["kinds"]:
        line = (f"    {LABELS[kind]} insert {m[f'{kind}_insert_rows_per_s']:>10,.0f} ({m[f'{kind}_insert_vs_rocksdb']:.2f})"
                f"   update {m[f'{kind}_update_rows_per_s']:>10,.0f} ({m[f'{kind}_update_vs_rocksdb']:.2f})")
        if kind != "lww":
            ratio = m[f"{kind}_update_vs_lww"]
            ok = "ok" if ratio >= m["target_vs_lww"] else "BELOW TARGET"
            line += f"   update / last write wins {ratio:.2f} (target >= {m['target_vs_lww']}: {ok})"
        lines.append(line)
    return lines


def target_rows(m: dict[str, Any]) -> list[Row]:
    return [Row.ratio(f"{kind} update / last-write-wins update", m[f"{kind}_update_rows_per_s"],
                      m["lww_update_rows_per_s"], "rows/s", TARGET_VS_LWW) for kind in m["kinds"] if kind != "lww"]
