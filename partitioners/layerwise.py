"""Pipeline (layer-wise) placement: contiguous stages of the forward graph, balanced by cost.

The forward nodes in topological order are cut into `parts` contiguous stages that minimise the
largest stage cost, where a forward node's cost includes the backward nodes that belong with it
(`grad/<name>/...`). Only what the input flows through is cut; what only parameters feed (a
weight penalty) goes to the first stage that reads it. Parameters go with their earliest
consumer, so their gradients stay local.

>>> import graphflow as gf
>>> from graphflow.costmodel import CostModel
>>> from graphflow.partitioners import layerwise
>>> m = gf.models.speech_mlp(batch=64)
>>> _ = gf.gradients(m.loss, m.graph.parameters())
>>> _, placement = layerwise.place(m.graph, 2, CostModel.builtin())
>>> placement["fc1/matmul"], placement["out/matmul"]
(0, 1)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphflow.costmodel import CostModel
from graphflow.ir import Graph, Node
from graphflow.partitioners.manual import anchors, complete, param_gradients, users


def balanced_stages(costs: Sequence[float], parts: int) -> list[int]:
    """Stage index of each item: `min(parts, len(costs))` contiguous, non-empty stages that
    minimise the largest stage sum (linear partition by dynamic programming over prefix sums).

    >>> balanced_stages([1, 1, 1, 3], 2)
    [0, 0, 0, 1]
    """
    n = len(costs)
    k = min(parts, n)
    if k <= 1:
        return [0] * n
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    best = prefix.copy()  # best[j]: the largest stage sum of items[:j] in s stages
    best[0] = np.inf
    cuts = []
    span = prefix[:, None] - prefix[None, :]  # span[j, i]: sum of items[i:j]
    valid = np.tril(np.ones((n + 1, n + 1), dtype=bool), k=-1)  # i < j
    for _ in range(1, k):
        worst = np.where(valid, np.maximum(best[None, :], span), np.inf)
        choice = np.argmin(worst, axis=1)
        best = worst[np.arange(n + 1), choice]
        cuts.append(choice)
    stages, j = [0] * n, n
    for s in range(k - 1, 0, -1):
        i = int(cuts[s - 1][j])
        stages[i:j] = [s] * (j - i)
        j = i
    return stages


def unit_costs(graph: Graph, cost: CostModel) -> tuple[list[Node], list[float]]:
    """The forward nodes in topological order and each one's cost with its backward nodes."""
    anchor = anchors(graph)
    units = [n for n in graph.toposort() if anchor.get(n) is n]
    total = dict.fromkeys(units, 0.0)
    for n, a in anchor.items():
        total[a] += cost.node_seconds(n)
    return units, [total[u] for u in units]


def _fed(graph: Graph) -> set[Node]:
    """The nodes some placeholder reaches."""
    out: set[Node] = set()
    for n in graph.toposort():
        if n.op == "placeholder" or any(x in out for x in n.inputs):
            out.add(n)
    return out


def place(graph: Graph, parts: int,
          cost: CostModel | None = None) -> tuple[Graph, dict[str, int]]:
    """Contiguous cost-balanced stages; backward nodes with their forward node, parameters with
    their first consumer. With fewer forward nodes than `parts`, some workers stay empty.
    `cost` defaults to `CostModel.default()`."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    units, costs = unit_costs(graph, cost or CostModel.default())
    fed = _fed(graph)  # the stages cut what the input flows through
    flowing = [(u, c) for u, c in zip(units, costs, strict=True) if u in fed]
    stage = dict(zip([u for u, _ in flowing], balanced_stages([c for _, c in flowing], parts)))
    anchor = anchors(graph)
    use = users(graph)
    for u in reversed(units):  # what only parameters feed (a weight penalty): where it is read
        if u not in stage:  # (a stage before would send forward values back up the pipeline)
            read = [stage[anchor[x]] for x in use[u] if anchor.get(x, u) is not u
                    and anchor[x] in stage]
            stage[u] = min(read, default=0)
    out = {n.name: stage[a] for n, a in anchor.items()}
    for p in graph.parameters():  # with its first stage: its value flows down the pipeline
        out[p.name] = min((out[x.name] for x in use[p]), default=0)
    return graph, complete(graph, out, param_gradients(graph))
