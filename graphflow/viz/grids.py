"""The spatial view as scene items: per local2d / conv layer, its input rows coloured by the
worker holding them with the halo rows hatched (in the colour of the worker they cross to),
each worker's read window outlined, and the output locations coloured by worker."""

from __future__ import annotations

import numpy as np

from graphflow.units import fmt_bytes
from graphflow.viz.scene import (
    INK,
    MUTED,
    REPLICATED_FILL,
    Group,
    Item,
    Path,
    Rect,
    Text,
    arrow_head,
    light,
    strong,
)
from graphflow.viz.spatial import REPLICATED_ROW, SpatialLayer

GRID = 200  # pixels of a grid's longer side
PANEL_W = 2 * GRID + 100
PANEL_H = GRID + 108


def is_split(layer: SpatialLayer) -> bool:
    return len(np.unique(layer.out_grid)) > 1


def spatial_view(layers: list[SpatialLayer], prefix: str = "") -> tuple[Group, float, float]:
    """One panel per layer, side by side; returns the group, its width and height."""
    items: list[Item] = [Text(0, 18, "Spatial view: output locations by worker, halo rows "
                              "hatched in the colour of the worker that reads them", 14,
                              bold=True)]
    for k, layer in enumerate(layers):
        items.append(Group(_panel(layer), x=k * PANEL_W, y=30, id=f"{prefix}spatial-{k}",
                           cls="spatial-layer",
                           data={"name": layer.name, "halo-cells": str(layer.halo_cells),
                                 "halo-bytes": str(layer.halo_bytes),
                                 "cell-bytes": str(layer.cell_bytes)}))
    return Group(items, cls="spatial"), max(len(layers), 1) * PANEL_W, PANEL_H + 30


def _panel(layer: SpatialLayer) -> list[Item]:
    rows, cols = layer.out_grid.shape
    h, w = len(layer.in_rows), layer.in_width
    cell_in, cell_out = GRID / max(h, w), GRID / max(rows, cols)
    items: list[Item] = [Text(0, 14, f"{layer.name} ({layer.op}): input {h}x{w} -> output "
                              f"{rows}x{cols}", 13, bold=True)]
    items += _input_grid(layer, cell_in, 0, 26)
    ox = GRID + 60
    items += [Path([(GRID + 14, 26 + GRID / 2), (ox - 14, 26 + GRID / 2)], INK, 1.5),
              arrow_head((ox - 10, 26 + GRID / 2), (GRID + 14, 26 + GRID / 2), INK)]
    items += _output_grid(layer, cell_out, ox, 26)
    if layer.halos:
        caption = (f"halo: {layer.halo_cells} input locations, {fmt_bytes(layer.halo_bytes)} "
                   f"forward and as many gradient bytes back per step")
    elif int(np.min(layer.in_rows)) == REPLICATED_ROW:
        caption = "input fed to the workers, each its own rows: no halo crosses a boundary"
    else:
        caption = "no input row crosses a boundary"
    items.append(Text(0, 26 + GRID + 24, caption, 11, color=MUTED))
    items.append(Text(0, 26 + GRID + 40, "dashed outlines: the input rows each worker reads",
                      11, color=MUTED))
    return items


def _runs(values: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal runs of equal values: (value, start, end)."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            out.append((int(values[start]), start, i))
            start = i
    return out


def _input_grid(layer: SpatialLayer, cell: float, x0: float, y0: float) -> list[Item]:
    w = layer.in_width * cell
    items: list[Item] = []
    for holder, lo, hi in _runs(layer.in_rows):
        fill = REPLICATED_FILL if holder == REPLICATED_ROW else light(holder)
        items.append(Rect(x0, y0 + lo * cell, w, (hi - lo) * cell, fill=fill, cls="in-rows",
                          data={"worker": str(holder), "rows": f"{lo}-{hi}"}))
    items += _grid_lines(len(layer.in_rows), layer.in_width, cell, x0, y0)
    for k, h in enumerate(layer.halos):
        items.append(Rect(x0, y0 + h.lo * cell, w, (h.hi - h.lo) * cell, stroke=strong(h.dst),
                          width=1.0, hatch=strong(h.dst), cls="halo",
                          data={"src": str(h.src), "dst": str(h.dst), "rows": f"{h.lo}-{h.hi}",
                                "cells": str(h.cells), "index": str(k)}))
    for worker, (lo, hi) in sorted(layer.reads.items()):
        inset = 1.5 + 1.5 * (worker % 3)  # overlapping windows stay visible
        items.append(Rect(x0 - inset, y0 + lo * cell, w + 2 * inset, (hi - lo) * cell,
                          stroke=strong(worker), width=1.2, dash=True, cls="read",
                          data={"worker": str(worker), "rows": f"{lo}-{hi}"}))
    return items


def _output_grid(layer: SpatialLayer, cell: float, x0: float, y0: float) -> list[Item]:
    rows, cols = layer.out_grid.shape
    items: list[Item] = []
    for worker, lo, hi in _runs(layer.out_grid[:, 0]):
        items.append(Rect(x0, y0 + lo * cell, cols * cell, (hi - lo) * cell,
                          fill=light(worker, 0.25), stroke=strong(worker), width=1.0,
                          cls="block", data={"worker": str(worker), "rows": f"{lo}-{hi}",
                                             "cells": str((hi - lo) * cols)}))
        items.append(Text(x0 + cols * cell + 6, y0 + (lo + hi) / 2 * cell + 4, f"w{worker}",
                          10, color=strong(worker), bold=True))
    items += _grid_lines(rows, cols, cell, x0, y0)
    return items


def _grid_lines(rows: int, cols: int, cell: float, x0: float, y0: float) -> list[Item]:
    """A white line between locations, where cells are big enough to tell apart."""
    if cell < 5:
        return []
    lines: list[Item] = [Path([(x0 + c * cell, y0), (x0 + c * cell, y0 + rows * cell)],
                              "white", 0.6) for c in range(1, cols)]
    lines += [Path([(x0, y0 + r * cell), (x0 + cols * cell, y0 + r * cell)], "white", 0.6)
              for r in range(1, rows)]
    return lines
