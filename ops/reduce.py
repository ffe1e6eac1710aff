"""Reductions over axes: reduce_sum, reduce_mean, reduce_max, and their backward helpers."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node, Shape
from graphflow.ops import strided as K
from graphflow.ops.registry import (
    Cost,
    Spec,
    apply,
    axis_arg,
    fmt,
    normalize_axes,
    register,
    same_float_dtype,
)

Grads = Sequence[Node | None]
LONG_SUM = 128  # float32 sums of more elements than this accumulate in float64 (numpy's
# pairwise sum, too, adds 128 one after another)


@njit(cache=True, nogil=True)
def scale_kernel(x: np.ndarray, factor: float) -> None:
    """x *= factor in place (x is 1-D contiguous)."""
    for i in range(x.size):
        x[i] = x[i] * factor


@njit(cache=True, nogil=True)
def route_first_max_kernel(x: np.ndarray, y: np.ndarray, dy: np.ndarray, out: np.ndarray) -> None:
    """out[k, r] = dy[k] at the first r with x[k, r] == y[k], else 0 (out pre-zeroed)."""
    for k in range(x.shape[0]):
        for r in range(x.shape[1]):
            if x[k, r] == y[k]:
                out[k, r] = dy[k]
                break


def _axes(attrs: dict[str, Any], ndim: int) -> tuple[int, ...]:
    return normalize_axes(attrs.get("axes"), ndim)


def _kept_shape(shape: Shape, axes: tuple[int, ...]) -> Shape:
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


def _infer_reduce(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    shape = ins[0].shape
    axes = _axes(attrs, len(shape))
    if attrs.get("keepdims", False):
        return Spec(_kept_shape(shape, axes), same_float_dtype(ins))
    return Spec(tuple(n for d, n in enumerate(shape) if d not in axes), same_float_dtype(ins))


def reduce_array(code: int, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Sum (K.R_SUM) or max (K.R_MAX) of C-contiguous x over `axes` into a new array."""
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    if code == K.R_MAX and any(x.shape[d] == 0 for d in axes):
        raise ValueError(f"reduce_max over an empty axis of an input of shape {x.shape}")
    # long float32 sums run into float64: reduce_6d adds element after element to dst, and a
    # float32 running total of millions of elements loses its low bits (50M ones-ish: 0.1%)
    long = code == K.R_SUM and x.dtype == np.float32 and _count(x.shape, axes) > LONG_SUM
    acc = np.float64 if long else x.dtype
    out = np.full(kept, 0 if code == K.R_SUM else -np.inf, acc)
    if x.size:
        strides = tuple(0 if d in axes else s for d, s in enumerate(out.strides))
        dst = np.lib.stride_tricks.as_strided(out, x.shape, strides)
        K.reduce_6d(code, *K.as_6d(x, dst))
    out = out.astype(x.dtype, copy=False)
    if keepdims:
        return out
    return out.reshape([n for d, n in enumerate(x.shape) if d not in axes])


def _count(x_shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    return prod(x_shape[d] for d in axes)


def _sum_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    return reduce_array(K.R_SUM, x, _axes(attrs, x.ndim), attrs.get("keepdims", False))


def _mean_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    axes = _axes(attrs, x.ndim)
    out = reduce_array(K.R_SUM, x, axes, attrs.get("keepdims", False))
    scale_kernel(out.reshape(-1), 1.0 / max(_count(x.shape, axes), 1))
    return out


def _max_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = ins[0]
    return reduce_array(K.R_MAX, x, _axes(attrs, x.ndim), attrs.get("keepdims", False))


def _reduce_cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
                 itemsize: int) -> Cost:
    n = prod(ins[0])
    return Cost(float(n), itemsize * n, itemsize * prod(out))


def _keepdims_dy(node: Node, dy: Node) -> Node:
    x = node.inputs[0]
    if node.attrs.get("keepdims", False):
        return dy
    return apply("reshape", dy, shape=_kept_shape(x.shape, _axes(node.attrs, x.ndim)))


def _sum_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("broadcast_like", _keepdims_dy(node, dy), node.inputs[0])]


def _mean_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    attrs = {"axes": node.attrs.get("axes"), "keepdims": node.attrs.get("keepdims", False)}
    return [apply("reduce_mean_grad", dy, node.inputs[0], **attrs)]


