"""split(graph, placement) -> Plan: one subgraph per worker, a Send/Recv pair at every cut edge.

Pure: nothing runs. A tensor crosses to a worker once, however many of that worker's nodes use
it (DistBelief Fig. 1; TensorFlow's de-duplicated receives). Placeholders and constants are
replicated to each worker that uses them (every worker is fed its own copy of the batch), so
only activations, gradients and parameters cross.

>>> import graphflow as gf
>>> with gf.Graph() as g:
...     x = gf.placeholder("x", (None, 4))
...     a = gf.relu(x, name="a")
...     b = gf.exp(a, name="b")
...     c = gf.neg(a, name="c")
>>> plan = split(g, {"x": 0, "a": 0, "b": 1, "c": 1})
>>> [n.name for n in plan.workers[1].graph]
['recv/a', 'b', 'c']
>>> plan.transfers[0].key
'a->w1'
"""

from __future__ import annotations

from collections.abc import Mapping

from graphflow.errors import GraphError, located
from graphflow.ir import Graph, Node
from graphflow.partitioners.feeds import cut_feeds
from graphflow.partitioners.plan import Plan, Transfer, WorkerPlan

REPLICATED = ("placeholder", "constant")


def transfer_key(tensor: str, dst: int) -> str:
    return f"{tensor}->w{dst}"


def split(graph: Graph, placement: Mapping[str, int], parts: int | None = None,
          strategy: str = "manual") -> Plan:
    """Cut `graph` into `parts` per-worker subgraphs along `placement` (node name -> worker;
    default parts: the highest worker used + 1)."""
    for n in graph.nodes:
        if n.name not in placement:
            raise GraphError(located(n, "has no worker in the placement"))
    if parts is None:
        parts = max((placement[n.name] for n in graph.nodes), default=0) + 1
    subs = [Graph(graph.dtype, graph.seed) for _ in range(parts)]
    local: list[dict[Node, Node]] = [{} for _ in range(parts)]  # original -> copy on worker
    transfers: list[Transfer] = []

    def on(worker: int, x: Node) -> Node:
        """x as seen on `worker`: its copy, a replica, or a recv (sent once per worker)."""
        if x in local[worker]:
            return local[worker][x]
        if x.op in REPLICATED:
            return _copy(subs[worker], local[worker], x, ())
        src = placement[x.name]
        key = transfer_key(x.name, worker)
        subs[src].insert("send", f"send/{x.name}->w{worker}", [local[src][x]],
                         {"key": key, "src": src, "dst": worker}, (), x.dtype, x.device,
                         x.source)
        recv = subs[worker].insert("recv", f"recv/{x.name}", [],
                                   {"key": key, "src": src, "dst": worker, "shape": x.shape,
                                    "dtype": x.dtype}, x.shape, x.dtype, x.device, x.source)
        local[worker][x] = recv
        transfers.append(Transfer(key, x.name, src, worker, x.shape, x.dtype))
        return recv

    for n in graph.toposort():
        if n.op in REPLICATED:
            continue  # copied into each worker that uses it, when first used
        w = placement[n.name]
        if not 0 <= w < parts:
            raise GraphError(located(n, f"placed on worker {w}, outside 0..{parts - 1}"))
        _copy(subs[w], local[w], n, [on(w, x) for x in n.inputs])
    workers = [WorkerPlan(i, subs[i]) for i in range(parts)]
    feeds = {i: cuts for i, sub in enumerate(subs) if (cuts := cut_feeds(sub))}
    return Plan(strategy, graph, dict(placement), workers, transfers, feeds=feeds)


def _copy(sub: Graph, local: dict[Node, Node], n: Node, inputs: object) -> Node:
    copy = sub.insert(n.op, n.name, list(inputs), n.attrs, n.shape, n.dtype, n.device, n.source)
    local[n] = copy
    return copy
