"""Scene -> PNG with matplotlib (an optional dependency: only `.png` output needs it)."""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Any

from graphflow.viz.scene import Group, Item, Path, Polygon, Rect, Scene, Text

DPI = 100  # one scene pixel is one image pixel, until the image would be too large
MAX_PIXELS = 12000  # the longer side; larger scenes are scaled down (text with them)
POINTS_PER_PIXEL = 72 / DPI
HALIGN = {"start": "left", "middle": "center", "end": "right"}


def require_matplotlib() -> Any:
    """matplotlib's Agg canvas, or an ImportError that says how to get it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as e:
        raise ImportError("writing .png needs matplotlib, which is not installed: "
                          "`pip install matplotlib` (or write .svg, .html or .dot, which "
                          "need nothing extra)") from e
    return FigureCanvasAgg


def write_png(scene: Scene, path: str | FilePath) -> None:
    canvas_type = require_matplotlib()
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    scale = min(1.0, MAX_PIXELS / max(scene.width, scene.height))
    fig = Figure(figsize=(scene.width / DPI, scene.height / DPI), dpi=DPI * scale)
    canvas_type(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, scene.width)
    ax.set_ylim(scene.height, 0)
    ax.axis("off")
    for item in scene.items:
        _draw(ax, item, 0.0, 0.0)
    fig.savefig(str(path), dpi=DPI * scale, facecolor="white")


def _draw(ax: Any, item: Item, dx: float, dy: float) -> None:
    from matplotlib import patches
    from matplotlib.path import Path as MplPath

    if isinstance(item, Group):
        for child in item.items:
            _draw(ax, child, dx + item.x, dy + item.y)
    elif isinstance(item, Rect):
        _rect(ax, item, dx, dy)
    elif isinstance(item, Text):
        ax.text(item.x + dx, item.y + dy, item.text, fontsize=item.size * POINTS_PER_PIXEL,
                ha=HALIGN[item.anchor], va="baseline", color=item.color,
                fontweight="bold" if item.bold else "normal")
    elif isinstance(item, Path):
        points = [(x + dx, y + dy) for x, y in item.points]
        codes = ([MplPath.MOVETO] + [MplPath.CURVE4] * 3 if item.curve and len(points) == 4
                 else [MplPath.MOVETO] + [MplPath.LINETO] * (len(points) - 1))
        ax.add_patch(patches.PathPatch(MplPath(points, codes), fill=False,
                                       edgecolor=item.color, linewidth=item.width * 0.75,
                                       linestyle="--" if item.dash else "-"))
    elif isinstance(item, Polygon):
        ax.add_patch(patches.Polygon([(x + dx, y + dy) for x, y in item.points],
                                     closed=True, facecolor=item.fill, edgecolor="none"))
    else:
        raise TypeError(f"cannot draw {type(item).__name__} in PNG")


def _rect(ax: Any, r: Rect, dx: float, dy: float) -> None:
    from matplotlib import patches

    ax.add_patch(patches.Rectangle(
        (r.x + dx, r.y + dy), r.w, r.h, facecolor=r.fill, linewidth=r.width * 0.75,
        edgecolor=r.stroke if r.stroke != "none" else "none",
        linestyle="--" if r.dash else "-"))
    if r.hatch:  # matplotlib draws a hatch in the edge colour: a second, edge-less patch
        ax.add_patch(patches.Rectangle((r.x + dx, r.y + dy), r.w, r.h, facecolor="none",
                                       edgecolor=r.hatch, linewidth=0, hatch="////",
                                       alpha=0.8))
