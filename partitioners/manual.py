"""Manual placement from `gf.device("worker:K")` scopes, and the placement conventions every
strategy shares (which forward node a backward node belongs with, where a parameter's
gradient ends, where replicated inputs go).

Conventions: placeholders and constants are replicated to the workers that use them (their
entry names their first consumer's worker); a parameter sits where it is owned; a backward node
sits with the forward node it differentiates; a parameter's gradient ends on its worker.

>>> import graphflow as gf
>>> from graphflow.partitioners import manual
>>> with gf.Graph() as g:
...     x = gf.placeholder("x", (None, 4))
...     h = gf.relu(x)
...     with gf.device("worker:1"):
...         y = gf.reduce_sum(h)
>>> manual.place(g, 2, None)[1]
{'x': 0, 'relu': 0, 'reduce_sum': 1}
"""

from __future__ import annotations

import re

from graphflow.costmodel import LOCAL_OPS, CostModel
from graphflow.errors import located
from graphflow.ir import SOURCE_OPS, Graph, Node

_DEVICE = re.compile(r"worker:(\d+)")


def users(graph: Graph) -> dict[Node, list[Node]]:
    """Each node's consumers, in graph order."""
    out: dict[Node, list[Node]] = {n: [] for n in graph.nodes}
    for n in graph.nodes:
        for x in dict.fromkeys(n.inputs):
            out[x].append(n)
    return out


def backward_nodes(graph: Graph) -> set[Node]:
    """Nodes named `grad/...` and every non-source node computed from one (e.g. gradient sums)."""
    back: set[Node] = set()
    for n in graph.toposort():
        if n.op not in SOURCE_OPS and (n.name.startswith("grad/")
                                       or any(x in back for x in n.inputs)):
            back.add(n)
    return back


def anchors(graph: Graph) -> dict[Node, Node]:
    """The forward node each non-source node belongs with: itself for forward nodes; for
    `grad/<forward name>/...` nodes the longest forward name that prefixes them; for other
    backward nodes the anchor of their first backward input.

    >>> import graphflow as gf
    >>> with gf.Graph() as g:
    ...     w = gf.parameter("w", (3,))
    ...     loss = gf.reduce_sum(w * w)
    ...     _ = gf.gradients(loss, [w])
    >>> sorted({a.name for a in anchors(g).values()})
    ['mul', 'reduce_sum']
    """
    back = backward_nodes(graph)
    out: dict[Node, Node] = {}
    for n in graph.toposort():
        if n.op in SOURCE_OPS:
            continue
        if n not in back:
            out[n] = n
            continue
        found = _forward_prefix(graph, n.name, back) if n.name.startswith("grad/") else None
        if found is None:
            first = next((x for x in n.inputs if x in back), None)
            found = out[first] if first is not None else n
        out[n] = found
    return out


def _forward_prefix(graph: Graph, name: str, back: set[Node]) -> Node | None:
    rest = name[len("grad/"):].split("/")
    for k in range(len(rest), 0, -1):
        cand = "/".join(rest[:k])
        if cand in graph and graph[cand] not in back and graph[cand].op not in SOURCE_OPS:
            return graph[cand]
    return None


def param_gradients(graph: Graph) -> dict[Node, Node]:
    """parameter -> the node that ends its gradient, as gf.gradients recorded it."""
    return {graph[p]: graph[g] for p, g in graph.gradients.items()
            if graph[p].op == "parameter"}


def complete(graph: Graph, placement: dict[str, int],
             grads: dict[Node, Node] | None = None) -> dict[str, int]:
    """Apply the shared conventions to a placement of the computed nodes and parameters: each
    parameter's gradient moves to the parameter's worker; placeholders and constants take
    their first consumer's worker (0 if unused). Returns the placement in graph order."""
    grads = grads if grads is not None else param_gradients(graph)
    out = dict(placement)
    for p, g in grads.items():
        out[g.name] = out[p.name]
    use = users(graph)
    for n in graph.nodes:
        if n.op in LOCAL_OPS:
            out[n.name] = out[use[n][0].name] if use[n] else 0
    return {n.name: out[n.name] for n in graph.nodes}


def parse_device(node: Node, parts: int) -> int | None:
    """The worker index of `node.device` ("worker:K"), None when it has no device.

    Raises ValueError naming the node and its line when the string is malformed or K >= parts.
    """
    if node.device is None:
        return None
    m = _DEVICE.fullmatch(node.device)
    if m is None:
        raise ValueError(located(node, f"device {node.device!r} is malformed, expected "
                                       f"'worker:K' with 0 <= K < {parts}"))
    k = int(m.group(1))
    if k >= parts:
        raise ValueError(located(node, f"device {node.device!r} is out of range: the plan "
                                       f"has {parts} workers (0..{parts - 1})"))
    return k


def place(graph: Graph, parts: int,
          cost: CostModel | None = None) -> tuple[Graph, dict[str, int]]:
    """Place nodes by their device scopes; forward nodes without one go to worker 0, backward
    nodes without one follow their forward node, parameters without one their first consumer.
    `cost` is unused (manual placement needs no cost model)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    explicit = {n: parse_device(n, parts) for n in graph.nodes}
    anchor = anchors(graph)
    out: dict[str, int] = {}
    order = graph.toposort()
    for n in order:
        if n in anchor and anchor[n] is n:
            out[n.name] = explicit[n] or 0
    for n in order:
        if n in anchor and anchor[n] is not n:
            k = explicit[n]
            out[n.name] = k if k is not None else out.get(anchor[n].name, 0)
    use = users(graph)
    for p in graph.parameters():
        k = explicit[p]
        out[p.name] = k if k is not None else (out[use[p][0].name] if use[p] else 0)
    return graph, complete(graph, out, param_gradients(graph))
