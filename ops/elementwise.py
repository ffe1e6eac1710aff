"""Elementwise ops with NumPy broadcasting, and the broadcast adjoints sum_to / broadcast_like."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphflow.errors import ShapeError
from graphflow.ir import Node, Shape
from graphflow.ops import strided as K
from graphflow.ops.registry import (
    Spec,
    apply,
    broadcast_shapes,
    elementwise_cost,
    fmt,
    register,
    same_float_dtype,
)

Grads = Sequence[Node | None]


def run_map(code: int, ins: Sequence[np.ndarray], out_shape: tuple[int, ...] | None = None,
            dtype: np.dtype | None = None) -> np.ndarray:
    """Apply elementwise `code` to up to three broadcast operands into a new array."""
    if out_shape is None:
        same = all(x.shape == ins[0].shape for x in ins)
        out_shape = ins[0].shape if same else np.broadcast_shapes(*(x.shape for x in ins))
    dtype = dtype or ins[0].dtype
    out = np.empty(out_shape, dtype)
    args = [np.asarray(x, dtype) for x in ins]
    args += [args[0]] * (3 - len(args))
    if all(x.shape == out.shape and x.flags.c_contiguous for x in args):
        K.map_flat(code, *(x.reshape(-1) for x in args), out.reshape(-1))
    else:  # (a small op's time is mostly this Python: broadcast only what needs it)
        args = [x if x.shape == out.shape else np.broadcast_to(x, out.shape) for x in args]
        K.map_6d(code, *K.as_6d(*args, out))
    return out


def _infer_broadcast(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    dtype = same_float_dtype(ins)
    shape = ins[0].shape
    for s in ins[1:]:
        shape = broadcast_shapes(shape, s.shape)
    return Spec(shape, dtype)


def _map_forward(code: int):  # noqa: ANN202 - a kernel wrapper factory
    def forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
        return run_map(code, ins)
    return forward


def _op(name: str, code: int, grad: Any, flops: float = 1.0, doc: str = "") -> None:
    register(name, _infer_broadcast, _map_forward(code), grad, elementwise_cost(flops), doc)


# -- broadcast adjoints ------------------------------------------------------------------------

def sum_to(x: Node, shape: Shape) -> Node:
    """Sum `x` down to `shape` (the reverse of broadcasting); identity when shapes match."""
    return x if tuple(x.shape) == tuple(shape) else apply("sum_to", x, shape=tuple(shape))


def _infer_sum_to(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    target = tuple(attrs["shape"])
    if broadcast_shapes(ins[0].shape, target) != ins[0].shape:
        raise ShapeError(f"cannot sum {fmt(ins[0].shape)} down to {fmt(target)}")
    return Spec(target, same_float_dtype(ins))


def _sum_to_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    (g,) = ins
    target = tuple(attrs["shape"])
    lead = g.ndim - len(target)
    shape = tuple(g.shape[lead + i] if d is None else d for i, d in enumerate(target))
    out = np.zeros(shape, g.dtype)
    padded = out.reshape((1,) * lead + shape)
    strides = tuple(0 if n == 1 and gn != 1 else st
                    for n, gn, st in zip(padded.shape, g.shape, padded.strides, strict=True))
    dst = np.lib.stride_tricks.as_strided(padded, g.shape, strides)
    K.reduce_6d(K.R_SUM, *K.as_6d(np.ascontiguousarray(g), dst))
    return out


def _sum_to_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("broadcast_like", dy, node.inputs[0])]


def _infer_broadcast_like(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    if broadcast_shapes(ins[0].shape, ins[1].shape) != ins[1].shape:
        raise ShapeError(f"cannot broadcast {fmt(ins[0].shape)} to {fmt(ins[1].shape)}")
    return Spec(ins[1].shape, same_float_dtype(ins[:1]))


def _broadcast_like_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    g, like = ins
    out = np.empty(like.shape, g.dtype)
    K.copy_6d(*K.as_6d(np.broadcast_to(g, like.shape), out))
    return out


def _broadcast_like_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [sum_to(dy, node.inputs[0].shape), None]


register("sum_to", _infer_sum_to, _sum_to_forward, _sum_to_grad,
         doc="sum a broadcast gradient back to an input's shape (attr shape)")
register("broadcast_like", _infer_broadcast_like, _broadcast_like_forward, _broadcast_like_grad,
         doc="broadcast input 0 to the shape of input 1")


# -- binary ops --------------------------------------------------------------------------------

def _two(node: Node, ga: Node | None, gb: Node | None) -> Grads:
    a, b = node.inputs
    return [None if ga is None else sum_to(ga, a.shape),
            None if gb is None else sum_to(gb, b.shape)]


def _add_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return _two(node, dy, dy)


def _sub_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return _two(node, dy, apply("neg", dy) if wants[1] else None)


def _mul_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return _two(node, apply("mul", dy, b) if wants[0] else None,
                apply("mul", dy, a) if wants[1] else None)


def _div_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    _, b = node.inputs
    ga = apply("div", dy, b) if wants[0] else None
    gb = apply("neg", apply("div", apply("mul", dy, node), b)) if wants[1] else None
    return _two(node, ga, gb)


def _maximum_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    a, b = node.inputs
    return _two(node, apply("max_grad_a", a, b, dy) if wants[0] else None,
                apply("max_grad_b", a, b, dy) if wants[1] else None)


_op("add", K.ADD, _add_grad, doc="a + b")
_op("sub", K.SUB, _sub_grad, doc="a - b")
_op("mul", K.MUL, _mul_grad, doc="a * b")
_op("div", K.DIV, _div_grad, doc="a / b")
_op("maximum", K.MAXIMUM, _maximum_grad, doc="elementwise max(a, b); ties go to a")
_op("max_grad_a", K.MAX_GRAD_A, None, doc="dy where a >= b (gradient of maximum wrt a)")
_op("max_grad_b", K.MAX_GRAD_B, None, doc="dy where a < b (gradient of maximum wrt b)")


# -- unary ops ---------------------------------------------------------------------------------

def _neg_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("neg", dy)]


def _exp_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("mul", dy, node)]


def _log_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("div", dy, node.inputs[0])]


def _square_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    x = node.inputs[0]
    return [apply("mul", apply("mul", dy, x), apply("constant", value=np.array(2.0, x.dtype)))]


def _by_output(grad_op: str):  # noqa: ANN202 - gradient rules that read the op's output
    def rule(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
        return [apply(grad_op, node, dy)]
    return rule


def _relu_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("relu_grad", node.inputs[0], dy)]


_op("neg", K.NEG, _neg_grad, doc="-x")
_op("exp", K.EXP, _exp_grad, 10, doc="e ** x")
_op("log", K.LOG, _log_grad, 10, doc="natural logarithm")
_op("sqrt", K.SQRT, _by_output("sqrt_grad"), 4, doc="square root")
_op("square", K.SQUARE, _square_grad, doc="x * x")
_op("relu", K.RELU, _relu_grad, doc="max(x, 0)")
_op("sigmoid", K.SIGMOID, _by_output("sigmoid_grad"), 12, doc="1 / (1 + e ** -x)")
_op("tanh", K.TANH, _by_output("tanh_grad"), 12, doc="hyperbolic tangent")
_op("relu_grad", K.RELU_GRAD, None, doc="dy where x > 0 (inputs x, dy)")
_op("sigmoid_grad", K.SIGMOID_GRAD, None, 3, doc="dy * y * (1 - y) (inputs y, dy)")
_op("tanh_grad", K.TANH_GRAD, None, 3, doc="dy * (1 - y * y) (inputs y, dy)")
_op("sqrt_grad", K.SQRT_GRAD, None, 3, doc="dy / (2 y) (inputs y, dy)")


def _infer_like(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    return Spec(ins[0].shape, same_float_dtype(ins))


def _ones_like_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return run_map(K.FILL, [np.ones((), ins[0].dtype)], ins[0].shape)


register("ones_like", _infer_like, _ones_like_forward, None, doc="ones of the input's shape")


# -- the DSL's functions -----------------------------------------------------------------------

def add(a: Any, b: Any, name: str | None = None) -> Node:
    return apply("add", a, b, name=name)


def sub(a: Any, b: Any, name: str | None = None) -> Node:
    return apply("sub", a, b, name=name)


def mul(a: Any, b: Any, name: str | None = None) -> Node:
    return apply("mul", a, b, name=name)


def div(a: Any, b: Any, name: str | None = None) -> Node:
    return apply("div", a, b, name=name)


def maximum(a: Any, b: Any, name: str | None = None) -> Node:
    return apply("maximum", a, b, name=name)


def neg(x: Node, name: str | None = None) -> Node:
    return apply("neg", x, name=name)


def exp(x: Node, name: str | None = None) -> Node:
    return apply("exp", x, name=name)


def log(x: Node, name: str | None = None) -> Node:
    return apply("log", x, name=name)


def sqrt(x: Node, name: str | None = None) -> Node:
    return apply("sqrt", x, name=name)


def square(x: Node, name: str | None = None) -> Node:
    return apply("square", x, name=name)


def relu(x: Node, name: str | None = None) -> Node:
    return apply("relu", x, name=name)


def sigmoid(x: Node, name: str | None = None) -> Node:
    return apply("sigmoid", x, name=name)


def tanh(x: Node, name: str | None = None) -> Node:
    return apply("tanh", x, name=name)
