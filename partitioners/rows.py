"""Which rows of each windowed layer every worker computes (the spatial strategy's plan).

`balanced_rows` splits each locally connected / conv / pooling layer's output rows into one
block per worker, so that the workers' totals over all the layers are balanced by the cost
model; `halo_first` then cuts a worker's block at the rows its neighbours read, so those rows
are a block of their own that the worker computes and sends first. Rows that no later op reads
(a strided or pooling layer's floor drops them) never make a block of their own: their weights
would be parameters the loss does not depend on (`read_rows`).
"""

from __future__ import annotations

from math import prod

import numpy as np

from graphflow.costmodel import CostModel
from graphflow.ir import Graph, Node, users_of

UNARY = {"relu", "sigmoid", "tanh", "exp", "log", "neg", "sqrt", "square"}
WINDOWED = {"local2d": 0, "conv2d": 2, "max_pool2d": 2, "avg_pool2d": 2}  # op -> its row axis
BINARY = {"add", "sub", "mul", "div", "maximum"}
REPLICATED = {"placeholder", "constant"}


def row_bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """`parts` balanced [lo, hi) blocks of `size` rows (sizes differ by at most one)."""
    edges = np.linspace(0, size, parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


# Per output element, the ops around a windowed layer (layout transposes, bias, activation and
# their gradients) make about this many passes over memory; it weighs rows of cheap, wide
# layers against rows of expensive, narrow ones. (Fitted here: lc-large's took 3.3 ns an
# element, 3 passes at the cost model's memory bandwidth.)
ELEMENTWISE_PASSES = 3
# A layer's gradients in forward passes (timed here on lc-large's local2d kernels: the weight
# gradient 1.41-1.43x the forward, the input gradient 1.16x).
WEIGHT_GRAD_PASSES, INPUT_GRAD_PASSES = 1.4, 1.2
SLACK = 2  # rows a block may be off an even split of its layer (beyond the rounding)


def row_seconds(n: Node, cost: CostModel, batch: int = 64) -> float:
    """Estimated seconds of one output row of windowed layer `n` per training step: forward,
    its gradients (input gradient only when the input is computed) and the ops around it."""
    rows = int(n.shape[WINDOWED[n.op]])
    passes = 1.0 + WEIGHT_GRAD_PASSES * (n.op in ("local2d", "conv2d"))
    passes += INPUT_GRAD_PASSES * (n.inputs[0].op not in REPLICATED
                                   and not replicable(n.inputs[0]))
    elements = prod(d or batch for d in n.shape) / rows
    per_element = ELEMENTWISE_PASSES * np.dtype(n.dtype).itemsize / cost.bandwidth_Bps
    return passes * cost.node_seconds(n, batch) / rows + elements * per_element


def balanced_rows(graph: Graph, parts: int,
                  cost: CostModel | None = None) -> dict[Node, list[tuple[int, int]]]:
    """Row blocks for every windowed layer, balancing each worker's work over all of them.
    Each layer starts as even as whole rows allow, its left-over rows going to the workers
    with the least work so far (the most expensive layers first); then `_even_out` moves single
    rows from the busiest worker to the least busy. A worker's rows that a neighbour reads go
    first (`halo_first`), so one layer's blocks need not end at the same time."""
    cost = cost or CostModel.default()
    users = users_of(graph.nodes)
    layers = [n for n in graph.nodes if n.op in WINDOWED and int(n.shape[WINDOWED[n.op]]) > 1]
    per_row = {n: row_seconds(n, cost) for n in layers}
    read = {n: read_rows(n, users) for n in layers}
    load = np.zeros(parts)
    sizes: dict[Node, np.ndarray] = {}
    for n in sorted(layers, key=lambda n: -per_row[n] * int(n.shape[WINDOWED[n.op]])):
        rows = int(n.shape[WINDOWED[n.op]])
        # a layer with fewer (read) rows than workers uses the first workers, a row each
        k = min(int(read[n].sum()), parts)
        sizes[n] = np.full(k, rows // k)
        sizes[n][np.argsort(load[:k], kind="stable")[:rows % k]] += 1
        sizes[n] = np.diff(_each_reads([0, *np.cumsum(sizes[n]).tolist()], read[n]))
        load[:k] += sizes[n] * per_row[n]
    _even_out(sizes, per_row, load, read)
    out = {}
    for n in layers:
        edges = np.concatenate([[0], np.cumsum(sizes[n])])
        out[n] = [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return out


def _each_reads(edges: list[int], read: np.ndarray) -> list[int]:
    """`edges` of blocks moved as little as makes each block hold a row something reads (a
    block of rows nothing reads would be weights the loss does not depend on); rows nothing
    reads join a neighbouring block. Needs no more blocks than read rows."""
    at = np.flatnonzero(read)
    k = len(edges) - 1
    before = [0, *(int(np.searchsorted(at, e)) for e in edges[1:-1]), len(at)]  # read rows
    for i in range(1, k):
        before[i] = max(before[i], before[i - 1] + 1)
    for i in range(k - 1, 0, -1):
        before[i] = min(before[i], before[i + 1] - 1)
    return [e if i in (0, k) or np.searchsorted(at, e) == before[i] else int(at[before[i]])
            for i, e in enumerate(edges)]


def _even_out(sizes: dict[Node, np.ndarray], per_row: dict[Node, float], load: np.ndarray,
              read: dict[Node, np.ndarray]) -> None:
    """Move one row at a time from the busiest worker to the least busy one, of the layer
    that lowers the busier of the two the most, while that lowers it; each block keeps
    within SLACK rows of even (lc-large on 2 workers: lc1's 29 rows go 12 / 17, not 14 / 15,
    as worker 0 also has lc2's odd row) and a row something reads."""
    for _ in range(sum(int(s.sum()) for s in sizes.values())):
        busy, idle = int(np.argmax(load)), int(np.argmin(load))
        best: tuple[float, Node] | None = None
        for n, s in sizes.items():
            rows, k = int(s.sum()), len(s)
            if max(busy, idle) >= k or s[busy] - 1 < max(1, rows // k - SLACK) \
                    or s[idle] + 1 > -(-rows // k) + SLACK:
                continue
            moved = s.copy()
            moved[busy] -= 1
            moved[idle] += 1
            if not _reads_each(moved, read[n]):
                continue
            peak = max(load[busy] - per_row[n], load[idle] + per_row[n])
            if peak < load[busy] and (best is None or peak < best[0]):
                best = (peak, n)
        if best is None:
            return
        n = best[1]
        sizes[n][busy] -= 1
        sizes[n][idle] += 1
        load[busy] -= per_row[n]
        load[idle] += per_row[n]


def _reads_each(sizes: np.ndarray, read: np.ndarray) -> bool:
    """Whether each block of these sizes holds a row something reads."""
    seen = np.concatenate([[0], np.cumsum(read)])[np.concatenate([[0], np.cumsum(sizes)])]
    return bool((np.diff(seen) > 0).all())


def window(n: Node) -> tuple[int, int, int]:
    """(kernel rows, row stride, row padding) of windowed op `n`."""
    kh = n.inputs[1].shape[2] if n.op == "conv2d" else n.attrs["kernel"][0]
    return int(kh), int(n.attrs["stride"][0]), int(n.attrs["padding"][0])


def halo_first(graph: Graph, rows: dict[Node, list[tuple[int, int]]]
               ) -> tuple[dict[Node, list[tuple[int, int]]], dict[Node, list[int]]]:
    """Cut each worker's block of a windowed layer at the rows its neighbours read as halo
    (through the row-local ops up to the next windowed layer), so that those rows are their
    own block: the worker computes and sends them first (the dataflow runs what leads to a
    send first) and its neighbours do not wait for its whole block. Returns the new bounds
    and, per block, its worker."""
    users = users_of(graph.nodes)
    out_rows, owners = {}, {}
    for n, bounds in rows.items():
        read = read_rows(n, users)
        needs = []  # (worker, [lo, hi)) rows of n each next layer's block reads
        for nxt in _next_windowed(n, users):
            if nxt in rows and int(nxt.inputs[0].shape[WINDOWED[nxt.op]]) == bounds[-1][1]:
                kh, sh, ph = window(nxt)
                needs += [(k, (lo * sh - ph, (hi - 1) * sh - ph + kh))
                          for k, (lo, hi) in enumerate(rows[nxt])]
        out_rows[n], owners[n] = [], []
        for j, (lo, hi) in enumerate(bounds):
            cuts = {lo, hi} | {min(max(e, lo), hi) for k, span in needs if k != j for e in span}
            edges = _keep_read(sorted(cuts), read)
            out_rows[n] += list(zip(edges[:-1], edges[1:]))
            owners[n] += [j] * (len(edges) - 1)
    return out_rows, owners


def _keep_read(edges: list[int], read: np.ndarray) -> list[int]:
    """The cuts of one block that leave every piece with a row something reads: rows past the
    next layer's last window stay with the piece before them, other unread rows with the next."""
    kept = [edges[0]]
    for e in edges[1:-1]:
        if read[kept[-1]:e].any():
            kept.append(e)
    if len(kept) > 1 and not read[kept[-1]:edges[-1]].any():
        kept.pop()
    return [*kept, edges[-1]]


def read_rows(n: Node, users: dict[Node, list[Node]]) -> np.ndarray:
    """Which output rows of windowed layer `n` anything reads (a boolean mask). Only windowed
    layers reading them through row-local ops can leave rows unread: rows after their last
    window (their output size is floored) and, with a stride above the kernel, rows between
    windows. Any other reader (flatten, a gather) reads every row."""
    size = int(n.shape[WINDOWED[n.op]])
    read = np.zeros(size, dtype=bool)
    stack = [(u, n, WINDOWED[n.op]) for u in set(users[n])]  # (reader, what it reads, row axis)
    seen = set()
    while stack:
        u, x, axis = stack.pop()
        if (u, x, axis) in seen:
            continue
        seen.add((u, x, axis))
        if u.op in WINDOWED and axis == WINDOWED[u.op] and x not in u.inputs[1:]:
            kh, sh, ph = window(u)
            for o in range(int(u.shape[axis])):
                read[max(o * sh - ph, 0):max(o * sh - ph + kh, 0)] = True
        elif u.op in UNARY | BINARY or (u.op == "lrn" and axis != 1):
            stack += [(v, u, axis + u.ndim - x.ndim) for v in set(users[u])]
        elif u.op == "transpose":
            stack += [(v, u, list(u.attrs["axes"]).index(axis)) for v in set(users[u])]
        else:
            return np.ones(size, dtype=bool)
    return read if read.any() else np.ones(size, dtype=bool)


def _next_windowed(n: Node, users: dict[Node, list[Node]]) -> list[Node]:
    """The windowed layers that read `n`'s rows through row-local ops only."""
    found, stack, seen = [], list(users[n]), set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op in WINDOWED:
            found.append(u)
        elif u.op in UNARY | BINARY | {"transpose", "lrn"}:
            stack.extend(users[u])
    return found


def replicable(n: Node) -> bool:
    """True for nodes computed only from placeholders and constants by cheap row-local ops."""
    if n.op in REPLICATED:
        return True
    return n.op in UNARY | {"transpose"} and all(replicable(x) for x in n.inputs)
