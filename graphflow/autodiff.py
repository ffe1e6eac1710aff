"""Reverse-mode autodiff that adds the backward nodes to the same graph (TF1 style).

The backward pass is ordinary graph nodes built by each op's gradient rule, so it is printed,
partitioned and executed like the forward pass. Gradient nodes take the device of the forward
node they come from, so a placement of the forward pass carries over to the backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphflow.errors import GraphError, described, did_you_mean, located
from graphflow.ir import SOURCE_OPS, Graph, Node, current_graph, user_source_line
from graphflow.ops.registry import FLOAT_DTYPES, REGISTRY, apply


def gradients(loss: Node, wrt: Node | str | Sequence[Node | str],
              dy: Node | None = None) -> dict[str, Node]:
    """d(loss)/d(w) for each node in `wrt` (nodes or their names), keyed by the node's name.

    `loss` must be a scalar unless `dy`, the gradient flowing into `loss`, is given.

    >>> import graphflow as gf
    >>> with gf.Graph() as g:
    ...     w = gf.parameter("w", (3,))
    ...     loss = gf.reduce_sum(w * w)
    ...     grads = gf.gradients(loss, [w])
    >>> grads["w"].shape
    (3,)
    """
    if not isinstance(loss, Node):
        raise GraphError(f"gradients ({user_source_line()}): the loss must be a node, got "
                         f"{described(loss)}")
    graph = loss.graph
    if graph is None or (dy is None and loss.shape != ()):
        raise GraphError(located(loss, f"gradients need a scalar loss, got shape {loss.shape}"))
    wrt = _nodes(graph, wrt)

    forward = graph.ancestors([loss])
    # Only nodes that lie on a path from some `wrt` to the loss need a gradient.
    needs: set[Node] = set(wrt)
    for n in forward:
        if any(x in needs for x in n.inputs):
            needs.add(n)
    reachable = set(forward)
    for w in wrt:
        if w not in reachable:
            raise GraphError(located(w, f"the loss '{loss.name}' does not depend on it"))
        if w.dtype not in FLOAT_DTYPES:
            raise GraphError(located(w, f"gets no gradient from the loss '{loss.name}': it is "
                                        f"{w.dtype}, and only float values are differentiable"))

    if dy is None:  # asked again (a trainer on a graph whose builder took its gradients)
        built = _built_before(loss, wrt)
        if built is not None:
            return built
    with graph, graph.sourced(loss.source):
        # a constant, not ones_like(loss): the backward pass need not wait for the loss value
        seed = dy if dy is not None else apply("constant", name=_free_name(f"grad/{loss.name}"),
                                               seed=True, loss=loss.name,
                                               value=np.ones(loss.shape, loss.dtype))
        partials: dict[Node, list[Node]] = {loss: [seed]}
        done: dict[Node, Node] = {}
        for node in reversed(forward):
            if node not in needs or node not in partials:
                continue
            with _scoped(graph, node):
                dy = _sum(partials.pop(node))
            done[node] = dy
            if node.op in SOURCE_OPS:
                continue
            rule = REGISTRY[node.op].grad
            if rule is None:
                raise GraphError(located(node, "has no gradient rule, but the loss depends on "
                                               "a parameter through it"))
            wants = tuple(x in needs for x in node.inputs)
            with _scoped(graph, node):
                grads = rule(node, dy, wants)
            for x, want, g in zip(node.inputs, wants, grads, strict=True):
                if want and g is not None:
                    partials.setdefault(x, []).append(g)
    for w in wrt:
        if w not in done:  # the loss depends on it, but no gradient rule passes one back
            raise GraphError(located(w, f"gets no gradient from the loss '{loss.name}': the "
                                        "gradient rules on its paths to the loss give it none "
                                        "(an op there reads only its shape, say)"))
    graph.gradients.update({w.name: done[w].name for w in wrt})
    return {w.name: done[w] for w in wrt}


def _nodes(graph: Graph, wrt: Node | str | Sequence[Node | str]) -> list[Node]:
    """The nodes of `graph` that `wrt` (a node, a name, or a list of them) stands for."""
    items = [wrt] if isinstance(wrt, Node | str) else list(wrt)
    out = []
    for w in items:
        if isinstance(w, str):
            if w not in graph:
                hint = did_you_mean(w, (n.name for n in graph.nodes))
                raise GraphError(f"gradients ({user_source_line()}): no node named '{w}' in the "
                                 f"loss's graph{hint}")
            w = graph[w]
        elif not isinstance(w, Node):
            raise GraphError(f"gradients ({user_source_line()}): wrt must hold nodes or node "
                             f"names, got {described(w)}")
        if w.graph is not graph:
            raise GraphError(located(w, "is not in the loss's graph"))
        out.append(w)
    return out


def drop_gradients(graph: Graph, loss: Node) -> None:
    """Remove, in place, the backward nodes (`grad/...`) earlier `gradients` calls added that
    `loss` does not need, and whatever was built on them (a partitioner derives its own)."""
    needed = set(graph.ancestors([loss]))
    gone = {n for n in graph.nodes if n.name.startswith("grad/") and n not in needed}
    for n in graph.toposort():
        if n not in needed and any(x in gone for x in n.inputs):
            gone.add(n)
    graph.remove(gone)
    graph.gradients = {p: g for p, g in graph.gradients.items() if g in graph}


def _built_before(loss: Node, wrt: Sequence[Node]) -> dict[str, Node] | None:
    """The gradients of `loss` for every node of `wrt` if an earlier `gradients` call made
    them all (the graph records each; they descend from the loss's seed), else None."""
    graph = loss.graph
    recorded = [graph.gradients.get(w.name) for w in wrt]
    if not wrt or None in recorded:
        return None
    from_loss = {n for n in graph.nodes if is_seed(n) and n.attrs.get("loss") == loss.name}
    for n in graph.toposort():
        if any(x in from_loss for x in n.inputs):
            from_loss.add(n)
    grads = [graph[name] for name in recorded]
    if not all(g in from_loss for g in grads):
        return None
    return {w.name: g for w, g in zip(wrt, grads, strict=True)}


def _free_name(base: str) -> str:
    """`base`, or `base_1`, `base_2`, ... where the current graph (and scope) already has it."""
    graph = current_graph()
    name, i = base, 0
    while (f"{graph.scope}/{name}" if graph.scope else name) in graph:
        i += 1
        name = f"{base}_{i}"
    return name


def _sum(terms: list[Node]) -> Node:
    """Sum a node's gradient contributions (it had several users)."""
    total = terms[0]
    for t in terms[1:]:
        total = apply("add", total, t)
    return total


class _scoped:
    """Name gradient nodes `grad/<forward name>/...` and give them the forward node's device
    and source line (a failing backward kernel then cites the user's line it came from)."""

    def __init__(self, graph: object, node: Node) -> None:
        self.graph, self.node = graph, node

    def __enter__(self) -> None:
        g = self.graph
        g._scopes.append(f"grad/{self.node.name}")
        g._devices.append(self.node.device)
        g._sources.append(self.node.source)

    def __exit__(self, *exc: object) -> None:
        self.graph._scopes.pop()
        self.graph._devices.pop()
        self.graph._sources.pop()


def is_seed(node: Node) -> bool:
    """Whether `node` is the 1 that backpropagation starts from (`gradients` without `dy`):
    every gradient is linear in it, so scaling it scales them all (a pipeline weighs unequal
    micro-batches so)."""
    return node.op == "constant" and bool(node.attrs.get("seed", False))
