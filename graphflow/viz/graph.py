"""The diagram's graph as scene items: boxes on a layered layout, coloured by worker, data edges
in grey and cut edges in red with the bytes they carry per step (dashed: gradients)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from graphflow.units import fmt_bytes, fmt_count, fmt_flops
from graphflow.viz.diagram import Box, Cut, Diagram
from graphflow.viz.layout import layered
from graphflow.viz.scene import (
    CUT,
    EDGE,
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
    text_width,
)


@dataclass(frozen=True)
class Geometry:
    box_w: float
    box_h: float
    col_w: float  # box plus the gap beside it
    row_h: float
    font: float
    margin: float  # room at the sides for self-loops and their labels


GEOMETRY = {"layers": Geometry(180, 46, 250, 112, 12, 130),
            "ops": Geometry(150, 34, 172, 84, 10, 110)}
Point = tuple[float, float]


def draw_graph(d: Diagram, prefix: str = "") -> tuple[Group, float, float]:
    """The graph as a group; returns it with its width and height."""
    geo = GEOMETRY[d.detail]
    ids = [b.id for b in d.boxes]
    where = layered(ids, d.edges)
    per_rank = Counter(r for r, _ in where.values())
    width = max(per_rank.values()) * geo.col_w + 2 * geo.margin
    height = (max(per_rank) + 1) * geo.row_h
    centre = {b: (width / 2 + (i - (per_rank[r] - 1) / 2) * geo.col_w,
                  r * geo.row_h + geo.box_h / 2 + 20) for b, (r, i) in where.items()}
    number = {b.id: k for k, b in enumerate(d.boxes)}
    boxes = {b.id: b for b in d.boxes}
    items: list[Item] = [_edge(centre[a], centre[b], geo, boxes[a], boxes[b])
                         for a, b in d.edges]
    kind = "layer" if d.detail == "layers" else "op"
    items += [_box(b, centre[b.id], geo, f"{prefix}node-{number[b.id]}", kind)
              for b in d.boxes]
    items += [_cut(c, centre, geo, boxes) for c in d.cuts]
    return Group(items, cls="graph"), width, height + 20


def tooltip(b: Box) -> str:
    workers = (", ".join(f"w{w} {percent(s)}" for w, s in b.workers)
               or "a copy on each worker that reads it")
    return "\n".join([b.label, f"ops: {b.ops}", f"output: {b.shape}",
                      f"FLOPs per step (fwd+bwd): {fmt_flops(b.flops)}",
                      f"parameters: {fmt_count(b.params)} ({fmt_bytes(b.param_bytes)})",
                      f"worker: {workers}"])


def _box(b: Box, c: Point, geo: Geometry, element_id: str, kind: str) -> Group:
    x0, y0 = c[0] - geo.box_w / 2, c[1] - geo.box_h / 2
    items: list[Item] = []
    if not b.workers:
        items.append(Rect(x0, y0, geo.box_w, geo.box_h, fill=REPLICATED_FILL))
    x = x0
    for (w, _), width in zip(b.workers, stripe_widths(b, geo.box_w), strict=True):
        items.append(Rect(x, y0, width, geo.box_h, fill=light(w), cls="stripe",
                          data={"worker": str(w)}))
        x += width
    items.append(Rect(x0, y0, geo.box_w, geo.box_h, stroke=INK, width=1.2, cls="frame"))
    chars = int(geo.box_w / (0.58 * geo.font)) - 1
    items.append(Text(c[0], y0 + geo.font + 5, _fit(b.label, chars), geo.font, "middle",
                      bold=True))
    second = f"{b.op} {b.shape}" if len(b.op) + len(b.shape) < chars else b.op
    items.append(Text(c[0], y0 + 2 * geo.font + 10, _fit(second, chars + 2), geo.font - 2,
                      "middle", MUTED))
    data = {"name": b.label, "op": b.op, "shape": b.shape, "flops": repr(b.flops),
            "params": str(b.params), "workers": " ".join(str(w) for w, _ in b.workers),
            "info": tooltip(b)}
    return Group(items, id=element_id, cls=f"node {kind}",
                 data=data, title=tooltip(b))


MIN_STRIPE = 6.0  # pixels: a worker with a sliver of a layer (its bias) still shows


def stripe_widths(b: Box, box_w: float) -> list[float]:
    """One stripe per worker, as wide as its share of the work, but none narrower than
    MIN_STRIPE: the narrow ones widened, the others narrowed in proportion to make room."""
    shares = [s for _, s in b.workers]
    floor = min(MIN_STRIPE, box_w / max(len(shares), 1))
    small = [s * box_w < floor for s in shares]
    room = box_w - floor * sum(small)
    rest = sum(s for s, tiny in zip(shares, small, strict=True) if not tiny)
    return [floor if tiny else room * s / rest for s, tiny in zip(shares, small, strict=True)]


def percent(share: float) -> str:
    """A worker's share of a box: "<1%" (not "0%") for a sliver it does hold, ">99%" beside."""
    if 0 <= share < 0.005:
        return "<1%"
    return ">99%" if 0.995 < share < 1 else f"{100 * share:.0f}%"


