"""Placement strategies and split() (installed as graphflow.partitioners).

`partition(graph, parts, strategy, loss=...)` is the one entry point: it adds the gradients of
`loss`, places every node on a worker with the named strategy and splits the graph into
per-worker subgraphs with Send/Recv pairs (a Plan). Pure: nothing runs.
"""

from __future__ import annotations

from collections.abc import Callable

from graphflow.autodiff import drop_gradients, gradients
from graphflow.costmodel import CostModel
from graphflow.ir import Graph, Node
from graphflow.partitioners import layerwise, manual, mincut, spatial
from graphflow.partitioners.plan import Plan, Transfer, WorkerPlan
from graphflow.partitioners.recompute import recompute_relays
from graphflow.partitioners.split import split
from graphflow.serialize import graph_from_dict, graph_to_dict

Strategy = Callable[[Graph, int, object], tuple[Graph, dict[str, int]]]

# Strategies that rewrite the forward graph (their gradients are derived after the rewrite).
REWRITING: dict[str, Strategy] = {"spatial": spatial.place}
# Strategies that place the nodes of a graph that already holds its backward pass.
PLACING: dict[str, Strategy] = {"manual": manual.place, "layerwise": layerwise.place,
                                "mincut": mincut.place}
STRATEGIES = sorted([*REWRITING, *PLACING])
# Strategies whose plans reduce per-worker parts on one worker and send the result back, where
# recomputing the reduction saves round trips (partitioners/recompute.py). A pipeline's stages
# stay as placed.
RECOMPUTING = {"spatial"}


def partition(graph: Graph, parts: int, strategy: str = "spatial", loss: Node | None = None,
              cost: object = None) -> Plan:
    """Split `graph` (forward only) for `parts` workers; with `loss`, the plan trains it.

    >>> import graphflow as gf
    >>> model = gf.models.digits_lc()
    >>> plan = gf.partition(model.graph, 2, "spatial", loss=model.loss)
    >>> plan.parts, sorted(plan.grads)[:2]
    (2, ['conv1/W', 'conv1/b'])
    """
    if strategy not in REWRITING and strategy not in PLACING:
        raise ValueError(f"unknown strategy '{strategy}'; known: {', '.join(STRATEGIES)}")
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    g = graph_from_dict(graph_to_dict(graph))  # partitioning never changes the user's graph
    if loss is not None:  # its gradients are derived from the partitioned forward graph
        drop_gradients(g, g[loss.name])
    if strategy in REWRITING:
        g, placement = REWRITING[strategy](g, parts, cost)
        grads = _add_gradients(g, loss)
        placement = {n.name: spatial.worker_index(n.device) for n in g.nodes}
    else:
        grads = _add_gradients(g, loss)
        g, placement = PLACING[strategy](g, parts, cost)
    for param, grad in grads.items():  # the update runs where the parameter lives
        placement[grad] = placement[param]
    if strategy in RECOMPUTING:
        placement = recompute_relays(g, placement, cost if isinstance(cost, CostModel) else None)
    plan = split(g, placement, parts, strategy)
    plan.loss = loss.name if loss is not None else None
    plan.grads = grads
    return plan


def _add_gradients(g: Graph, loss: Node | None) -> dict[str, str]:
    """Gradients of every parameter, keyed by parameter name -> gradient node name."""
    if loss is None:
        return {}
    params = g.parameters()
    return {name: node.name for name, node in gradients(g[loss.name], params).items()}


__all__ = ["PLACING", "REWRITING", "STRATEGIES", "Plan", "Transfer", "WorkerPlan", "partition",
           "split"]
