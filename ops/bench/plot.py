"""``--plot FILE.png`` of ``kvlease bench``: each judged figure as a bar against its target.

Drawn from the suite's JSON document alone (:func:`kvlease.ops.bench.suite.main`'s
``{"machine", "benchmarks": {NAME: {"rows": [...]}}}``, rows as
:meth:`kvlease.ops.bench.suite.Row.doc` writes them) with matplotlib's Agg canvas (no display, no
pyplot state). One panel per kind of value: ratios to the anchor, seconds,
MB. Each bar is the value, green when its target is met and red when not; a
black line across the bar marks the target, named under the bar: ``>= 0.5``
(at least) or ``<= 8 s`` (at most). The title names the benchmarks, the date and the
machine (CPUs, model, load average at the start and end of the run).
"""

from __future__ import annotations

import textwrap
from typing import Any

MET = "#2e8b57"
NOT_MET = "#c0392b"
TARGET = "black"
PANEL_TITLES = {"": "ratio to the anchor", "s": "seconds", "MB": "MB", "ms/s": "CPU ms per second",
                "leases": "leases (count)"}


def title(doc: dict[str, Any]) -> str:
    m = doc["machine"]

    def load(averages: list[float]) -> str:
        return " ".join(f"{x:.2f}" for x in averages)

    load_text = f"load average {load(m['load_average'])} at the start"
    if "load_average_end" in m:
        load_text += f", {load(m['load_average_end'])} at the end"
    failed = [name for name, entry in doc["benchmarks"].items() if "error" in entry]
    return "\n".join([
        f"kvlease bench {', '.join(doc['benchmarks'])}, {m['date']}"
        + (f" (failed: {', '.join(failed)})" if failed else ""),
        f"{m['cpus']} CPUs, {m['cpu_model']}; {load_text}",
    ])


def target_text(row: dict[str, Any]) -> str:
    return f"{'<=' if row['at_most'] else '>='} {row['target']:.3g} {row['value_unit']}".rstrip()


def draw(doc: dict[str, Any]):
    """The figure (a matplotlib ``Figure`` on an Agg canvas) of every row in ``doc``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    several = len(doc["benchmarks"]) > 1
    panels: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # value unit -> (label, row)
    for name, entry in doc["benchmarks"].items():
        for row in entry.get("rows", []):
            label = f"{name}: {row['metric']}" if several else row["metric"]
            panels.setdefault(row["value_unit"], []).append((label, row))
    if not panels:
        panels[""] = []
    bars = sum(len(items) for items in panels.values())
    fig = Figure(figsize=(max(7.0, 1.5 * bars + 2.5), 6.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False,
                        gridspec_kw={"width_ratios": [max(1, len(items)) for items in panels.values()]})[0]
    for ax, (unit, items) in zip(axes, panels.items()):
        xs = list(range(len(items)))
        rows = [row for _, row in items]
        ax.bar(xs, [r["value"] for r in rows], width=0.6, color=[MET if r["met"] else NOT_MET for r in rows])
        ax.hlines([r["target"] for r in rows], [x - 0.42 for x in xs], [x + 0.42 for x in xs], colors=TARGET,
                  linewidth=2.5)
        for x, r in zip(xs, rows):
            ax.annotate(f"{r['value']:.3g}", (x, r["value"]), ha="center", va="bottom", fontsize=9,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(xs, [f"{textwrap.fill(label, 20)}\ntarget {target_text(r)}" for label, r in items], fontsize=8)
        ax.set_xlim(-0.6, max(len(items), 1) - 0.4)
        top = max([r["value"] for r in rows] + [r["target"] for r in rows] + [0.0]) or 1.0  # all 0: a 0..1 scale
        ax.set_ylim(0, top * 1.2)
        ax.set_title(PANEL_TITLES.get(unit, unit), fontsize=10)
        if not items:
            ax.text(0.5, 0.5, "no figures", ha="center", va="center", transform=ax.transAxes)
    fig.legend(handles=[Patch(color=MET, label="target met"), Patch(color=NOT_MET, label="target not met"),
                        Line2D([], [], color=TARGET, linewidth=2.5, label="target")],
               loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title(doc), fontsize=10)
    return fig


def plot(doc: dict[str, Any], path: str) -> None:
    """Write :func:`draw`'s figure to ``path`` as PNG."""
    draw(doc).savefig(path, format="png", dpi=100)
