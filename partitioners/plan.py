"""A Plan: the partitioned graph as data. It prints, saves to JSON and loads back.

Per worker: its subgraph (with send/recv nodes), FLOPs, parameter bytes, bytes in and out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from graphflow.errors import count_of
from graphflow.init import assemble_blocks
from graphflow.ir import Graph, Shape
from graphflow.ops.registry import concrete, node_cost
from graphflow.partitioners.blocks import Join
from graphflow.partitioners.planfile import (
    FORMAT,
    PlanError,
    check_consistent,
    check_fields,
    read_json,
    reading,
)
from graphflow.partitioners.recompute import original_name
from graphflow.serialize import graph_from_dict, graph_to_dict
from graphflow.units import fmt_bytes


@dataclass(frozen=True)
class Transfer:
    """One tensor crossing from worker src to worker dst each step."""

    key: str
    tensor: str
    src: int
    dst: int
    shape: Shape
    dtype: str

    def nbytes(self, batch: int) -> int:
        return prod(concrete(self.shape, batch)) * np.dtype(self.dtype).itemsize


@dataclass
class WorkerPlan:
    index: int
    graph: Graph

    def parameters(self) -> list[str]:
        return [n.name for n in self.graph.nodes if n.op == "parameter"]

    def fed_bytes(self, batch: int) -> int:
        """Bytes of input the driver sends this worker each step (its placeholders, as cut)."""
        return sum(prod(concrete(n.shape, batch)) * np.dtype(n.dtype).itemsize
                   for n in self.graph.placeholders())


@dataclass(frozen=True)
class WorkerStats:
    index: int
    nodes: int
    sends: int
    recvs: int
    flops: float
    param_bytes: int
    bytes_in: int
    bytes_out: int


@dataclass
class Plan:
    """The output of a partitioner: the whole graph, the placement and one WorkerPlan each."""

    strategy: str
    graph: Graph
    placement: dict[str, int]
    workers: list[WorkerPlan]
    transfers: list[Transfer]
    loss: str | None = None  # the loss node's name, when the plan trains
    grads: dict[str, str] = field(default_factory=dict)  # parameter -> its gradient node
    # worker -> placeholder -> (axis, lo, hi): the part of the input that worker is fed
    feeds: dict[int, dict[str, tuple[int, int, int]]] = field(default_factory=dict)
    # an original node the strategy holds only in pieces -> how a fetch of it joins them
    joins: dict[str, Join] = field(default_factory=dict)

    @property
    def parts(self) -> int:
        return len(self.workers)

    def worker_feeds(self, index: int, feeds: Mapping[str, np.ndarray],
                     alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None
                     ) -> dict[str, np.ndarray]:
        """What worker `index` is fed of `feeds` (by placeholder name): the placeholders its
        graph has, each cut to the rows the worker reads (see partitioners/feeds.py), into
        an array from `alloc(shape, dtype)` (default: a new one)."""
        graph, cuts = self.workers[index].graph, self.feeds.get(index, {})
        out = {}
        for name, value in feeds.items():
            if name not in graph or graph[name].op != "placeholder":
                continue
            if name in cuts:
                axis, lo, hi = cuts[name]
                rows = np.asarray(value)[(slice(None),) * axis + (slice(lo, hi),)]
                value = (alloc or np.empty)(rows.shape, rows.dtype)
                np.copyto(value, rows)
            out[name] = value
        return out

    def worker_of(self, name: str) -> int:
        if name not in self.placement:
            raise KeyError(f"no node named '{name}' in the plan")
        return self.placement[name]

    def assemble(self, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Values keyed by plan parameter (e.g. gradients or parameters fetched from workers)
        -> keyed by the original parameter, joining the blocks of split parameters; other
        keys (the "loss" of `Cluster.gradients`) as they are."""
        out: dict[str, np.ndarray] = {}
        blocks: dict[str, list[tuple[dict[str, Any], np.ndarray]]] = {}
        for name, value in values.items():
            spec = self.graph[name].attrs.get("block") if name in self.graph else None
            if spec is None:
                out[name] = value
            else:
                blocks.setdefault(spec["of"], []).append((spec, value))
        for name, parts in blocks.items():
            whole = parts[0][0]["attrs"]
            out[name] = assemble_blocks(tuple(whole["shape"]), parts, whole["dtype"])
        return out

    def idle_workers(self) -> list[int]:
        """The workers the strategy gave no nodes (a manual plan naming fewer devices)."""
        return [w.index for w in self.workers
                if all(n.op in ("send", "recv") for n in w.graph.nodes)]

    def stats(self, batch: int) -> list[WorkerStats]:
        batch, out = check_batch(batch), []
        for w in self.workers:
            nodes = [n for n in w.graph.nodes if n.op not in ("send", "recv")]
            flops = sum(node_cost(n, batch).flops for n in nodes)
            params = sum(prod(n.shape) * np.dtype(n.dtype).itemsize
                         for n in nodes if n.op == "parameter")
            out.append(WorkerStats(
                w.index, len(nodes),
                sum(t.src == w.index for t in self.transfers),
                sum(t.dst == w.index for t in self.transfers), flops, params,
                sum(t.nbytes(batch) for t in self.transfers if t.dst == w.index),
                sum(t.nbytes(batch) for t in self.transfers if t.src == w.index)))
        return out

    def predict(self, batch: int = 64, cost: Any = None, link: Any = None) -> Any:
        """The cost model's prediction of one training step (graphflow.costmodel.Prediction),
        by `cost` or else the one `graphflow show` uses (`local_cost`: cached kernel times of
        a local worker's thread share, nothing timed). Without `link`, the workers are this
        machine's: their kernels run slower while another computes, as `graphflow bench
        speedup` last measured (`CostModel.contention`)."""
        batch = check_batch(batch)
        cm = cost or local_cost(self, batch)
        return cm.predict(self.graph, self.placement, batch, link,
                          contention=cm.contention if link is None else 1.0)

    def report(self, batch: int = 64, cost: Any = None) -> str:
        """A table per worker: nodes, sends, receives, GFLOPs, parameter MB, MB in / out and
        the cost model's predicted busy time, then the predicted step time (`cost` as in
        `predict`)."""
        batch = check_batch(batch)
        cost = cost or local_cost(self, batch)
        prediction = self.predict(batch, cost)
        busy = list(prediction.busy) + [0.0] * (self.parts - len(prediction.busy))  # idle last
        stats = self.stats(batch)
        lines = [f"plan: {self.strategy}, {self.parts} worker(s), batch {batch}, "
                 f"{len(self.transfers)} transfers of "
                 f"{fmt_bytes(sum(t.nbytes(batch) for t in self.transfers))} per step",
                 f"{'worker':>6} {'nodes':>6} {'sends':>6} {'recvs':>6} {'GFLOP':>8} "
                 f"{'params MB':>10} {'in MB':>8} {'out MB':>8} {'busy ms':>8}"]
        for s in stats:
            lines.append(f"{s.index:>6} {s.nodes:>6} {s.sends:>6} {s.recvs:>6} "
                         f"{s.flops / 1e9:>8.3f} {s.param_bytes / 1e6:>10.2f} "
                         f"{s.bytes_in / 1e6:>8.2f} {s.bytes_out / 1e6:>8.2f} "
                         f"{1e3 * busy[s.index]:>8.1f}")
        if idle := self.idle_workers():
            lines.append(f"idle: worker(s) {', '.join(map(str, idle))} got no nodes")
        copies = [n.name for n in self.graph if original_name(n.name) != n.name]
        if copies:  # see partitioners/recompute.py
            lines.append(f"recomputed instead of received: {', '.join(copies)}")
        lines.append(f"predicted step: {1e3 * prediction.step_seconds:.1f} ms"
                     + contention_note(cost.contention, sum(b > 0 for b in busy)))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    # -- as data ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "strategy": self.strategy, "graph": graph_to_dict(self.graph),
                "placement": self.placement,
                "workers": [graph_to_dict(w.graph) for w in self.workers],
                "transfers": [{"key": t.key, "tensor": t.tensor, "src": t.src, "dst": t.dst,
                               "shape": list(t.shape), "dtype": t.dtype}
                              for t in self.transfers],
                "loss": self.loss, "grads": self.grads,
                "feeds": {str(i): {k: list(c) for k, c in cuts.items()}
                          for i, cuts in self.feeds.items()},
                "joins": {name: j.to_dict() for name, j in self.joins.items()}}

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """A plan from `to_dict()`'s data, its parts checked to agree (PlanError: "not a
        graphflow plan (...)", saying what is wrong)."""
        check_fields(data)
        with reading("graph"):
            graph = graph_from_dict(data["graph"])
        workers = []
        for i, g in enumerate(data["workers"]):
            with reading(f"workers[{i}]"):
                workers.append(WorkerPlan(i, graph_from_dict(g)))
        transfers = []
        for i, t in enumerate(data["transfers"]):
            with reading(f"transfers[{i}]"):
                transfers.append(Transfer(str(t["key"]), str(t["tensor"]), _index(t["src"]),
                                          _index(t["dst"]), tuple(t["shape"]), str(t["dtype"])))
        with reading("placement"):
            placement = {k: _index(v) for k, v in data["placement"].items()}
        with reading("feeds"):
            feeds = {int(i): {k: (int(c[0]), int(c[1]), int(c[2])) for k, c in cuts.items()}
                     for i, cuts in data.get("feeds", {}).items()}
        with reading("joins"):
            joins = {str(k): Join(str(j["how"]), tuple(map(str, j["blocks"])), int(j["axis"]))
                     for k, j in data.get("joins", {}).items()}
        plan = cls(data["strategy"], graph, placement, workers, transfers, data.get("loss"),
                   dict(data.get("grads", {})), feeds, joins)
        check_consistent(plan)
        return plan

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """The plan saved at `path`; PlanError "PATH: not a graphflow plan (...)" for a file
        that is not one or whose parts disagree (workers cut short, a transfer to none)."""
        data = read_json(path)
        try:
            return cls.from_dict(data)
        except PlanError as e:
            raise PlanError(f"{path}: {e}") from None


def _index(value: Any) -> int:
    """A worker index from JSON: an integer, not a float or a boolean that int() would take."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"worker index {value!r} is not an integer")
    return value


def check_batch(batch: Any) -> int:
    """`batch` for a report or a prediction: a positive integer."""
    return count_of(batch, "batch")


def local_cost(plan: Plan, batch: int) -> Any:
    """The cost model `graphflow show` and `visualize` predict `plan` by, timing nothing:
    this machine's cached kernel times for the BLAS threads each of its local workers gets
    (CostModel.timed_for, measure=False), so Python and the commands agree."""
    from graphflow.costmodel import CostModel  # the cost model imports the op table

    return CostModel.timed_for([plan.graph], batch, plan.parts, measure=False)


def contention_note(contention: float, busy_workers: int) -> str:
    """What a local prediction says of the workers slowing each other, if it counted that
    (only busy ones can)."""
    if contention <= 1.0 or busy_workers < 2:
        return ""
    return (f" (workers here slow each other {contention:.2f}x, as `graphflow bench speedup` "
            f"last measured)")
