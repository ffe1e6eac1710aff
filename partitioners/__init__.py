"""Placement strategies and split() (installed as graphflow.partitioners).

`partition(graph, parts, strategy, loss=...)` is the one entry point: it adds the gradients of
`loss`, places every node on a worker with the named strategy and splits the graph into
per-worker subgraphs with Send/Recv pairs (a Plan). Pure: nothing runs.
"""

from __future__ import annotations

from collections.abc import Callable

from graphflow.autodiff import drop_gradients, gradients
from graphflow.costmodel import CostModel
from graphflow.errors import GraphError
from graphflow.ir import Graph, Node, twin_of
from graphflow.models import Model
from graphflow.partitioners import layerwise, manual, mincut, spatial
from graphflow.partitioners.blocks import Join
from graphflow.partitioners.plan import Plan, Transfer, WorkerPlan
from graphflow.partitioners.planfile import PlanError
from graphflow.partitioners.recompute import recompute_relays
from graphflow.partitioners.split import split
from graphflow.serialize import graph_from_dict, graph_to_dict

Strategy = Callable[[Graph, int, object], tuple[Graph, dict[str, int]]]
# ... and how to join the original nodes a rewrite holds only in pieces (blocks.Join)
Rewriting = Callable[[Graph, int, object], tuple[Graph, dict[str, int], dict[str, Join]]]

# Strategies that rewrite the forward graph (their gradients are derived after the rewrite).
REWRITING: dict[str, Rewriting] = {"spatial": spatial.rewrite}
# Strategies that place the nodes of a graph that already holds its backward pass.
PLACING: dict[str, Strategy] = {"manual": manual.place, "layerwise": layerwise.place,
                                "mincut": mincut.place}
STRATEGIES = sorted([*REWRITING, *PLACING])
# Strategies whose plans reduce per-worker parts on one worker and send the result back, where
# recomputing the reduction saves round trips (partitioners/recompute.py). A pipeline's stages
# stay as placed.
RECOMPUTING = {"spatial"}


def partition(graph: Graph | Model, parts: int, strategy: str = "spatial",
              loss: Node | str | None = None, cost: CostModel | None = None) -> Plan:
    """Split `graph` (forward only) for `parts` workers; with `loss` (a node of `graph` or
    its name), the plan trains it. A `gf.models.Model` stands for its graph and, unless
    `loss` is given, its loss. `cost` (a CostModel) prices the nodes the strategy balances
    (None: each strategy's default).

    >>> import graphflow as gf
    >>> model = gf.models.digits_lc()
    >>> plan = gf.partition(model.graph, 2, "spatial", loss=model.loss)
    >>> plan.parts, sorted(plan.grads)[:2]
    (2, ['conv1/W', 'conv1/b'])
    """
    graph, loss = check_arguments(graph, parts, strategy, loss, cost)
    g = graph_from_dict(graph_to_dict(graph))  # partitioning never changes the user's graph
    if loss is not None:  # its gradients are derived from the partitioned forward graph
        drop_gradients(g, g[loss.name])
    joins: dict[str, Join] = {}
    if strategy in REWRITING:
        g, placement, joins = REWRITING[strategy](g, parts, cost)
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
    plan.joins = joins
    return plan


def check_arguments(graph: object, parts: object, strategy: object, loss: object,
                    cost: object) -> tuple[Graph, Node | None]:
    """partition()'s arguments, checked before any work: the graph (a Model's) and the loss
    node (by name, or a Node of that graph); errors name the argument and the value."""
    if isinstance(graph, Model):
        graph, loss = graph.graph, (graph.loss if loss is None else loss)
    if not isinstance(graph, Graph):
        raise TypeError(f"partition: graph must be a gf.Graph (or a gf.models.Model), got "
                        f"{type(graph).__name__} {graph!r:.60}")
    if isinstance(parts, bool) or not isinstance(parts, int):
        raise TypeError(f"partition: parts must be an int (how many workers), got "
                        f"{type(parts).__name__} {parts!r}")
    if parts < 1:
        raise ValueError(f"partition: parts must be at least 1, got {parts}")
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(f"partition: unknown strategy {strategy!r}; known: "
                         f"{', '.join(STRATEGIES)}")
    if cost is not None and not isinstance(cost, CostModel):
        raise TypeError(f"partition: cost must be a graphflow.costmodel.CostModel or None, "
                        f"got {type(cost).__name__} {cost!r:.60}")
    return graph, _loss_node(graph, loss)


def _loss_node(graph: Graph, loss: object) -> Node | None:
    """`loss` as a node of `graph`: given by name, or a Node of it, or of a copy of it (the
    same model built again: a node of the name, op and shape); a node of another graph that
    merely shares a name would silently train the wrong thing."""
    if loss is None:
        return None
    if isinstance(loss, str):
        if loss not in graph:
            raise GraphError(f"partition: loss '{loss}' is not a node of the graph")
        return graph[loss]
    if not isinstance(loss, Node):
        raise TypeError(f"partition: loss must be a Node of the graph or its name, got "
                        f"{type(loss).__name__} {loss!r:.60}")
    if (mine := twin_of(graph, loss)) is None:
        raise GraphError(f"partition: loss {loss.where()} is a node of another graph")
    return mine


def _add_gradients(g: Graph, loss: Node | None) -> dict[str, str]:
    """Gradients of every parameter, keyed by parameter name -> gradient node name."""
    if loss is None:
        return {}
    params = g.parameters()
    return {name: node.name for name, node in gradients(g[loss.name], params).items()}


__all__ = ["PLACING", "REWRITING", "STRATEGIES", "Plan", "PlanError", "Transfer", "WorkerPlan",
           "partition", "split"]
