"""What a run that only looks (no training) must compute on each worker: the nodes its fetches
depend on, followed across workers from each needed Recv to the peer's Send of the same key.

A forward-only fetch (the logits) then needs neither the labels nor the backward pass, and a
worker none of whose nodes is needed runs nothing. Training steps are never pruned: every
parameter's gradient is needed for its update.

>>> import graphflow as gf
>>> model = gf.models.digits_lc(batch=None)
>>> plan = gf.partition(model.graph, 2, "layerwise", loss=model.loss)
>>> needed = set().union(*needed_nodes(plan, [model.logits.name]))
>>> "y" in needed, any(name.startswith("grad/") for name in needed)
(False, False)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from graphflow.ir import Node

if TYPE_CHECKING:  # (a worker process starts without the partitioners)
    from graphflow.partitioners.plan import Plan


def needed_nodes(plan: Plan, fetches: Iterable[str]) -> list[frozenset[str]]:
    """For each worker, the names of the nodes of its subgraph that `fetches` (node names of
    the plan) depend on, Sends and Recvs included."""
    graphs = [w.graph for w in plan.workers]
    sends = {n.attrs["key"]: (i, n) for i, g in enumerate(graphs) for n in g.nodes
             if n.op == "send"}
    needed: list[set[str]] = [set() for _ in graphs]
    stack: list[tuple[int, Node]] = [(plan.worker_of(f), graphs[plan.worker_of(f)][f])
                                     for f in fetches]
    while stack:
        i, n = stack.pop()
        if n.name in needed[i]:
            continue
        needed[i].add(n.name)
        stack.extend((i, x) for x in n.inputs)
        if n.op == "recv":  # its value comes from the peer's Send of the same key
            stack.append(sends[n.attrs["key"]])
    return [frozenset(s) for s in needed]


def worker_runs(needed: list[frozenset[str]] | None, plan: Plan) -> list[list[str] | None]:
    """What each worker is told to run of its subgraph (`needed_nodes`, or None for a
    training step): None for the whole of it, on every worker or none (a pruned worker runs
    its micro-batches one after another, so a peer that ran the pipeline's schedule would
    wait for it in another order)."""
    if needed is None or all(len(n) == len(w.graph.nodes)
                             for n, w in zip(needed, plan.workers, strict=True)):
        return [None] * plan.parts
    return [sorted(n) for n in needed]
