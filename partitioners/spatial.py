"""DistBelief's spatial partitioning: each locally connected layer is split into k blocks of
output rows, one per worker, and only the receptive-field halo crosses a boundary.

The strategy rewrites the forward graph and marks every node's worker (`node.device`); the
backward pass is then derived from the rewritten graph, so each gradient node runs where its
forward node runs. Per worker:

- local2d: its rows of the output and only those rows' weights (a block parameter: parameter
  memory per worker falls as 1/k); its input rows are its own block plus the halo rows sliced
  from its neighbours' blocks;
- the ops around it (transposes, elementwise, bias adds) run per block; a bias is split too;
- dense on row-split features (flatten then matmul): each worker multiplies its own features by
  its rows of W and the partial products are summed (only N x units values cross);
- dense on whole inputs: split by output units, the input gathered on every worker (an
  all-gather from worker to worker: collectives.py; every worker receives nearly the whole
  input a layer, which is why fully connected layers scale worse); a softmax cross-entropy
  of logits so split is made from each block's statistics (ops/split_loss.py);
- any other op gathers its inputs on worker 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphflow.costmodel import CostModel
from graphflow.dsl import device
from graphflow.ir import Graph, Node
from graphflow.ops.registry import apply
from graphflow.partitioners.blocks import FlatSplit, Join, Partial, Split, joins
from graphflow.partitioners.collectives import all_gather, gathers
from graphflow.partitioners.rows import (
    BINARY,
    REPLICATED,
    UNARY,
    WINDOWED,
    balanced_rows,
    halo_first,
    replicable,
    row_bounds,
    window,
)

__all__ = ["balanced_rows", "halo_first", "rewrite", "worker_index"]


def rewrite(graph: Graph, parts: int, cost: CostModel | None = None
            ) -> tuple[Graph, dict[str, int], dict[str, Join]]:
    """Rewrite a forward graph for `parts` workers: the new graph, its placement, and how to
    join each original node it holds only in pieces (the logits of a dense layer split by
    units), for a fetch. Gradients must not have been added yet: the caller derives them from
    the rewritten graph."""
    if any(n.name.startswith("grad/") for n in graph.nodes):
        raise ValueError("spatial partitioning rewrites the forward graph: partition it before "
                         "adding gradients (gf.partition(graph, loss=...) does both)")
    out = Graph(graph.dtype, graph.seed)
    rw = _Rewriter(graph, out, parts, *halo_first(graph, balanced_rows(graph, parts, cost)))
    with out:
        for n in graph.toposort():
            rw.visit(n)
    rw.drop_unread()
    return out, {n.name: worker_index(n.device) for n in out.nodes}, joins(rw.val, out)


def worker_index(dev: str | None) -> int:
    return 0 if dev is None else int(dev.split(":")[1])


class _Rewriter:
    def __init__(self, src: Graph, out: Graph, parts: int, rows: dict[Node, list[tuple[int, int]]],
                 owners: dict[Node, list[int]]) -> None:
        self.src, self.out, self.parts = src, out, parts
        self.rows, self.owners = rows, owners
        self.val: dict[Node, Node | Split | Partial | FlatSplit] = {}
        self.gathered: dict[Node, list[Node]] = {}  # all-gathered: whole on each worker
        self.source = "<unknown>"  # the user's line of the node being rewritten
        self.users: dict[Node, int] = {n: 0 for n in src.nodes}
        for n in src.nodes:
            for x in n.inputs:
                self.users[x] += 1

    # -- building blocks ------------------------------------------------------------------------
    def on(self, worker: int, op: str, *inputs: Node, name: str, source: str | None = None,
           **attrs: Any) -> Node:
        with device(f"worker:{worker}"):
            node = apply(op, *inputs, name=name, **attrs)
        # errors name the user's line: apply() would record this file's (partitioners/ is
        # not among the package dirs ir.user_source_line skips)
        node.source = source or self.source
        return node

    def whole(self, n: Node, worker: int = 0) -> Node:
        """The original node `n` as one tensor: gathered on `worker` if it is in blocks, and
        created there if it is a parameter not used yet."""
        v = self.val.get(n)
        if v is None:  # a parameter is placed where it is first used whole
            v = self.val[n] = self.copy(n, [], worker)
        elif isinstance(v, FlatSplit):
            # its input's gather, under the input's name: one name for the concat and the flatten
            v = self.val[n] = self.on(worker, "flatten", self.whole(n.inputs[0], worker),
                                      name=f"{n.name}/gathered")
        elif isinstance(v, Partial):
            total = v.blocks[0]
            for j, b in enumerate(v.blocks[1:], 1):
                total = self.on(worker, "add", total, b, name=f"{n.name}/sum{j}")
            v = self.val[n] = total
        elif isinstance(v, Split):
            v = self.val[n] = self.gather(v, n.name, worker)
        return v

    def on_every_worker(self, n: Node) -> list[Node]:
        """The original node `n` whole on each worker: all-gathered if it is in blocks (see
        collectives.py), else gathered on worker 0 and copied or sent from there."""
        v = self.val.get(n)
        if isinstance(v, Split) and gathers(v.workers, self.parts):
            if n not in self.gathered:
                self.gathered[n] = all_gather(self.on, v.blocks, v.axis, n.name)
            return self.gathered[n]
        x = self.whole(n)
        return [self.replicate(x, j) if replicable(x) else x for j in range(self.parts)]

    def drop_unread(self) -> None:
        """Remove copies of intermediate nodes that nothing reads any more (a whole input
        transpose once every worker slices its own rows before it): they would run each step."""
        while True:
            read = {x for n in self.out.nodes for x in n.inputs}
            dead = [n for n in self.out.nodes if n not in read and n.op not in REPLICATED
                    and n.name in self.src and self.users[self.src[n.name]] > 0]
            if not dead:
                return
            self.out.remove(dead)

    def gather(self, s: Split, name: str, worker: int) -> Node:
        return self.on(worker, "concat", *s.blocks, name=f"{name}/gathered", axis=s.axis)

    def block_param(self, p: Node, view: Sequence[int], axis: int, bounds: list[tuple[int, int]],
                    shapes: list[tuple[int, ...]], workers: Sequence[int]) -> list[Node]:
        """Split parameter `p` (viewed as `view`) along `axis`: block j on workers[j]."""
        blocks = []
        for j, ((lo, hi), shape) in enumerate(zip(bounds, shapes, strict=True)):
            spec = {"of": p.name, "attrs": dict(p.attrs), "view": tuple(view), "axis": axis,
                    "lo": lo, "hi": hi, "shape": tuple(shape)}
            blocks.append(self.on(workers[j], "parameter", name=f"{p.name}/part{j}",
                                  source=p.source, shape=tuple(shape), dtype=p.dtype,
                                  init="block", block=spec))
        return blocks

    def copy(self, n: Node, inputs: list[Node], worker: int) -> Node:
        return self.on(worker, n.op, *inputs, name=n.name, source=n.source, **n.attrs)

    # -- the rules --------------------------------------------------------------------------------
    def visit(self, n: Node) -> None:
        if n.op == "parameter":
            return  # made when first used: whole, or as blocks by the op that splits it
        self.source = n.source
        vals = [self.val.get(x) for x in n.inputs]
        if self._windowed(n):
            self.val[n] = self.windowed(n)
        elif n.op == "matmul" and self.parts > 1 and self._splittable_matmul(n):
            self.val[n] = self.matmul(n)
        elif n.op == "softmax_cross_entropy" and self._split_by_classes(n.inputs[0]):
            self.val[n] = self.split_xent(n)
        elif any(isinstance(v, Split) for v in vals) and self._blockwise(n):
            self.val[n] = self.blockwise(n)
        elif n.op == "flatten" and isinstance(vals[0], Split) and vals[0].axis >= 1:
            self.val[n] = FlatSplit(vals[0], tuple(int(d) for d in n.inputs[0].shape[1:]))
        elif n.op in REPLICATED:
            self.val[n] = self.copy(n, [], 0)
        else:
            worker = next((worker_index(v.device) for v in vals
                           if isinstance(v, Node) and v.op not in REPLICATED), 0)
            self.val[n] = self.copy(n, [self.whole(x, worker) for x in n.inputs], worker)

    def _blockwise(self, n: Node) -> bool:
        if n.op in UNARY or n.op == "transpose":
            return True
        if n.op == "lrn":  # normalises across channels (axis 1) at each position
            return self.val[n.inputs[0]].axis != 1
        if n.op not in BINARY:
            return False
        splits = [v for x in n.inputs if isinstance(v := self.val.get(x), Split)]
        return len(splits) == 1 or (splits[0].bounds == splits[1].bounds
                                    and splits[0].axis == splits[1].axis
                                    and splits[0].workers == splits[1].workers)

    def blockwise(self, n: Node) -> Split:
        """Row-local ops: run once per block, on the block's worker."""
        i, s = next((i, v) for i, x in enumerate(n.inputs)
                    if isinstance(v := self.val.get(x), Split))
        if n.op in ("transpose", "lrn"):
            axis = list(n.attrs["axes"]).index(s.axis) if n.op == "transpose" else s.axis
            blocks = [self.on(s.workers[j], n.op, b, name=f"{n.name}/part{j}", **n.attrs)
                      for j, b in enumerate(s.blocks)]
            return Split(axis, blocks, s.bounds, s.workers)
        axis = s.axis + n.ndim - n.inputs[i].ndim  # broadcasting aligns dims on the right
        per_input = [self.blocks_of(x, n.ndim, axis, s) for x in n.inputs]
        blocks = [self.on(s.workers[j], n.op, *(ins[j] for ins in per_input),
                          name=f"{n.name}/part{j}", **n.attrs) for j in range(len(s.bounds))]
        return Split(axis, blocks, s.bounds, s.workers)

    def blocks_of(self, x: Node, out_ndim: int, axis: int, like: Split) -> list[Node]:
        """Input x of a blockwise op, cut to match the blocks of `like` along `axis`."""
        bounds = like.bounds
        v = self.val.get(x)
        if isinstance(v, Split):
            return v.blocks
        xa = axis - (out_ndim - x.ndim)  # the same axis in x's own (right-aligned) dims
        if xa < 0 or x.shape[xa] == 1:
            whole = self.whole(x)
            return [whole] * len(bounds)  # broadcast along the split axis: every block uses it
        if x.op == "parameter" and self.users[x] == 1 and v is None:
            shapes = [tuple(hi - lo if d == xa else s for d, s in enumerate(x.shape))
                      for lo, hi in bounds]
            return self.block_param(x, x.shape, xa, bounds, shapes, like.workers)
        whole = self.whole(x)
        src = worker_index(whole.device)
        return [self.cut(whole, xa, lo, hi, src, f"{x.name}/rows{j}")
                for j, (lo, hi) in enumerate(bounds)]

    def windowed(self, n: Node) -> Split:
        """Output rows split k ways; each block reads its input rows (its own block plus the
        halo rows sliced from neighbours). local2d takes its rows of W; conv2d shares W."""
        x = n.inputs[0]
        axis = WINDOWED[n.op]
        kh, sh, ph = window(n)
        pw = n.attrs["padding"][1]
        h = int(x.shape[axis])
        bounds, workers = self.rows[n], self.owners[n]
        if n.op == "local2d":
            w = n.inputs[1]
            weights = self.block_param(w, w.shape, 0, bounds,
                                       [(hi - lo, *w.shape[1:]) for lo, hi in bounds], workers)
        spans = [(lo * sh - ph, (hi - 1) * sh - ph + kh) for lo, hi in bounds]  # may pass edges
        shared = self.shared_rows(n, axis, [(max(a, 0), min(b, h)) for a, b in spans], workers)
        blocks = []
        for j, ((top, bottom), wj) in enumerate(zip(spans, workers, strict=True)):
            if wj in shared:
                rows = self.view_rows(shared[wj], axis, max(top, 0), min(bottom, h), wj,
                                      f"{n.name}/in{j}")
            else:
                rows = self.input_rows(x, axis, max(top, 0), min(bottom, h), wj, n.name, j)
            if top < 0 or bottom > h:  # zero padding rows, only at the outer edges
                pads = tuple((max(-top, 0), max(bottom - h, 0)) if d == axis else (0, 0)
                             for d in range(x.ndim))
                rows = self.on(wj, "pad", rows, name=f"{n.name}/pad{j}", pads=pads)
            ins = [rows]
            if n.op == "local2d":
                ins.append(weights[j])
            elif n.op == "conv2d":
                ins.append(self.whole(n.inputs[1], wj))
            blocks.append(self.on(wj, n.op, *ins, name=f"{n.name}/part{j}",
                                  **{**n.attrs, "padding": (0, pw)}))
        return Split(axis, blocks, bounds, workers)

    def shared_rows(self, n: Node, axis: int, spans: list[tuple[int, int]],
                    workers: list[int]) -> dict[int, tuple[int, Node]]:
        """For a worker holding several blocks of windowed `n` whose input is whole and
        replicable (the input's layout transpose): the rows all its blocks read, made once
        (first row, node). Each block then takes a view of them: rows along axis 0 are one
        contiguous run. Made per block, the blocks' overlapping rows were sliced and
        transposed twice."""
        x = n.inputs[0]
        if axis != 0 or isinstance(self.val.get(x), Split | Partial | FlatSplit):
            return {}
        out = {}
        for w in sorted(set(workers)):
            mine = [j for j, wj in enumerate(workers) if wj == w]
            if len(mine) < 2 or not replicable(whole := self.whole(x, w)):
                continue
            lo, hi = min(spans[j][0] for j in mine), max(spans[j][1] for j in mine)
            out[w] = (lo, self.rows_of(whole, axis, lo, hi, w, n.name, f"{mine[0]}to{mine[-1]}"))
        return out

    def view_rows(self, shared: tuple[int, Node], axis: int, lo: int, hi: int, worker: int,
                  name: str) -> Node:
        """Rows [lo, hi) of the input out of a worker's shared rows (see `shared_rows`)."""
        first, rows = shared
        if (lo - first, hi - first) == (0, rows.shape[axis]):
            return rows
        return self.cut(rows, axis, lo - first, hi - first, worker, name)

    def cut(self, node: Node, axis: int, lo: int, hi: int, worker: int, name: str) -> Node:
        """node's rows [lo, hi) along `axis`, sliced on `worker`."""
        return self.on(worker, "slice", node, name=name,
                       begin=tuple(lo if d == axis else 0 for d in range(node.ndim)),
                       end=tuple(hi if d == axis else None for d in range(node.ndim)))

    def _windowed(self, n: Node) -> bool:
        """Split a windowed op by rows unless it is max pooling over padding (its pad is -inf,
        not zeros) or the input is split along another axis."""
        if n not in self.rows or self.parts == 1:
            return False
        if n.op == "max_pool2d" and n.attrs["padding"][0] > 0:
            return False
        v = self.val.get(n.inputs[0])
        return not isinstance(v, Split | Partial | FlatSplit) or v.axis == WINDOWED[n.op]

    def input_rows(self, x: Node, axis: int, lo: int, hi: int, worker: int, name: str,
                   block: int) -> Node:
        """Rows [lo, hi) along `axis` of x for output block `block` on `worker`: its own
        block plus halo slices of the neighbouring blocks, or a slice of x when x is whole."""
        v = self.val.get(x)
        if not isinstance(v, Split):
            whole = self.whole(x, worker)
            if replicable(whole):
                return self.rows_of(whole, axis, lo, hi, worker, name, block)
            return self.cut(whole, axis, lo, hi, worker_index(whole.device), f"{name}/in{block}")
        pieces = []
        for i, (blo, bhi) in enumerate(v.bounds):
            a, b = max(lo, blo), min(hi, bhi)
            if a < b:  # a halo, or a trimmed own block, is sliced where the block lives
                whole_block = (a, b) == (blo, bhi)
                pieces.append(v.blocks[i] if whole_block else
                              self.cut(v.blocks[i], axis, a - blo, b - blo, v.workers[i],
                                       f"{name}/rows{i}to{block}"))
        if len(pieces) == 1:
            return pieces[0]
        return self.on(worker, "concat", *pieces, name=f"{name}/in{block}", axis=axis)

    def rows_of(self, n: Node, axis: int, lo: int, hi: int, worker: int, name: str,
                block: int | str) -> Node:
        """Rows [lo, hi) along `axis` of a replicable node, computed on `worker` from the same
        rows of its input: the slice moves up to the placeholder, so that no worker spends
        time on the whole input (its layout transpose, say)."""
        if n.op in REPLICATED and n.ndim <= axis:  # a scalar constant: every row's
            return n
        label = f"{n.name}/rows{lo}to{hi}on{worker}"  # (two layers may read the same rows)
        if label in self.out:
            return self.out[label]
        if n.op in REPLICATED:  # (named after the layer that reads the rows)
            return self.cut(n, axis, lo, hi, worker, f"{name}/in{block}")
        src_axis = n.attrs["axes"][axis] if n.op == "transpose" else axis
        rows = self.rows_of(n.inputs[0], src_axis, lo, hi, worker, name, block)
        return self.on(worker, n.op, rows, name=label, **n.attrs)

    def replicate(self, n: Node, worker: int) -> Node:
        """A copy on `worker` of a node computed only from placeholders/constants (cheap, e.g.
        the input's layout transpose), so the input itself never crosses."""
        if n.op in REPLICATED or worker_index(n.device) == worker:
            return n
        name = f"{n.name}/on{worker}"
        if name in self.out:
            return self.out[name]
        ins = [self.replicate(x, worker) for x in n.inputs]
        return self.on(worker, n.op, *ins, name=name, **n.attrs)

    def _splittable_matmul(self, n: Node) -> bool:
        a, b = n.inputs
        if n.attrs.get("transpose_a") or n.attrs.get("transpose_b") or b.op != "parameter":
            return False
        return isinstance(self.val.get(a), FlatSplit) or (
            self.users[b] == 1 and b not in self.val and b.shape[1] >= 2 * self.parts)

    def matmul(self, n: Node) -> Split | Partial:
        a, w = n.inputs
        v = self.val.get(a)
        if isinstance(v, FlatSplit):  # contract each worker's features with its rows of W
            c, hh, ww = v.shape
            units = int(w.shape[1])
            shapes = [(c * (hi - lo) * ww, units) for lo, hi in v.source.bounds]
            axis = v.source.axis  # 2 (H) in NCHW
            view = (c, hh, ww, units) if axis == 2 else None
            if view is None:
                self.val[a] = self.whole(a)
                return self.by_units(n)
            on = v.source.workers
            wb = self.block_param(w, view, 1, v.source.bounds, shapes, on)
            blocks = [self.on(on[j], "matmul",
                              self.on(on[j], "flatten", b, name=f"{a.name}/part{j}"),
                              wb[j], name=f"{n.name}/part{j}")
                      for j, b in enumerate(v.source.blocks)]
            return Partial(blocks)
        return self.by_units(n)

    def _split_by_classes(self, logits: Node) -> bool:
        v = self.val.get(logits)
        return isinstance(v, Split) and v.axis == 1 and len(v.blocks) > 1

    def split_xent(self, n: Node) -> Node:
        """The loss of logits in blocks of classes from each block's statistics, made where
        the block is (ops/split_loss.py): no block of logits crosses."""
        logits, labels = n.inputs
        v, ys = self.val[logits], self.on_every_worker(labels)
        stats = [self.on(w, "xent_block", b, ys[w], name=f"{n.name}/part{j}", lo=lo,
                         classes=int(logits.shape[1]))
                 for j, (b, (lo, _), w) in enumerate(zip(v.blocks, v.bounds, v.workers))]
        return self.on(0, "xent_combine", *stats, name=n.name)

    def by_units(self, n: Node) -> Split:
        """Dense split by output units: W's columns per worker, the input gathered on all."""
        a, w = n.inputs
        bounds = row_bounds(int(w.shape[1]), self.parts)
        wb = self.block_param(w, w.shape, 1, bounds, [(w.shape[0], hi - lo) for lo, hi in bounds],
                              range(self.parts))
        blocks = [self.on(j, "matmul", x, wb[j], name=f"{n.name}/part{j}")
                  for j, x in enumerate(self.on_every_worker(a))]
        return Split(1, blocks, bounds)
