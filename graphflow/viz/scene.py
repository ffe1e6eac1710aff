"""Drawing primitives shared by the SVG and PNG writers, the worker palette and number formats.

A Scene is a tree of Groups holding Rects, Texts, Paths and Polygons in pixel coordinates
(y grows downwards). Groups carry the id, class and data attributes that the SVG and HTML
keep (tests count them) and a tooltip title; the PNG writer just draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

# Worker colours (the tab10 order): strong for strokes, bars and legends, light for fills.
STRONG = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
REPLICATED_FILL = "#ececec"  # placeholders and constants: every worker has a copy
INK, MUTED, EDGE, CUT = "#222222", "#666666", "#9a9a9a", "#c0392b"


def strong(worker: int) -> str:
    return STRONG[worker % len(STRONG)]


def light(worker: int, amount: float = 0.55) -> str:
    """The worker's colour mixed `amount` of the way to white (black text stays readable)."""
    rgb = [int(strong(worker)[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


@dataclass
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str = "none"
    stroke: str = "none"
    width: float = 1.0
    hatch: str | None = None  # colour of diagonal hatching drawn over the fill
    dash: bool = False
    cls: str | None = None
    data: dict[str, str] = field(default_factory=dict)


@dataclass
class Text:
    x: float
    y: float  # baseline
    text: str
    size: float = 12.0
    anchor: str = "start"  # start | middle | end
    color: str = INK
    bold: bool = False


@dataclass
class Path:
    points: list[tuple[float, float]]
    color: str = EDGE
    width: float = 1.0
    dash: bool = False
    curve: bool = False  # four points: one cubic Bezier segment


@dataclass
class Polygon:
    points: list[tuple[float, float]]
    fill: str


@dataclass
class Group:
    items: list[Item] = field(default_factory=list)
    x: float = 0.0  # offset of everything inside
    y: float = 0.0
    id: str | None = None
    cls: str | None = None
    data: dict[str, str] = field(default_factory=dict)
    title: str | None = None  # the tooltip


Item = Union[Rect, Text, Path, Polygon, Group]  # noqa: UP007 (a runtime alias)


@dataclass
class Scene:
    width: float
    height: float
    items: list[Item]
    title: str = "graphflow plan"


def arrow_head(tip: tuple[float, float], toward: tuple[float, float], color: str,
               size: float = 7.0) -> Polygon:
    """A filled triangle with its point at `tip`, pointing away from `toward`."""
    dx, dy = tip[0] - toward[0], tip[1] - toward[1]
    norm = math.hypot(dx, dy) or 1.0
    ux, uy = dx / norm, dy / norm
    bx, by = tip[0] - ux * size, tip[1] - uy * size
    return Polygon([tip, (bx - uy * size / 2, by + ux * size / 2),
                    (bx + uy * size / 2, by - ux * size / 2)], color)


def text_width(text: str, size: float) -> float:
    """A rough width of `text` in a sans-serif font (no font metrics without a renderer)."""
    return 0.58 * size * len(text)
