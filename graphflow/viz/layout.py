"""A layered layout for a DAG (Sugiyama-style, simplified): rank by topological generation,
order each rank by the mean position of its neighbours, centre every rank.

Cycles (layers collapsed from a DAG can form them) are condensed before ranking, so the layout
never fails; the nodes of one cycle share a rank.

>>> layered(["a", "b", "c", "y"], [("a", "b"), ("b", "c"), ("y", "c")])
{'a': (0, 0), 'b': (1, 0), 'y': (1, 1), 'c': (2, 0)}
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

SWEEPS = 4  # down and up passes of barycentre ordering; more rarely changes anything


def ranks(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Each node's row: its topological generation; a source with users sits just above its
    first user (so a label placeholder is drawn beside the loss, not beside the input)."""
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(e for e in edges if e[0] != e[1])
    dag = nx.condensation(g)
    members = dag.graph["mapping"]  # node -> its strongly connected component
    rank_of_scc = {}
    for level, generation in enumerate(nx.topological_generations(dag)):
        for scc in generation:
            rank_of_scc[scc] = level
    rank = {n: rank_of_scc[members[n]] for n in nodes}
    for n in nodes:
        users = [rank[u] for u in g.successors(n)]
        if g.in_degree(n) == 0 and users:
            rank[n] = max(min(users) - 1, 0)
    return rank


def layered(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """node -> (rank, position within its rank), positions 0.. from the left."""
    rank = ranks(nodes, edges)
    rows: dict[int, list[str]] = {}
    for n in nodes:  # the given order breaks ties
        rows.setdefault(rank[n], []).append(n)
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if rank[a] != rank[b]:
            top, bottom = (a, b) if rank[a] < rank[b] else (b, a)
            preds[bottom].append(top)
            succs[top].append(bottom)
    levels = sorted(rows)
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        neighbours = preds if down else succs
        for level in (levels[1:] if down else levels[-2::-1]):
            pos = {n: i - (len(r) - 1) / 2 for r in rows.values() for i, n in enumerate(r)}
            row = rows[level]
            keys = {n: _mean([pos[m] for m in neighbours[n]], pos[n]) for n in row}
            rows[level] = sorted(row, key=lambda n: (keys[n], pos[n]))
    out = {n: (level, i) for level in levels for i, n in enumerate(rows[level])}
    return {n: out[n] for n in sorted(out, key=lambda n: out[n])}


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default
