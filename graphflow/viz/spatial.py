"""The spatial view's data (DistBelief's Fig. 1): for each locally connected / conv layer, which
worker computes each output location, which worker holds each input row, and the halo: the
input rows a worker reads from another worker's block.

Read from the plan's graph (the blocks, slices and concats the spatial partitioner made), not
from its transfers, so a test can check one against the other.

>>> import graphflow as gf
>>> m = gf.models.lc_large(batch=None)
>>> lc1, lc2 = spatial_layers(gf.partition(m.graph, 4, "spatial", loss=m.loss), batch=64)
>>> sorted(set(lc2.out_grid.ravel().tolist())), lc2.halo_cells, lc1.halo_cells
([0, 1, 2, 3], 377, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from graphflow.ir import Node
from graphflow.ops.registry import concrete
from graphflow.partitioners.plan import Plan
from graphflow.viz.groups import is_backward, layer_of, unsplit_name

# op -> axis of its rows (local2d runs in H, W, C, N layout; conv2d in N, C, H, W)
ROW_AXIS = {"local2d": 0, "conv2d": 2}
REPLICATED_ROW = -1  # an input row every worker has (computed from the fed input alone)


@dataclass(frozen=True)
class Halo:
    """Input rows [lo, hi) that worker `dst` reads from worker `src`'s block."""

    src: int
    dst: int
    lo: int
    hi: int
    width: int  # input columns

    @property
    def cells(self) -> int:
        return (self.hi - self.lo) * self.width


@dataclass(frozen=True)
class SpatialLayer:
    name: str  # the layer (name scope), e.g. "lc2"
    op: str
    out_grid: np.ndarray  # (rows, cols) of output locations -> worker
    in_rows: np.ndarray  # (input rows,) -> worker holding it, or REPLICATED_ROW
    in_width: int
    reads: dict[int, tuple[int, int]]  # worker -> the input rows [lo, hi) it reads
    halos: tuple[Halo, ...]
    cell_bytes: int  # bytes of one input location: channels x batch x itemsize

    @property
    def halo_cells(self) -> int:
        return sum(h.cells for h in self.halos)

    @property
    def halo_bytes(self) -> int:
        """Bytes the halos carry forward per step (their gradients carry as many back)."""
        return self.halo_cells * self.cell_bytes

    def halo_mask(self) -> np.ndarray:
        """(input rows, cols): True where an input location crosses to another worker."""
        mask = np.zeros((len(self.in_rows), self.in_width), bool)
        for h in self.halos:
            mask[h.lo:h.hi] = True
        return mask


def spatial_layers(plan: Plan, batch: int = 64) -> list[SpatialLayer]:
    """One SpatialLayer per local2d / conv2d layer of the plan, in graph order."""
    forward = {n.name for n in plan.graph.nodes if not is_backward(n.name)}
    groups: dict[str, list[Node]] = {}
    for n in plan.graph.nodes:
        if n.op in ROW_AXIS and n.name in forward:
            groups.setdefault(unsplit_name(n.name), []).append(n)
    return [_layer(layer_of(name, forward), blocks, plan, batch)
            for name, blocks in groups.items()]


def _layer(name: str, blocks: list[Node], plan: Plan, batch: int) -> SpatialLayer:
    axis = ROW_AXIS[blocks[0].op]
    cols = int(blocks[0].shape[axis + 1])
    out = np.concatenate([np.full((int(b.shape[axis]), cols), plan.placement[b.name])
                          for b in blocks])
    in_rows, offsets = _input_rows(blocks, axis, plan)
    reads, halos = {}, []
    for b in blocks:  # (a worker may hold several blocks: its halo rows are one of their own)
        me = plan.placement[b.name]
        spans = [reads[me]] if me in reads else []
        for piece in _pieces(b.inputs[0]):
            fed = _fed_span(piece, axis)
            lo = fed[0] if fed else _offset(piece, axis, offsets)
            spans.append((lo, lo + int(piece.shape[axis])))
            if plan.placement[piece.name] != me and fed is None:
                halos.append(Halo(plan.placement[piece.name], me, *spans[-1],
                                  int(piece.shape[axis + 1])))
        reads[me] = (min(s[0] for s in spans), max(s[1] for s in spans))
    piece = _pieces(blocks[0].inputs[0])[0]
    width = int(piece.shape[axis + 1])
    # one input location: every dim but rows and columns (channels, batch) times the itemsize
    cell_bytes = (prod(concrete(piece.shape, batch)) * np.dtype(piece.dtype).itemsize
                  // (int(piece.shape[axis]) * width))
    return SpatialLayer(name, blocks[0].op, out, in_rows, width, reads, tuple(halos),
                        cell_bytes)


def _pieces(x: Node) -> list[Node]:
    """The tensors a block's input is made of: the rows it reads, from whichever worker."""
    if x.op == "pad":  # zero rows at the image's edges: made locally, not read
        x = x.inputs[0]
    return list(x.inputs) if x.op == "concat" else [x]


def _source(piece: Node) -> Node:
    return piece.inputs[0] if piece.op == "slice" else piece


def _siblings(node: Node) -> list[Node]:
    """The blocks of the tensor `node` is a block of (just [node] if it is whole)."""
    base = unsplit_name(node.name)
    graph = node.graph
    if base == node.name or f"{base}/part0" not in graph:
        return [node]
    out, j = [], 0
    while f"{base}/part{j}" in graph:
        out.append(graph[f"{base}/part{j}"])
        j += 1
    return out


def _input_rows(blocks: list[Node], axis: int,
                plan: Plan) -> tuple[np.ndarray, dict[str, int]]:
    """Who holds each input row, and the first row of each input block (by name)."""
    sources = {_source(p) for b in blocks for p in _pieces(b.inputs[0])}
    fed = _fed_span(_pieces(blocks[0].inputs[0])[0], axis)
    if fed is not None:  # each worker cuts its rows out of the fed input itself
        return np.full(fed[2], REPLICATED_ROW), {}
    first = _source(_pieces(blocks[0].inputs[0])[0])
    rows, offsets, start = [], {}, 0
    for s in _siblings(first):
        offsets[s.name] = start
        n = int(s.shape[axis])
        rows.append(np.full(n, plan.placement[s.name]))
        start += n
    if _replicated(first, sources):
        rows = [np.full(start, REPLICATED_ROW)]
    return np.concatenate(rows), offsets


def _fed_span(piece: Node, axis: int) -> tuple[int, int, int] | None:
    """The rows [lo, hi) of the fed input a piece holds and the input's height, when the piece
    is cut from a placeholder by slices and layout transposes; else None."""
    node, ax, lo = piece, axis, 0
    while node.op in ("slice", "transpose"):
        if node.op == "transpose":
            ax = node.attrs["axes"][ax]
        else:
            lo += int(node.attrs["begin"][ax])
        node = node.inputs[0]
    if node.op not in ("placeholder", "constant"):
        return None
    return lo, lo + int(piece.shape[axis]), int(node.shape[ax])


def _replicated(first: Node, sources: set[Node]) -> bool:
    """Every worker has the whole input: it is fed, or it is not split and yet read from more
    than one node (each worker computes its own copy, as of the input's layout transpose)."""
    if first.op in ("placeholder", "constant"):
        return True
    return len(sources) > 1 and len(_siblings(first)) == 1


def _offset(piece: Node, axis: int, offsets: dict[str, int]) -> int:
    """The first input row a piece holds."""
    source = _source(piece)
    begin = piece.attrs["begin"][axis] if piece.op == "slice" else 0
    return offsets.get(source.name, 0) + int(begin)