def _edge(a: Point, b: Point, geo: Geometry, src: Box, dst: Box) -> Group:
    start, end = (a[0], a[1] + geo.box_h / 2), (b[0], b[1] - geo.box_h / 2)
    mid = (start[1] + end[1]) / 2
    path = [start, (start[0], mid), (end[0], mid), end]
    workers = sorted({w for w, _ in src.workers} | {w for w, _ in dst.workers})
    return Group([Path(path, EDGE, 1.0, curve=True), arrow_head(end, path[2], EDGE, 6)],
                 cls="edge", data={"src": src.label, "dst": dst.label,
                                   "workers": " ".join(map(str, workers))})


def _cut(c: Cut, centre: dict[str, Point], geo: Geometry, boxes: dict[str, Box]) -> Group:
    path, anchor = _cut_route(c, centre, geo)
    label = fmt_bytes(c.nbytes)
    lx, ly = _label_point(path, c.src == c.dst, c.backward)
    tw = text_width(label, geo.font - 1)
    left = lx if anchor == "start" else lx - tw if anchor == "end" else lx - tw / 2
    workers = sorted({w for pair in c.pairs for w in pair})
    title = (f"{'gradients' if c.backward else 'activations / parameters'} "
             f"{boxes[c.src].label} -> {boxes[c.dst].label}: {label} per step in "
             f"{len(c.transfers)} transfer(s)\n"
             + "\n".join(f"w{s} -> w{d}" for s, d in c.pairs))
    items: list[Item] = [Path(path, CUT, 2.0, dash=c.backward, curve=len(path) == 4),
                         arrow_head(path[-1], path[-2], CUT, 8),
                         Rect(left - 2, ly - geo.font + 1, tw + 4, geo.font + 3, fill="white"),
                         Text(lx, ly, label, geo.font - 1, anchor, CUT, bold=True)]
    return Group(items, cls=f"cut {'backward' if c.backward else 'forward'}",
                 data={"src": boxes[c.src].label, "dst": boxes[c.dst].label,
                       "bytes": str(c.nbytes), "label": label,
                       "transfers": " ".join(c.transfers),
                       "workers": " ".join(map(str, workers))}, title=title)


def _cut_route(c: Cut, centre: dict[str, Point], geo: Geometry) -> tuple[list[Point], str]:
    """Forward cuts run right of the centre line, gradients left; a cut inside one box (a
    split layer's halo) loops out of its side. Returns the points and the label anchor."""
    (ax, ay), (bx, by) = centre[c.src], centre[c.dst]
    side = -1 if c.backward else 1
    hw, hh = geo.box_w / 2, geo.box_h / 2
    if c.src == c.dst:
        x = ax + side * hw
        loop = x + side * 34
        return [(x, ay - 10), (loop, ay - 26), (loop, ay + 26), (x, ay + 10)], (
            "end" if c.backward else "start")
    dx = side * geo.box_w / 5
    if abs(ay - by) < 1:  # same rank: side to side
        sx = ax + (hw if bx > ax else -hw)
        ex = bx - (hw if bx > ax else -hw)
        return [(sx, ay + side * 6), (ex, by + side * 6)], "middle"
    down = by > ay
    start = (ax + dx, ay + (hh if down else -hh))
    end = (bx + dx, by - (hh if down else -hh))
    mid = (start[1] + end[1]) / 2
    return [start, (start[0], mid), (end[0], mid), end], "start" if side > 0 else "end"


def _label_point(path: list[Point], loop: bool, backward: bool) -> Point:
    if loop:
        x = path[1][0] + (-4 if backward else 4)
        return x, (path[0][1] + path[-1][1]) / 2 + 4
    if len(path) == 2:
        return (path[0][0] + path[1][0]) / 2, path[0][1] - 4
    # the Bezier's midpoint is the mean of its middle control points
    return ((path[1][0] + path[2][0]) / 2 + (-6 if backward else 6),
            (path[1][1] + path[2][1]) / 2 + 4)


def _fit(text: str, chars: int) -> str:
    """Shorten from the left (the end of a node name says the most)."""
    return text if len(text) <= chars else "\u2026" + text[-(chars - 1):]
