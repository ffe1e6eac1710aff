"""The whole picture: per plan a panel with its title, legend, graph, per-worker bars and (for
split locally connected layers) the spatial view; several plans side by side to compare."""

from __future__ import annotations

from graphflow.units import fmt_bytes, fmt_ms
from graphflow.viz import bars
from graphflow.viz.diagram import Diagram
from graphflow.viz.graph import draw_graph
from graphflow.viz.grids import is_split, spatial_view
from graphflow.viz.scene import (
    CUT,
    INK,
    MUTED,
    REPLICATED_FILL,
    Group,
    Item,
    Path,
    Rect,
    Scene,
    Text,
    light,
    strong,
)
from graphflow.viz.spatial import SpatialLayer

MARGIN = 24
HEADER = 96  # title, subtitle and legend


def compose(diagrams: list[Diagram], spatial: list[list[SpatialLayer]]) -> Scene:
    """One panel per diagram, left to right; with several, a header compares step times."""
    items: list[Item] = []
    x, top, height = MARGIN, MARGIN, 0.0
    if len(diagrams) > 1:
        header, top_h = _step_chart(diagrams)
        items.append(Group([header], x=MARGIN, y=MARGIN))
        top += top_h
    for k, (d, layers) in enumerate(zip(diagrams, spatial, strict=True)):
        prefix = f"p{k}-" if len(diagrams) > 1 else ""
        panel, w, h = plan_panel(d, layers, prefix)
        panel.x, panel.y = x, top
        items.append(panel)
        x += w + 3 * MARGIN
        height = max(height, h)
    title = " | ".join(d.title for d in diagrams)
    return Scene(x - 2 * MARGIN, top + height + MARGIN, items, title)


def spatial_scene(diagrams: list[Diagram], spatial: list[list[SpatialLayer]]) -> Scene:
    """The spatial views alone, each under its plan's title (every local2d / conv layer,
    split or not), one plan below the other."""
    items: list[Item] = []
    y, width = MARGIN, 760.0
    for k, (d, layers) in enumerate(zip(diagrams, spatial, strict=True)):
        view, w, h = spatial_view(layers, f"p{k}-" if len(diagrams) > 1 else "")
        view.x, view.y = MARGIN, y + HEADER
        items += [Group([*_titles(d), _legend(d.parts)], x=MARGIN, y=y), view]
        y, width = y + HEADER + h + MARGIN, max(width, w)
    title = " | ".join(d.title for d in diagrams)
    return Scene(width + 2 * MARGIN, y + MARGIN, items, f"{title}: spatial view")


def plan_panel(d: Diagram, layers: list[SpatialLayer],
               prefix: str = "") -> tuple[Group, float, float]:
    graph, gw, gh = draw_graph(d, prefix)
    graph.y = HEADER
    chart, ch = bars.worker_bars(d, prefix)
    chart.x, chart.y = gw + MARGIN, HEADER
    items: list[Item] = [*_titles(d), _legend(d.parts), graph, chart]
    width, height = gw + MARGIN + bars.WIDTH, HEADER + max(gh, ch)
    split = [layer for layer in layers if is_split(layer)]
    if split:
        view, sw, sh = spatial_view(split, prefix)
        view.y = height + MARGIN
        items.append(view)
        width, height = max(width, sw), height + MARGIN + sh
    return Group(items, cls="panel", data={"strategy": d.strategy,
                                           "nodes": str(len(d.boxes))}), width, height


def _titles(d: Diagram) -> list[Item]:
    cut = sum(c.nbytes for c in d.cuts)
    transfers = sum(len(c.transfers) for c in d.cuts)
    return [Text(0, 20, d.title, 18, bold=True),
            Text(0, 42, f"predicted step {fmt_ms(d.step_seconds)}  |  {transfers} transfers, "
                        f"{fmt_bytes(cut)} per step  |  batch {d.batch}  |  one box per "
                        f"{'layer' if d.detail == 'layers' else 'op'}", 12, color=MUTED)]


def _legend(parts: int) -> Group:
    items: list[Item] = []
    x = 0.0
    for w in range(parts):
        items.append(Group([Rect(x, 0, 14, 14, fill=light(w), stroke=strong(w)),
                            Text(x + 19, 11, f"worker {w}", 11)], cls="legend-item",
                           data={"worker": str(w)}, title=f"highlight worker {w}"))
        x += 84
    items.append(Rect(x, 0, 14, 14, fill=REPLICATED_FILL, stroke=MUTED))
    items.append(Text(x + 19, 11, "fed where it is read", 11))
    x += 140
    items.append(Path([(x, 7), (x + 26, 7)], CUT, 2.0))
    items.append(Text(x + 31, 11, "cut: bytes per step", 11))
    x += 150
    items.append(Path([(x, 7), (x + 26, 7)], CUT, 2.0, dash=True))
    items.append(Text(x + 31, 11, "cut: gradients", 11))
    return Group(items, y=58, cls="legend")


def _step_chart(diagrams: list[Diagram]) -> tuple[Group, float]:
    """Predicted step time of each plan as a bar: the comparison at a glance."""
    top = max(d.step_seconds for d in diagrams) or 1.0
    best = min(d.step_seconds for d in diagrams)
    items: list[Item] = [Text(0, 18, "Predicted step time by strategy", 16, bold=True)]
    for k, d in enumerate(diagrams):
        y = 30 + k * 22
        items.append(Text(0, y + 14, d.strategy, 12))
        items.append(Rect(110, y + 3, 300 * d.step_seconds / top, 15,
                          fill="#4c72b0" if d.step_seconds == best else "#a9b8d6",
                          cls="step-bar", data={"strategy": d.strategy,
                                                "seconds": repr(d.step_seconds)}))
        items.append(Text(110 + 300 * d.step_seconds / top + 6, y + 14,
                          fmt_ms(d.step_seconds), 12, color=INK))
    return Group(items, cls="compare"), 30 + 22 * len(diagrams) + 20
