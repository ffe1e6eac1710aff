"""A plan as a diagram: boxes (layers, or ops with detail="ops"), data edges, cut edges with
the bytes they carry per step, and the per-worker figures. Pure data; the writers draw it.

>>> import graphflow as gf
>>> m = gf.models.lc_large(batch=None)
>>> d = build_diagram(gf.partition(m.graph, 2, "layerwise", loss=m.loss), batch=64)
>>> [b.label for b in d.boxes][:4], d.cuts[0].nbytes
(['x', 'y', 'lc1', 'relu'], 6889472)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from graphflow.ir import Node, format_shape
from graphflow.ops.registry import node_cost
from graphflow.partitioners.plan import Plan, Transfer, WorkerStats
from graphflow.viz.groups import is_backward, layer_of, unsplit_name

if TYPE_CHECKING:
    from graphflow.costmodel import CostModel

DETAILS = ("layers", "ops")
REPLICATED = ("placeholder", "constant")  # every worker that uses them has its own copy


@dataclass(frozen=True)
class Box:
    """One layer (or op): what it computes and which workers run it."""

    id: str
    label: str
    op: str  # the layer's most expensive forward op, or the op itself
    shape: str  # its output (per block, when it is split)
    workers: tuple[tuple[int, float], ...]  # (worker, share of its FLOPs); () = replicated
    flops: float  # forward and backward, per step
    params: int
    param_bytes: int
    members: tuple[str, ...]  # the plan's node names it stands for
    ops: str  # op counts, e.g. "local2d x4, transpose x8"


@dataclass(frozen=True)
class Cut:
    """Transfers from the nodes of one box to the nodes of another (or the same) box."""

    src: str
    dst: str
    backward: bool  # the tensors are gradients
    transfers: tuple[str, ...]  # the plan's transfer keys
    nbytes: int  # per step, at the diagram's batch
    pairs: tuple[tuple[int, int], ...]  # (src worker, dst worker)


@dataclass
class Diagram:
    title: str
    strategy: str
    parts: int
    batch: int
    detail: str
    boxes: list[Box]
    edges: list[tuple[str, str]]  # data edges between boxes (forward only for layers)
    cuts: list[Cut]
    stats: list[WorkerStats]
    busy: list[float]  # the cost model's predicted busy seconds per worker
    step_seconds: float
    idle: list[int]  # workers the plan gave no nodes (Plan.idle_workers)

    def summary(self) -> dict[str, Any]:
        """The figures a script reads (`graphflow visualize --json`)."""
        return {  # the boxes counted under their name: "layers" (or "ops" with detail="ops")
            "title": self.title, "strategy": self.strategy, "parts": self.parts,
            "batch": self.batch, "detail": self.detail, self.detail: len(self.boxes),
            "cut_edges": len(self.cuts),
            "transfers": sum(len(c.transfers) for c in self.cuts),
            "bytes_per_step": sum(c.nbytes for c in self.cuts),
            "predicted_step_ms": 1e3 * self.step_seconds, "idle_workers": self.idle,
            "workers": [{"worker": s.index, "nodes": s.nodes, "sends": s.sends,
                         "recvs": s.recvs, "flops": s.flops, "param_bytes": s.param_bytes,
                         "bytes_in": s.bytes_in, "bytes_out": s.bytes_out,
                         "busy_ms": 1e3 * b} for s, b in zip(self.stats, self.busy)]}


def build_diagram(plan: Plan, detail: str = "layers", batch: int = 64,
                  title: str | None = None, cost: CostModel | None = None) -> Diagram:
    """The diagram of `plan`: one box per layer (name scope), or per node with detail="ops";
    busy times by `cost` (a CostModel; this machine's cached one if None)."""
    if detail not in DETAILS:
        raise ValueError(f"unknown detail '{detail}'; use one of: {', '.join(DETAILS)}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    forward = {n.name for n in plan.graph.nodes if not is_backward(n.name)}
    groups: dict[str, list[Node]] = {}
    for n in plan.graph.nodes:
        key = layer_of(n.name, forward) if detail == "layers" else n.name
        groups.setdefault(key, []).append(n)
    box_of = {n.name: key for key, nodes in groups.items() for n in nodes}
    handed_on = {x.name for n in plan.graph.nodes if not is_backward(n.name)
                 for x in n.inputs if box_of[x.name] != box_of[n.name]}
    boxes = [_box(key, nodes, plan, batch, detail, handed_on) for key, nodes in groups.items()]
    order = {key: i for i, key in enumerate(groups)}
    edges = sorted({(box_of[x.name], box_of[n.name]) for n in plan.graph.nodes
                    for x in n.inputs if box_of[x.name] != box_of[n.name]
                    and (detail == "ops" or not (is_backward(n.name) or is_backward(x.name)))},
                   key=lambda e: (order[e[0]], order[e[1]]))
    prediction = plan.predict(batch, cost)
    busy = [*prediction.busy, *[0.0] * (plan.parts - len(prediction.busy))][:plan.parts]
    return Diagram(title or f"{plan.strategy}, {plan.parts} worker(s)", plan.strategy,
                   plan.parts, batch, detail, boxes, edges, cuts(plan, box_of, batch),
                   plan.stats(batch), busy, prediction.step_seconds, plan.idle_workers())


def cuts(plan: Plan, box_of: dict[str, str], batch: int) -> list[Cut]:
    """The plan's transfers grouped by (producer's box, first consumer's box, direction).

    A tensor crosses to a worker once however many of its nodes use it, so each transfer is
    drawn once: to the box of its first consumer on the receiving worker."""
    first: dict[tuple[str, int], str] = {}  # (tensor, worker) -> first consumer
    for n in plan.graph.nodes:
        for x in n.inputs:
            first.setdefault((x.name, plan.placement[n.name]), n.name)
    grouped: dict[tuple[str, str, bool], list[Transfer]] = {}
    for t in plan.transfers:
        consumer = first[t.tensor, t.dst]
        key = (box_of[t.tensor], box_of[consumer], is_backward(t.tensor))
        grouped.setdefault(key, []).append(t)
    return [Cut(src, dst, backward, tuple(t.key for t in ts), sum(t.nbytes(batch) for t in ts),
                tuple(sorted({(t.src, t.dst) for t in ts})))
            for (src, dst, backward), ts in grouped.items()]


def _box(key: str, nodes: list[Node], plan: Plan, batch: int, detail: str,
         handed_on: set[str]) -> Box:
    flops = {n.name: node_cost(n, batch).flops for n in nodes}
    params = [n for n in nodes if n.op == "parameter"]
    param_bytes = sum(prod(n.shape) * np.dtype(n.dtype).itemsize for n in params)
    fwd = [n for n in nodes if not is_backward(n.name) and n.op != "parameter"] or nodes
    main = max(fwd, key=lambda n: flops[n.name])
    counts = Counter(n.op for n in fwd)
    ops = ", ".join(f"{op} x{c}" if c > 1 else op for op, c in counts.most_common())
    return Box(key, key, main.op if detail == "layers" else nodes[0].op,
               _output_shape(fwd, handed_on), _shares(nodes, plan, flops),
               sum(flops.values()), sum(prod(n.shape) for n in params), param_bytes,
               tuple(n.name for n in nodes), ops)


def _shares(nodes: list[Node], plan: Plan, flops: dict[str, float]) -> tuple[tuple[int, float],
                                                                            ...]:
    """Each worker's share of the box's FLOPs (of its nodes, if it has no FLOPs); a worker
    that holds only nodes without FLOPs (a parameter) has a share of 0, but is listed."""
    placed = [n for n in nodes if n.op not in REPLICATED]
    weight = {plan.placement[n.name]: 0.0 for n in placed}
    total = sum(flops[n.name] for n in placed)
    for n in placed:
        weight[plan.placement[n.name]] += flops[n.name] if total > 0 else 1
    norm = sum(weight.values())
    return tuple((w, weight[w] / norm) for w in sorted(weight))


def _output_shape(fwd: list[Node], handed_on: set[str]) -> str:
    """The shape of what the box hands on (per block, `7..8` where blocks differ)."""
    outs = [n for n in fwd if n.name in handed_on] or fwd[-1:]
    last = unsplit_name(outs[-1].name)
    blocks = [n.shape for n in outs if unsplit_name(n.name) == last]
    if len(blocks) == 1 or len({len(s) for s in blocks}) > 1:
        return format_shape(blocks[-1])
    dims = []
    for column in zip(*blocks):
        lo, hi = min(column, key=_dim), max(column, key=_dim)
        dims.append("N" if lo is None else str(lo) if lo == hi else f"{lo}..{hi}")
    return f"[{', '.join(dims)}] x{len(blocks)}"


def _dim(d: int | None) -> int:
    return -1 if d is None else d
