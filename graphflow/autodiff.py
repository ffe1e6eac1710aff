"""Reverse-mode autodiff that adds the backward nodes to the same graph (TF1 style).

The backward pass is ordinary graph nodes built by each op's gradient rule, so it is printed,
partitioned and executed like the forward pass. Gradient nodes take the device of the forward
node they come from, so a placement of the forward pass carries over to the backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphflow.errors import GraphError, located
from graphflow.ir import SOURCE_OPS, Node
from graphflow.ops.registry import REGISTRY, apply


def gradients(loss: Node, wrt: Sequence[Node], dy: Node | None = None) -> dict[str, Node]:
    """d(loss)/d(w) for each node in `wrt`, keyed by the node's name.

    `loss` must be a scalar unless `dy`, the gradient flowing into `loss`, is given.

    >>> import graphflow as gf
    >>> with gf.Graph() as g:
    ...     w = gf.parameter("w", (3,))
    ...     loss = gf.reduce_sum(w * w)
    ...     grads = gf.gradients(loss, [w])
    >>> grads["w"].shape
    (3,)
    """
    graph = loss.graph
    if graph is None or (dy is None and loss.shape != ()):
        raise GraphError(located(loss, f"gradients need a scalar loss, got shape {loss.shape}"))
    wrt = list(wrt)
    for w in wrt:
        if w.graph is not graph:
            raise GraphError(located(w, "is not in the loss's graph"))

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

    with graph:
        # a constant, not ones_like(loss): the backward pass need not wait for the loss value
        seed = dy if dy is not None else apply("constant", name=f"grad/{loss.name}", seed=True,
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
    graph.gradients.update({w.name: done[w].name for w in wrt})
    return {w.name: done[w] for w in wrt}


def _sum(terms: list[Node]) -> Node:
    """Sum a node's gradient contributions (it had several users)."""
    total = terms[0]
    for t in terms[1:]:
        total = apply("add", total, t)
    return total


class _scoped:
    """Name gradient nodes `grad/<forward name>/...` and give them the forward node's device."""

    def __init__(self, graph: object, node: Node) -> None:
        self.graph, self.node = graph, node

    def __enter__(self) -> None:
        g = self.graph
        g._scopes.append(f"grad/{self.node.name}")
        g._devices.append(self.node.device)

    def __exit__(self, *exc: object) -> None:
        self.graph._scopes.pop()
        self.graph._devices.pop()


def is_seed(node: Node) -> bool:
    """Whether `node` is the 1 that backpropagation starts from (`gradients` without `dy`):
    every gradient is linear in it, so scaling it scales them all (a pipeline weighs unequal
    micro-batches so)."""
    return node.op == "constant" and bool(node.attrs.get("seed", False))
