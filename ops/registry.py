"""The op table: op name -> shape/dtype rule, forward kernel, gradient rule, cost.

Every op is declared once with `register`; the IR, autodiff, executor and cost model all read
this table. A gradient rule builds the backward pass from other registered ops, so the backward
pass is itself a graph that can be partitioned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, NamedTuple

import numpy as np

from graphflow.errors import (
    DTypeError,
    GraphError,
    GraphflowError,
    ShapeError,
    described,
    located,
)
from graphflow.ir import Graph, Node, Shape, current_graph, open_graph, user_source_line
from graphflow.ir import format_tuple as fmt  # (8,), not (8): the ops' error messages
from graphflow.ops.window import is_int


class Spec(NamedTuple):
    """Static shape and dtype of a tensor."""

    shape: Shape
    dtype: str


class Cost(NamedTuple):
    """Work of one op application: floating point operations and bytes moved."""

    flops: float
    bytes_read: float
    bytes_written: float


Infer = Callable[[Sequence[Spec], dict[str, Any]], Spec]
Forward = Callable[[Sequence[np.ndarray], dict[str, Any]], np.ndarray]
Grad = Callable[[Node, Node, tuple[bool, ...]], Sequence[Node | None]]
CostFn = Callable[[Sequence[tuple[int, ...]], tuple[int, ...], dict[str, Any], int], Cost]
Accumulate = Callable[[Sequence[np.ndarray], dict[str, Any], np.ndarray], None]


def dot_cost(weight: int, grad: int, depth: Callable[[tuple[int, ...]], int]) -> CostFn:
    """The cost of a windowed layer or one of its gradients: a multiply-add per element of y
    (or dy) and per term of its dot product, `depth(weight's shape)` terms; the shapes
    [*inputs, output] hold the weight at index `weight` and y or dy at index `grad`. Every
    input is read once and the output written once."""
    def cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
             itemsize: int) -> Cost:
        shapes = [*ins, out]
        flops = 2.0 * prod(shapes[grad]) * depth(shapes[weight])
        return Cost(flops, itemsize * sum(prod(s) for s in ins), itemsize * prod(out))
    return cost

FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int32", "int64")


def elementwise_cost(flops_per_element: float = 1.0) -> CostFn:
    def cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
             itemsize: int) -> Cost:
        n = prod(out)
        return Cost(flops_per_element * n, itemsize * sum(prod(s) for s in ins), itemsize * n)
    return cost


@dataclass(frozen=True)
class OpDef:
    """One row of the op table. `forward` is None for source ops the executor fills itself.
    `accumulate`, where an op has one, does out += forward(ins) without a temporary (a gemm
    with beta = 1): a gradient summed over micro-batches skips a pass over its memory."""

    name: str
    infer: Infer
    forward: Forward | None
    grad: Grad | None
    cost: CostFn
    doc: str = ""
    accumulate: Accumulate | None = None

    def infer_node(self, node: Node) -> tuple[Shape, str]:
        """Run the shape rule on a node's inputs; errors name the node and its source line."""
        specs = [Spec(x.shape, x.dtype) for x in node.inputs]
        try:
            shape, dtype = self.infer(specs, node.attrs)
        except (ShapeError, DTypeError) as e:
            raise type(e)(located(node, str(e))) from None
        except (TypeError, ValueError, KeyError) as e:
            raise ShapeError(located(node, f"bad attributes or inputs: {e}")) from None
        return tuple(shape), dtype


REGISTRY: dict[str, OpDef] = {}


def register(name: str, infer: Infer, forward: Forward | None, grad: Grad | None = None,
             cost: CostFn | None = None, doc: str = "",
             accumulate: Accumulate | None = None) -> OpDef:
    if name in REGISTRY:
        raise GraphflowError(f"op '{name}' is registered twice")
    op = OpDef(name, infer, forward, grad, cost or elementwise_cost(), doc, accumulate)
    REGISTRY[name] = op
    return op


