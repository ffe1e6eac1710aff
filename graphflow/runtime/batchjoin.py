"""How a value computed a micro-batch at a time joins into the whole batch's.

A pipelined step runs each micro-batch through the graph on its own; what it fetches must be
the whole batch's value all the same. How depends on how the value reads the batch:

    rows       a tensor with a batch axis: the micro-batches' rows, joined along it
    same       the batch does not reach it (a parameter): any micro-batch's
    mean       a mean over the batch (the loss): the mean weighted by rows
    sum        a sum over the batch: the sum
    max        a max over the batch: the max
    grad_rows  a gradient with a batch axis: joined, / micro-batches (see `seed_scale`)
    grad       any other gradient: the mean over micro-batches (summed, / micro-batches)

A value of none of these kinds (the square of a batch sum) cannot be joined from parts: a
fetch of it with micro-batches is refused (`joins`), and a loss must be a mean or a sum
(`loss_join`), as its gradients are weighed by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from graphflow.autodiff import is_seed
from graphflow.errors import GraphflowError
from graphflow.ir import Graph, Node
from graphflow.ops.registry import normalize_axes

MIXED = "mixed"  # none of the kinds: not joinable
REDUCTIONS = {"reduce_sum": "sum", "reduce_mean": "mean", "reduce_max": "max",
              "softmax_cross_entropy": "mean", "mse": "mean", "xent_combine": "mean"}
# ops that keep a sum or a mean one (they are linear in their varying input) ...
LINEAR = {"reshape", "flatten", "transpose", "slice", "concat", "pad", "neg",
          "reduce_sum", "reduce_mean"}
# ... and those that keep a max one (they only move or pick elements)
SELECTING = {"reshape", "flatten", "transpose", "slice", "concat", "reduce_max"}


def kinds(graph: Graph) -> dict[str, str]:
    """Every node's kind (the module docstring's table, or MIXED), by name."""
    out: dict[str, str] = {}
    for node in graph.nodes:  # (creation order: a node's inputs come first)
        out[node.name] = _kind(node, [out[x.name] for x in node.inputs])
    return out


def _kind(node: Node, ins: list[str]) -> str:
    batched = None in node.shape
    if MIXED in ins:  # (a gradient of it too: each micro-batch's differs from the batch's)
        return MIXED
    if is_seed(node) or any(k in ("grad", "grad_rows") for k in ins):
        return "grad_rows" if batched else "grad"  # (linear in the seed)
    if node.op == "placeholder":
        return "rows"
    if batched:  # rows, unless a row reads other rows: a batch statistic, or a cut across
        return "rows" if set(ins) <= {"rows", "same"} and not _across_rows(node) else MIXED
    varying = [k for k in ins if k != "same"]
    if not varying:
        return "same"
    kind, op = varying[0], node.op
    if set(varying) == {"rows"}:  # (a loss reads two: the logits and the labels)
        return REDUCTIONS[op] if op in REDUCTIONS and _over_batch(node) else MIXED
    if len(varying) > 1:  # the sum of two sums is one, and so on; not their product
        same = len(set(varying)) == 1
        return kind if same and (op in ("add", "sub", "concat") and kind in ("mean", "sum")
                                 or op == "concat" and kind == "max") else MIXED
    first = ins[0] == kind  # (c - max is a min; c / mean is no mean)
    if op == "add" or op == "sub" and (first or kind == "mean"):
        return kind if kind in ("mean", "max") else MIXED  # (a sum would add c M times)
    if op == "mul" or op == "div" and first:
        return kind if kind in ("mean", "sum") else MIXED
    if kind in ("mean", "sum") and op in LINEAR:
        return kind
    return kind if kind == "max" and op in SELECTING else MIXED


def _across_rows(node: Node) -> bool:
    """Whether a batched op reads across its input's rows: a softmax over the batch axis, or
    a concat, slice or pad along it (each micro-batch's would be cut or ordered otherwise)."""
    x = node.inputs[0] if node.inputs else None
    if x is None or None not in x.shape:
        return False
    axis, last = x.shape.index(None), len(x.shape) - 1
    if node.op in ("softmax", "log_softmax"):
        return axis == last
    if node.op == "concat":
        return int(node.attrs["axis"]) % len(x.shape) == node.shape.index(None)
    if node.op == "slice":
        begin, end = node.attrs["begin"], node.attrs["end"]
        return axis < len(begin) and (begin[axis] != 0 or end[axis] is not None)
    if node.op == "pad":
        return tuple(node.attrs["pads"][axis]) != (0, 0)
    return False


def _over_batch(node: Node) -> bool:
    """Whether a reduction reads its input's batch axis (a loss reads it all)."""
    x = node.inputs[0]
    if not node.op.startswith("reduce_"):
        return True
    axes = normalize_axes(node.attrs.get("axes"), len(x.shape))
    return None in x.shape and x.shape.index(None) in axes


def joins(graph: Graph, known: dict[str, str], names: Iterable[str]) -> dict[str, str]:
    """How each of `names` joins (`known`: `kinds(graph)`); GraphflowError for one that
    cannot, naming it."""
    out = {}
    for name in names:
        kind = known[name]
        if kind == MIXED:
            node = graph[name]
            raise GraphflowError(
                f"{node.where()} cannot be fetched with micro-batches: its "
                f"value over the whole batch cannot be made from the micro-batches' (it is "
                f"neither a tensor of rows nor a sum, mean or max over the batch); fetch it "
                f"from a cluster without micro-batches")
        out[name] = kind
    return out


def loss_join(graph: Graph, known: dict[str, str], loss: str) -> str:
    """"mean" or "sum": how the loss reads the batch, which weighs each micro-batch's
    gradients; ValueError for any other loss."""
    kind = known[loss]
    if kind not in ("mean", "sum"):
        node = graph[loss]
        raise ValueError(f"micro-batches need a loss that is a mean or a sum over the batch, "
                         f"but {node.where()} is "
                         f"{'a max' if kind == 'max' else 'neither'}: its gradients cannot be "
                         f"made from the micro-batches'; train with microbatches=1")
    return kind


def seed_scale(loss: str, sizes: Sequence[int], mb: int) -> float:
    """What micro-batch `mb`'s gradients are scaled by (of micro-batches of `sizes` rows), so
    that their mean over the micro-batches is the whole batch's gradient: a mean loss weighs
    each by its share of the rows, a sum loss adds them up."""
    if loss == "sum":
        return float(len(sizes))
    return len(sizes) * sizes[mb] / sum(sizes)


def join(node: Node, kind: str, values: list[np.ndarray], rows: list[int]) -> np.ndarray:
    """The whole batch's value of `node`, of `kind`, from the micro-batches' `values`."""
    if len(values) == 1:
        return values[0]
    dtype = values[0].dtype
    if kind in ("rows", "grad_rows"):
        out = np.concatenate(values, axis=node.shape.index(None))
        return out * np.asarray(1 / len(values), dtype) if kind == "grad_rows" else out
    if kind == "sum":
        return np.asarray(np.sum(values, axis=0), dtype)
    if kind == "max":
        return np.max(values, axis=0)
    if kind == "grad":
        return np.asarray(np.mean(values, axis=0), dtype)
    if kind in ("mean", "same"):
        return np.asarray(np.average(values, axis=0, weights=rows), dtype)
    raise ValueError(f"'{node.name}': no way to join its micro-batches ({kind!r})")