def _max_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    attrs = {"axes": node.attrs.get("axes"), "keepdims": node.attrs.get("keepdims", False)}
    return [apply("reduce_max_grad", node.inputs[0], node, dy, **attrs)]


register("reduce_sum", _infer_reduce, _sum_forward, _sum_grad, _reduce_cost,
         doc="sum over attr axes (None = all), attr keepdims")
register("reduce_mean", _infer_reduce, _mean_forward, _mean_grad, _reduce_cost,
         doc="mean over attr axes (None = all), attr keepdims")
register("reduce_max", _infer_reduce, _max_forward, _max_grad, _reduce_cost,
         doc="max over attr axes (None = all), attr keepdims")


# -- backward helpers ----------------------------------------------------------------------------

def _check_reduced(dy: Spec, x: Spec, attrs: dict[str, Any], what: str) -> None:
    want = _infer_reduce([Spec(x.shape, x.dtype)], attrs).shape
    if tuple(dy.shape) != tuple(want):
        raise ShapeError(f"{what} has shape {fmt(dy.shape)}, expected {fmt(want)} (input "
                         f"{fmt(x.shape)} reduced over axes {attrs.get('axes')})")


def _infer_mean_grad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    dy, x = ins
    _check_reduced(dy, x, attrs, "dy")
    return Spec(x.shape, same_float_dtype(ins))


def _mean_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    dy, x = ins
    axes = _axes(attrs, x.ndim)
    g = dy.reshape(_kept_shape(x.shape, axes))
    out = np.empty(x.shape, dy.dtype)
    if out.size:
        K.copy_6d(*K.as_6d(np.broadcast_to(g, x.shape), out))
        scale_kernel(out.reshape(-1), 1.0 / _count(x.shape, axes))
    return out


def _infer_max_grad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x, y, dy = ins
    _check_reduced(y, x, attrs, "y")
    _check_reduced(dy, x, attrs, "dy")
    return Spec(x.shape, same_float_dtype(ins))


def _max_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, y, dy = ins
    axes = _axes(attrs, x.ndim)
    rest = tuple(d for d in range(x.ndim) if d not in axes)
    order = rest + axes
    n_kept = prod(x.shape[d] for d in rest)
    xt = np.ascontiguousarray(x.transpose(order)).reshape(n_kept, -1)
    out_t = np.zeros(xt.shape, x.dtype)
    route_first_max_kernel(xt, y.reshape(-1), dy.reshape(-1), out_t)
    out = np.empty(x.shape, x.dtype)
    if out.size:
        inverse = tuple(int(i) for i in np.argsort(order))
        moved = out_t.reshape([x.shape[d] for d in order]).transpose(inverse)
        K.copy_6d(*K.as_6d(moved, out))
    return out


register("reduce_mean_grad", _infer_mean_grad, _mean_grad_forward, None, _reduce_cost,
         doc="dy (reduce_mean's output gradient) broadcast to x's shape / count (inputs dy, x)")
register("reduce_max_grad", _infer_max_grad, _max_grad_forward, None, _reduce_cost,
         doc="dy routed to the first position of each max of x (inputs x, y = max, dy); "
             "ties: only the first maximal element in C order over the reduced axes gets dy")


# -- the DSL's functions -----------------------------------------------------------------------

def reduce_sum(x: Node, axes: int | Sequence[int] | None = None, keepdims: bool = False,
               name: str | None = None) -> Node:
    """Sum over `axes` (None = all): `reduce_sum(x, 1)` of (N, 5) is (N,)."""
    return apply("reduce_sum", x, name=name, axes=axis_arg("reduce_sum", axes, "axes", many=True),
                 keepdims=keepdims)


def reduce_mean(x: Node, axes: int | Sequence[int] | None = None, keepdims: bool = False,
                name: str | None = None) -> Node:
    """Mean over `axes` (None = all); the count may include the batch dim."""
    return apply("reduce_mean", x, name=name, axes=axis_arg("reduce_mean", axes, "axes", many=True),
                 keepdims=keepdims)


def reduce_max(x: Node, axes: int | Sequence[int] | None = None, keepdims: bool = False,
               name: str | None = None) -> Node:
    """Max over `axes` (None = all); its gradient goes to the first maximal element."""
    return apply("reduce_max", x, name=name, axes=axis_arg("reduce_max", axes, "axes", many=True),
                 keepdims=keepdims)
