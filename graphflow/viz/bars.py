"""Per-worker bar charts: FLOPs, parameter bytes, bytes in / out and predicted busy time, so an
unbalanced plan shows at a glance."""

from __future__ import annotations

from collections.abc import Callable

from graphflow.units import fmt_bytes, fmt_flops, fmt_ms
from graphflow.viz.diagram import Diagram
from graphflow.viz.scene import MUTED, Group, Item, Rect, Text, light, strong

WIDTH = 280
BAR_W = 150
ROW_H = 16


def metrics(d: Diagram) -> list[tuple[str, list[float], Callable[[float], str]]]:
    """(title, one value per worker, formatter) for each chart."""
    busy = d.busy
    used = [b for b in busy if b > 0]
    spread = max(used) * len(used) / sum(used) if used else 1.0
    return [
        ("FLOPs per step", [s.flops for s in d.stats], fmt_flops),
        ("parameters", [float(s.param_bytes) for s in d.stats], fmt_bytes),
        ("bytes in per step", [float(s.bytes_in) for s in d.stats], fmt_bytes),
        ("bytes out per step", [float(s.bytes_out) for s in d.stats], fmt_bytes),
        (f"predicted busy (busiest {spread:.2f}x mean)", busy, fmt_ms),
    ]


def chart_height(parts: int) -> float:
    return 26 + parts * ROW_H + 12


def worker_bars(d: Diagram, prefix: str = "") -> tuple[Group, float]:
    """All charts stacked; returns the group and its height."""
    items: list[Item] = []
    y = 0.0
    for title, values, fmt in metrics(d):
        items.append(Group(_chart(title, values, fmt), y=y, cls="chart",
                           data={"metric": title.split(" (")[0]}))
        y += chart_height(len(values))
    return Group(items, id=f"{prefix}bars", cls="bars"), y


def _chart(title: str, values: list[float], fmt: Callable[[float], str]) -> list[Item]:
    items: list[Item] = [Text(0, 16, title, 12, bold=True)]
    top = max(values, default=0.0) or 1.0
    for w, v in enumerate(values):
        y = 24 + w * ROW_H
        items.append(Text(0, y + 11, f"w{w}", 10, color=MUTED))
        items.append(Rect(28, y + 2, BAR_W, ROW_H - 4, fill="#f4f4f4"))
        items.append(Rect(28, y + 2, max(BAR_W * v / top, 0.5 if v else 0), ROW_H - 4,
                          fill=light(w, 0.2), stroke=strong(w), width=0.5, cls="bar",
                          data={"worker": str(w), "value": repr(float(v))}))
        items.append(Text(28 + BAR_W + 6, y + 11, fmt(v), 10))
    return items
