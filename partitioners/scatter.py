"""Sum where the sum is read: a sum of partial results from several workers that is only read
in slices, each slice on its own worker, becomes per slice the sum of the partials' slices.

A dense layer split by output units reads its input whole on every worker, so the gradient of
that input is the sum of every worker's partial product (dz_j @ W_j.T), and each worker reads
only its own units' columns of it. Autodiff puts the sum where the input was gathered (worker
0): worker 1 sends its whole partial there and waits for its columns of the sum to come back,
two hops a layer, one after the other, while worker 0 waits in turn. Summed per slice, each
worker sends the other only the other's columns (half the bytes) and adds its own: one hop
each way, at once (a reduce-scatter). x[a:b] + y[a:b] is (x + y)[a:b] element for element, so
a step gives the same result, bit for bit.

>>> import graphflow as gf
>>> m = gf.models.speech_mlp(batch=None)
>>> plan = gf.partition(m.graph, 2, "spatial", loss=m.loss)
>>> [(t.shape, t.src, t.dst) for t in plan.transfers if t.tensor.startswith("grad/sigmoid_3")]
[((None, 1280), 1, 0), ((None, 1280), 0, 1)]
"""

from __future__ import annotations

from collections.abc import Mapping

from graphflow.ir import Graph, Node, users_of

# Partials a sum may have: k workers' slices of k partials are k * k transfers and nodes, where
# the sum on one worker is 2k; at 64 workers that grew a plan to tens of thousands of nodes.
MAX_PARTIALS = 4


def scatter_sums(graph: Graph, placement: Mapping[str, int],
                 keep: frozenset[str] = frozenset()) -> dict[str, int]:
    """Rewrite `graph` in place as above; returns the placement with the new nodes. A sum of
    more than two partials is a tree of adds: each slice gets the same tree over the
    partials' slices (the same additions in the same order). Nodes named in `keep`
    (gradients the plan hands out, fetched values) stay as they are."""
    where = dict(placement)
    users = users_of(graph.toposort())
    sums = [(n, tree) for n in graph.nodes if (tree := _scatterable(n, users, where, keep))]
    for total, inner in sums:
        for s in users[total]:
            summed = _sliced(graph, total, set(inner), s, where[users[s][0].name], where, "of")
            for u in users[s]:
                u.inputs = tuple(summed if y is s else y for y in u.inputs)
            graph.remove([s])
            del where[s.name]
        graph.remove(inner)
        for n in inner:
            del where[n.name]
    return where


def _sliced(graph: Graph, n: Node, inner: set[Node], s: Node, reader: int,
            where: dict[str, int], path: str) -> Node:
    """Slice `s` of the sum tree under `n`: a partial's slice on the partial's worker, the
    tree's adds over them on `reader`'s."""
    if n not in inner:
        made = graph.insert("slice", f"{s.name}/{path}", [n], s.attrs, s.shape, s.dtype,
                            source=s.source)
        where[made.name] = where[n.name]
        return made
    a, b = (_sliced(graph, x, inner, s, reader, where, f"{path}{k}")
            for k, x in enumerate(n.inputs))
    made = graph.insert("add", f"{s.name}/{path}sum", [a, b], {}, s.shape, s.dtype,
                        source=s.source)
    where[made.name] = reader
    return made


def _tree(total: Node, users: Mapping[Node, list[Node]], keep: frozenset[str]) -> list[Node]:
    """The adds of the sum `total`: itself and the adds only it reads (recursively), users
    before their inputs."""
    inner, todo = [], [total]
    while todo:
        n = todo.pop()
        inner.append(n)
        todo += [x for x in n.inputs if x.op == "add" and x.shape == n.shape
                 and len(users[x]) == 1 and x.name not in keep]
    return inner


def _scatterable(n: Node, users: Mapping[Node, list[Node]], where: Mapping[str, int],
                 keep: frozenset[str]) -> list[Node]:
    """The adds of `n`'s sum tree (`_tree`) if `n` is an add of same-shape values (partials,
    or adds of them) from 2 to MAX_PARTIALS workers, read only by slices, each slice read on
    one worker and the slices on more than one; else none."""
    slices = users.get(n, [])
    if (n.op != "add" or n.name in keep or any(x.shape != n.shape for x in n.inputs)
            or not slices
            or any(s.op != "slice" or s.name in keep or not users[s] for s in slices)):
        return []
    readers = [{where[u.name] for u in users[s]} for s in slices]
    if any(len(r) != 1 for r in readers) or len(set().union(*readers)) < 2:
        return []
    inner = _tree(n, users, keep)
    partials = {where[x.name] for a in inner for x in a.inputs if x not in inner}
    return inner if 2 <= len(partials) <= MAX_PARTIALS else []