def apply(op: str, *inputs: Node, name: str | None = None, **attrs: Any) -> Node:
    """Add `op` applied to `inputs` to the current graph (the DSL's single entry point)."""
    graph = _graph_for(op, inputs)
    return graph.add(op, tuple(as_node(x, graph) for x in inputs), attrs, name=name)


def _graph_for(op: str, inputs: Sequence[Any]) -> Graph:
    """The open graph (else the inputs' one), once every node input is checked to be in it:
    a node from another graph is named here, before a constant is made for the wrong one."""
    nodes = [x for x in inputs if isinstance(x, Node)]
    graph = open_graph()
    now = "the one open here"
    if graph is None:  # (`is None`: an empty Graph is falsy, it has a len)
        graph, now = (nodes[0].graph if nodes else current_graph()), "its other inputs' one"
    for x in nodes:
        if x.graph is not graph:
            made = getattr(x.graph, "source", "<unknown>")
            raise GraphError(f"{op} ({user_source_line()}): input {x.where()} is not a node of "
                             f"this graph, {now} (made at {graph.source}): it belongs to the "
                             f"graph made at {made}; build it inside that graph's `with` block")
    return graph


def as_node(x: Any, graph: Graph | None = None) -> Node:
    """Nodes pass through; Python and NumPy scalars and arrays become constants in `graph`
    (default: the current graph)."""
    if isinstance(x, Node):
        return x
    g = graph if graph is not None else current_graph()
    value = np.asarray(x, dtype=g.dtype if np.asarray(x).dtype.kind == "f"
                       or isinstance(x, (int, float)) else None)
    return g.add("constant", (), {"value": value})


# -- shape helpers used by many rules --------------------------------------------------------

def same_float_dtype(specs: Sequence[Spec]) -> str:
    dtypes = {s.dtype for s in specs}
    if len(dtypes) != 1:
        raise DTypeError(f"inputs have different dtypes {sorted(dtypes)}, expected one float dtype")
    (dtype,) = dtypes
    if dtype not in FLOAT_DTYPES:
        raise DTypeError(f"input dtype is {dtype}, expected one of {', '.join(FLOAT_DTYPES)}")
    return dtype


def broadcast_shapes(a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting with None (the batch dimension) matching None or 1."""
    out: list[int | None] = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            raise ShapeError(f"shapes {fmt(a)} and {fmt(b)} do not broadcast")
    return tuple(reversed(out))


def expect_ndim(spec: Spec, ndim: int, what: str, layout: str = "") -> None:
    if len(spec.shape) != ndim:
        hint = f" {layout}" if layout else ""
        raise ShapeError(f"{what} has {len(spec.shape)} dims, expected {ndim}{hint}")


def normalize_axes(axes: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"axis {a} is out of range for {ndim} dims")
        out.append(a % ndim)
    return tuple(sorted(set(out)))


def axis_arg(op: str, value: Any, what: str = "axis", many: bool = False) -> Any:
    """A DSL function's `what` argument as its attr holds it: an int (NumPy's too) or, with
    `many`, also a list or tuple of them or None. Anything else is a TypeError naming the op,
    the argument and what it takes (not a message from inside the shape rule)."""
    if is_int(value):
        return int(value)
    if many and value is None:
        return None
    if many and isinstance(value, list | tuple) and all(is_int(a) for a in value):
        return tuple(int(a) for a in value)
    takes = "an int, a list of ints or None" if many else "an int"
    raise TypeError(f"{op} ({user_source_line()}): {what} must be {takes}, got "
                    f"{described(value)}")


def concrete(shape: Shape, batch: int) -> tuple[int, ...]:
    """`shape` with the symbolic batch dimension (None) set to `batch`."""
    return tuple(batch if d is None else int(d) for d in shape)


def node_cost(node: Node, batch: int) -> Cost:
    """FLOPs and bytes of one application of `node` at batch size `batch`."""
    ins = [concrete(x.shape, batch) for x in node.inputs]
    itemsize = np.dtype(node.dtype).itemsize
    return REGISTRY[node.op].cost(ins, concrete(node.shape, batch), node.attrs, itemsize)
