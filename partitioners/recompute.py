"""Recompute instead of receive: a cheap value that reaches a worker by way of another is
computed again where it is used.

A tensor that worker a sends to worker b, computed on a from a value a itself received (from b:
a round trip; from a third worker: a relay), costs b a hop for every worker it passed through.
When the nodes between those received values and the tensor are cheap, b runs copies of them
from the same inputs instead, and waits only for the inputs: the spatial strategy's loss is the
example. Its dense layer's partial products are summed on worker 0, which computes the loss and
sends the gradient of the logits back, so worker 1 idled for a round trip each step; now both
workers sum the partials and compute the loss gradient (a few 64 x 10 values).

A pure pass between placement and split (TensorFlow's graph optimizers likewise duplicate cheap
nodes to save transfers). Copies are named `<node>@w<worker>`; every copy computes what its
original does, from the same values, so a training step gives the same result.

>>> import graphflow as gf
>>> m = gf.models.lc_large(batch=None)
>>> plan = gf.partition(m.graph, 2, "spatial", loss=m.loss)
>>> sorted(n.name for n in plan.workers[1].graph if n.name.endswith("@w1"))
['fc/add@w1', 'fc/matmul/sum1@w1', 'grad/loss/softmax_cross_entropy_grad@w1']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from graphflow.costmodel import CostModel, tensor_bytes
from graphflow.ir import SOURCE_OPS, Graph, Node, users_of

COPY = re.compile(r"@w\d+$")
SHARE = 0.01  # the most a copy may cost, as a share of the predicted step
# Plan nodes simulated to price candidates, at most: each candidate costs a simulation of the
# whole plan, so the bound is in nodes. speech-mlp's spatial plan on 32 workers priced 97
# candidates of 5,500 nodes each (57 s) and gained nothing; 2-4 workers of the reference
# workloads price 1-4 plans of 80-400 nodes. A count, not a time: a plan is the same on every
# machine.
MAX_PRICED_NODES = 50_000


def recompute_relays(graph: Graph, placement: Mapping[str, int], cost: CostModel | None = None,
                     batch: int = 64) -> dict[str, int]:
    """Add to `graph` (in place) the copies that spare relayed transfers; returns the placement
    with the copies on their workers.

    A tensor n that worker a sends to b gets a copy on b when: n is computed on a from a value a
    received; a reads n too (so none of a's work goes unused); the nodes behind n on a, back to
    values that are not late, cost at most SHARE of the step and read from a at most twice the
    bytes of n; and the cost model (default: the built-in one, so that a plan is the same on
    every machine) predicts a stream of steps no slower with the copies. No
    slower, not faster: a copy never makes n later on b, which would wait for a's inputs
    anyway, but the model prices a hop at the link's idle latency and may not see the gain (in
    traces on this 2-core machine a hop took 0.5-0.6 ms under load, against 0.1 ms idle)."""
    cost = cost or CostModel.builtin(batch)
    where = dict(placement)
    best = cost.stream_seconds(graph, where, batch)
    tried: set[tuple[str, int]] = set()
    priced = [0]  # nodes simulated to price candidates so far (see MAX_PRICED_NODES)
    while (step := _copy_one(graph, where, cost, batch, best, tried, priced)) is not None:
        best = step
    _after_originals(graph)
    return where


def _copy_one(graph: Graph, where: dict[str, int], cost: CostModel, batch: int, best: float,
              tried: set[tuple[str, int]], priced: list[int]) -> float | None:
    """Make the first copy not tried yet that keeps the predicted step within `best`; its
    predicted step, or None when no candidate is left (or MAX_PRICED_NODES would be passed)."""
    order = graph.toposort()
    users = users_of(order)
    late = _late(order, where, cost, batch, SHARE * best)
    for n in users:
        a = where[n.name]
        readers = {where[u.name] for u in users[n]}
        if a not in readers:
            continue  # a only relays n: copying it would leave a's work unused
        for b in sorted(readers - {a}):
            if (n.name, b) in tried or n.op in SOURCE_OPS or n.op == "concat":
                continue  # (a gather's route is the strategy's: partitioners/collectives.py)
            tried.add((n.name, b))
            cone = _relay_cone(n, a, where, late, cost, batch, SHARE * best)
            if not cone:
                continue
            if priced[0] + len(graph.nodes) > MAX_PRICED_NODES:
                return None
            priced[0] += len(graph.nodes)
            undo = _copy_onto(graph, cone, b, where, users)
            step = cost.stream_seconds(graph, where, batch)
            if step <= best:
                return step
            undo()
    return None


def copy_name(name: str, worker: int) -> str:
    return f"{name}@w{worker}"


def original_name(name: str) -> str:
    """The node a copy was made from: `loss@w1` -> `loss`."""
    return COPY.sub("", name)


def _after_originals(graph: Graph) -> None:
    """Move each copy to just after the node it copies: the graph's order stays topological
    (a saved graph needs that) and is otherwise unchanged."""
    copies: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if (origin := original_name(n.name)) != n.name:
            copies.setdefault(origin, []).append(n)
    order: list[Node] = []

    def place(n: Node) -> None:
        order.append(n)
        for c in copies.get(n.name, []):
            place(c)
    for n in graph.nodes:
        if original_name(n.name) == n.name:
            place(n)
    graph.nodes = order


def _late(order: list[Node], where: Mapping[str, int], cost: CostModel, batch: int,
          budget: float) -> set[Node]:
    """The cheap nodes (`budget` seconds at most) a worker computes from a value it receives,
    directly or through other such nodes of its own: the nodes a relay passes through."""
    late: set[Node] = set()
    for n in order:
        w = where[n.name]
        if n.op in SOURCE_OPS or cost.node_seconds(n, batch) > budget:
            continue
        if any(x.op not in SOURCE_OPS and (where[x.name] != w or x in late) for x in n.inputs):
            late.add(n)
    return late


def _relay_cone(n: Node, a: int, where: Mapping[str, int], late: set[Node], cost: CostModel,
                batch: int, budget: float) -> list[Node]:
    """The `late` nodes on worker `a` that `n` is computed from, if `n` is late, they cost
    `budget` seconds at most together and the values they read from `a` hold at most twice the
    bytes of `n`; else []. The cone grows into a late input only if that input's own inputs on
    `a` hold at most twice its bytes (a bias add joins; a reduction of a large value stays)."""
    if n not in late:
        return []
    cone, stack, seen = [], [n], {n}
    while stack:
        x = stack.pop()
        cone.append(x)
        for y in x.inputs:
            if y in seen or y not in late or where[y.name] != a:
                continue
            seen.add(y)
            if _bytes_from(y, a, where, seen, batch) <= 2 * tensor_bytes(y, batch):
                stack.append(y)
    inside = set(cone)
    reads = sum(_bytes_from(x, a, where, inside, batch) for x in cone)
    cheap = sum(cost.node_seconds(x, batch) for x in cone) <= budget
    return cone if cheap and reads <= 2 * tensor_bytes(n, batch) else []


def _bytes_from(n: Node, a: int, where: Mapping[str, int], seen: set[Node], batch: int) -> int:
    """Bytes of `n`'s inputs on worker `a` not in `seen` (what a copy of `n` would receive)."""
    return sum(tensor_bytes(x, batch) for x in n.inputs if x not in seen
               and x.op not in ("placeholder", "constant") and where[x.name] == a)


def _copy_onto(graph: Graph, cone: list[Node], b: int, where: dict[str, int],
               users: Mapping[Node, list[Node]]) -> Callable[[], None]:
    """Copy `cone` onto worker b (reusing copies made before) and point b's readers of the
    originals at the copies; returns what undoes it."""
    copies, made = {}, []
    for x in graph.toposort(cone):
        name = copy_name(x.name, b)
        if name not in graph:
            inputs = [copies.get(y, y) for y in x.inputs]
            made.append(graph.insert(x.op, name, inputs, x.attrs, x.shape, x.dtype,
                                     f"worker:{b}", x.source))
            where[name] = b
        copies[x] = graph[name]
    rewired = [(u, u.inputs) for x in cone for u in users[x]
               if where[u.name] == b and u not in copies]
    for u, inputs in rewired:
        u.inputs = tuple(copies.get(y, y) for y in inputs)

    def undo() -> None:
        for u, inputs in rewired:
            u.inputs = inputs
        graph.remove(made)
        for c in made:
            del where[c.name]
    return undo
