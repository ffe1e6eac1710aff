"""The deferred W phase's backlog on a pipelined worker: what each weight gradient has yet to
take from the micro-batches whose backward pass is done.

The W nodes fall into groups, one per gradient (a weight's gemm, a bias's sum). A first stage
runs a group early whenever it would otherwise wait for a gradient, one group at a time, and
looks again between groups: a wait is filled without running past it, and the groups it did
not need take the later micro-batches too, joined into one larger gemm (at 21 rows a speech-mlp
weight gemm took 3.5-4.7 ms, at 64 about 7).

>>> import numpy as np
>>> import graphflow as gf
>>> with gf.Graph():
...     x, dy = gf.placeholder("x", (None, 3)), gf.placeholder("dy", (None, 2))
...     w = gf.matmul(x, dy, transpose_a=True)  # a weight's gradient
>>> backlog = Backlog([[w]], [x, dy])
>>> for rows in (1, 2):
...     backlog.add([np.ones((rows, 3), np.float32), np.ones((rows, 2), np.float32)])
>>> [v.shape for v in backlog.take(0).values()]  # both micro-batches, joined
[(3, 3), (3, 2)]
>>> backlog.waiting()
[]
"""

from __future__ import annotations

import numpy as np

from graphflow.ir import Node
from graphflow.ops import aligned
from graphflow.runtime.pipeline import batch_axis


class Backlog:
    """Per group of W nodes, the micro-batches it has not taken; a micro-batch's values are
    dropped once every group took them."""

    def __init__(self, groups: list[list[Node]], inputs: list[Node]) -> None:
        self.inputs = inputs
        # which of `inputs` each group reads (built anew each step: linear in the edges)
        index = {x: i for i, x in enumerate(inputs)}
        self.reads = [sorted({index[x] for n in g for x in n.inputs if x in index})
                      for g in groups]
        self.entries: list[list[np.ndarray] | None] = []
        self.next = [0] * len(groups)  # per group, its first micro-batch not taken

    def add(self, values: list[np.ndarray]) -> None:
        """A micro-batch's backward is done: its values of `inputs`, in that order."""
        self.entries.append(values)

    def waiting(self) -> list[int]:
        """The groups with micro-batches to take, in the order given."""
        return [g for g, k in enumerate(self.next) if k < len(self.entries)]

    def take(self, group: int) -> dict[Node, np.ndarray]:
        """The inputs `group` reads, over the micro-batches it has not taken, joined along
        their batch axis; those micro-batches count as taken by it."""
        start, self.next[group] = self.next[group], len(self.entries)
        out = {}
        for i in self.reads[group]:
            parts = [e[i] for e in self.entries[start:] if e is not None]
            axis = batch_axis(self.inputs[i])
            out[self.inputs[i]] = (parts[0] if axis is None or len(parts) == 1
                                   else aligned.concatenate(parts, axis))
        done = min(self.next)
        for k in range(done):  # every group took these: free them
            self.entries[k] = None
        return out


def weight_groups(weights: list[Node]) -> list[list[Node]]:
    """`weights` (in run order) cut into the groups that share no node: each ends in its own
    gradients. A group keeps its nodes' order; groups come in the order of their first node."""
    import networkx as nx  # (only pipelined workers need it: the others start without)

    members = set(weights)
    linked = nx.Graph()
    linked.add_nodes_from(weights)
    linked.add_edges_from((x, n) for n in weights for x in n.inputs if x in members)
    position = {n: i for i, n in enumerate(weights)}
    groups = [sorted(g, key=position.__getitem__) for g in nx.connected_components(linked)]
    return sorted(groups, key=lambda g: position[g[0]])


def early_updates(groups: list[list[Node]], grads: dict[str, str],
                  order: list[Node]) -> list[list[str]]:
    """Per W group, the parameters its last run may update at once: their gradients are its
    nodes, no later group reads them and this worker sends them nowhere (a zero-copy send of
    a parameter may still be reading it)."""
    sent = {n.inputs[0].name for n in order if n.op == "send"}
    param_of = {g: p for p, g in grads.items()}
    out = []
    for i, group in enumerate(groups):
        read_later = {x.name for g in groups[i + 1:] for n in g for x in n.inputs}
        out.append([param_of[n.name] for n in group if n.name in param_of
                    and param_of[n.name] not in read_later | sent])
    return out
