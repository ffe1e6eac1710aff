"""2-D max and average pooling on NCHW tensors, and their gradients.

Attributes (all pairs): kernel=(kh, kw), stride=(sh, sw), padding=(ph, pw) with ph < kh and
pw < kw, so every window holds at least one real element. Padding counts as -inf for max
pooling and as zeros for average pooling (which always divides by kh * kw, as PyTorch's
count_include_pad=True). max_pool2d_grad recomputes each window's argmax from x, so the forward
pass stores nothing extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node, Shape
from graphflow.ops.registry import Cost, Spec, apply, expect_ndim, fmt, register, same_float_dtype
from graphflow.ops.window import attr_pair, pair

Grads = Sequence[Node | None]
LAYOUT = "(N, C, H, W)"


# -- kernels -----------------------------------------------------------------------------------

@njit(cache=True, nogil=True, inline="always")
def _span(o: int, stride: int, pad: int, k: int, size: int) -> tuple[int, int]:
    """The input range [lo, hi) under output index o's window, clipped to the input."""
    lo = o * stride - pad
    return max(lo, 0), min(lo + k, size)


@njit(cache=True, nogil=True, inline="always")
def _window_max(x: np.ndarray, n: int, c: int, i0: int, i1: int, j0: int,
                j1: int) -> tuple[float, int, int]:
    """The largest value of x[n, c, i0:i1, j0:j1] and where it first stands (row order);
    strict comparisons, so the first of equal maxima wins and a NaN never does."""
    best, bi, bj = -np.inf, i0, j0
    for i in range(i0, i1):
        for j in range(j0, j1):
            if x[n, c, i, j] > best:
                best, bi, bj = x[n, c, i, j], i, j
    return best, bi, bj


@njit(cache=True, nogil=True)
def _max_pool_kernel(x: np.ndarray, out: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                     ph: int, pw: int) -> None:
    n_, c_, h_, w_ = x.shape
    ho_, wo_ = out.shape[2], out.shape[3]
    for n in range(n_):
        for c in range(c_):
            for oh in range(ho_):
                i0, i1 = _span(oh, sh, ph, kh, h_)
                for ow in range(wo_):
                    j0, j1 = _span(ow, sw, pw, kw, w_)
                    out[n, c, oh, ow] = _window_max(x, n, c, i0, i1, j0, j1)[0]


@njit(cache=True, nogil=True)
def _max_pool_grad_kernel(x: np.ndarray, dy: np.ndarray, dx: np.ndarray, kh: int, kw: int,
                          sh: int, sw: int, ph: int, pw: int) -> None:
    n_, c_, h_, w_ = x.shape
    ho_, wo_ = dy.shape[2], dy.shape[3]
    dx[...] = 0
    for n in range(n_):
        for c in range(c_):
            for oh in range(ho_):
                i0, i1 = _span(oh, sh, ph, kh, h_)
                for ow in range(wo_):
                    j0, j1 = _span(ow, sw, pw, kw, w_)
                    _, bi, bj = _window_max(x, n, c, i0, i1, j0, j1)
                    dx[n, c, bi, bj] += dy[n, c, oh, ow]


# The common window, 2x2 at stride 2 without padding, unrolled: the loops above, sized at run
# time, cost 5x as much for it (digits-lc's pooling was 44% of its step).
PAIR_WINDOW = (2, 2, 2, 2, 0, 0)


@njit(cache=True, nogil=True)
def _max_pool_pairs(x: np.ndarray, out: np.ndarray) -> None:
    ho_, wo_ = out.shape[2], out.shape[3]
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            for oh in range(ho_):
                for ow in range(wo_):
                    i, j = 2 * oh, 2 * ow
                    # max(best, v) keeps best unless v > best: NaNs lose, as in the loop above
                    best = max(-np.inf, x[n, c, i, j])
                    best = max(best, x[n, c, i, j + 1])
                    best = max(best, x[n, c, i + 1, j])
                    out[n, c, oh, ow] = max(best, x[n, c, i + 1, j + 1])


@njit(cache=True, nogil=True)
def _max_pool_pairs_grad(x: np.ndarray, dy: np.ndarray, dx: np.ndarray) -> None:
    ho_, wo_ = dy.shape[2], dy.shape[3]
    dx[...] = 0  # (an odd last row or column is in no window)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            for oh in range(ho_):
                for ow in range(wo_):
                    i, j = 2 * oh, 2 * ow
                    best, k = -np.inf, 0  # k: the window's first max, 0-3 in row order
                    if x[n, c, i, j] > best:
                        best = x[n, c, i, j]
                    if x[n, c, i, j + 1] > best:
                        best, k = x[n, c, i, j + 1], 1
                    if x[n, c, i + 1, j] > best:
                        best, k = x[n, c, i + 1, j], 2
                    if x[n, c, i + 1, j + 1] > best:
                        k = 3
                    dx[n, c, i + (k >> 1), j + (k & 1)] = dy[n, c, oh, ow]


@njit(cache=True, nogil=True)
def _avg_pool_kernel(x: np.ndarray, out: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                     ph: int, pw: int) -> None:
    n_, c_, h_, w_ = x.shape
    ho_, wo_ = out.shape[2], out.shape[3]
    scale = 1.0 / (kh * kw)
    for n in range(n_):
        for c in range(c_):
            for oh in range(ho_):
                i0, i1 = _span(oh, sh, ph, kh, h_)
                for ow in range(wo_):
                    j0, j1 = _span(ow, sw, pw, kw, w_)
                    acc = 0.0
                    for i in range(i0, i1):
                        for j in range(j0, j1):
                            acc += x[n, c, i, j]
                    out[n, c, oh, ow] = acc * scale


@njit(cache=True, nogil=True)
def _avg_pool_grad_kernel(dy: np.ndarray, dx: np.ndarray, kh: int, kw: int, sh: int, sw: int,
                          ph: int, pw: int) -> None:
    n_, c_, h_, w_ = dx.shape
    ho_, wo_ = dy.shape[2], dy.shape[3]
    scale = 1.0 / (kh * kw)
    dx[...] = 0
    for n in range(n_):
        for c in range(c_):
            for oh in range(ho_):
                i0, i1 = _span(oh, sh, ph, kh, h_)
                for ow in range(wo_):
                    j0, j1 = _span(ow, sw, pw, kw, w_)
                    g = dy[n, c, oh, ow] * scale
                    for i in range(i0, i1):
                        for j in range(j0, j1):
                            dx[n, c, i, j] += g


# -- attributes and shape rules ----------------------------------------------------------------

def _window(attrs: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    """(kh, kw, sh, sw, ph, pw) from the attrs, validated."""
    kh, kw = pair(attrs["kernel"], "kernel", 1)
    stride = attrs.get("stride")
    sh, sw = pair((kh, kw) if stride is None else stride, "stride", 1)
    ph, pw = pair(attrs.get("padding", 0), "padding", 0)
    if ph >= kh or pw >= kw:
        raise ShapeError(f"padding ({ph}, {pw}) must be smaller than the kernel ({kh}, {kw})")
    return kh, kw, sh, sw, ph, pw


def _out_hw(h: int, w: int, attrs: dict[str, Any]) -> tuple[int, int]:
    kh, kw, sh, sw, ph, pw = _window(attrs)
    if h + 2 * ph < kh or w + 2 * pw < kw:
        raise ShapeError(f"input is {h}x{w} (padded {h + 2 * ph}x{w + 2 * pw}), smaller than "
                         f"the {kh}x{kw} kernel")
    return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


def _pooled(x: Spec, attrs: dict[str, Any]) -> Shape:
    expect_ndim(x, 4, "input", LAYOUT)
    n, c, h, w = x.shape
    if h is None or w is None or c is None:
        raise ShapeError(f"input shape {fmt(x.shape)} must have known C, H and W")
    return (n, c, *_out_hw(h, w, attrs))


def _infer_pool(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    return Spec(_pooled(ins[0], attrs), same_float_dtype(ins))


def _check_dy(dy: Spec, want: Shape) -> None:
    expect_ndim(dy, 4, "dy", LAYOUT)
    if any(a is not None and b is not None and a != b for a, b in zip(dy.shape, want)):
        raise ShapeError(f"dy has shape {fmt(dy.shape)}, expected the pooled shape {fmt(want)}")


def _infer_max_grad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x, dy = ins
    _check_dy(dy, _pooled(x, attrs))
    return Spec(x.shape, same_float_dtype(ins))


def _infer_avg_grad(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    (dy,) = ins
    expect_ndim(dy, 4, "dy", LAYOUT)
    h, w = pair(attrs["input_hw"], "input_hw", 1)
    n, c = dy.shape[:2]
    _check_dy(dy, (n, c, *_out_hw(h, w, attrs)))
    return Spec((n, c, h, w), same_float_dtype(ins))


# -- forward wrappers, gradient rules, costs ---------------------------------------------------

def _max_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    (x,) = ins
    out = np.empty((*x.shape[:2], *_out_hw(x.shape[2], x.shape[3], attrs)), x.dtype)
    window = _window(attrs)
    if window == PAIR_WINDOW:
        _max_pool_pairs(x, out)
    else:
        _max_pool_kernel(x, out, *window)
    return out


def _max_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, dy = ins
    dx = np.empty_like(x)
    window = _window(attrs)
    if window == PAIR_WINDOW:
        _max_pool_pairs_grad(x, dy, dx)
    else:
        _max_pool_grad_kernel(x, dy, dx, *window)
    return dx


def _avg_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    (x,) = ins
    out = np.empty((*x.shape[:2], *_out_hw(x.shape[2], x.shape[3], attrs)), x.dtype)
    _avg_pool_kernel(x, out, *_window(attrs))
    return out


def _avg_grad_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    (dy,) = ins
    dx = np.empty((*dy.shape[:2], *pair(attrs["input_hw"], "input_hw", 1)), dy.dtype)
    _avg_pool_grad_kernel(dy, dx, *_window(attrs))
    return dx


def _window_attrs(node: Node) -> dict[str, Any]:
    return {k: node.attrs[k] for k in ("kernel", "stride", "padding") if k in node.attrs}


def _max_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("max_pool2d_grad", node.inputs[0], dy, **_window_attrs(node))]


def _avg_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    h, w = node.inputs[0].shape[2:]
    return [apply("avg_pool2d_grad", dy, input_hw=(h, w), **_window_attrs(node))]


def _avg_grad_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    return [apply("avg_pool2d", dy, **_window_attrs(node))]  # the adjoint of a linear map


def _pool_cost(pooled_input: int | None):  # noqa: ANN202 - a cost function factory
    """A pass that visits every window once: kh*kw flops per pooled element, which is the
    output (forward ops) or input `pooled_input` (gradient ops)."""
    def cost(ins: Sequence[tuple[int, ...]], out: tuple[int, ...], attrs: dict[str, Any],
             itemsize: int) -> Cost:
        kh, kw = _window(attrs)[:2]
        pooled = prod(out) if pooled_input is None else prod(ins[pooled_input])
        read = sum(prod(s) for s in ins)
        return Cost(float(kh * kw * pooled), float(itemsize * read), float(itemsize * prod(out)))
    return cost


register("max_pool2d", _infer_pool, _max_forward, _max_grad, _pool_cost(None),
         doc="2-D max pooling, NCHW (attrs kernel, stride, padding; padding is -inf)")
register("max_pool2d_grad", _infer_max_grad, _max_grad_forward, None, _pool_cost(1),
         doc="dy routed to each window's first argmax of x (inputs x, dy; max_pool2d's attrs)")
register("avg_pool2d", _infer_pool, _avg_forward, _avg_grad, _pool_cost(None),
         doc="2-D average pooling, NCHW (attrs kernel, stride, padding; divides by kh*kw)")
register("avg_pool2d_grad", _infer_avg_grad, _avg_grad_forward, _avg_grad_grad,
         _pool_cost(0), doc="dy spread evenly over each window (input dy; attr input_hw)")


# -- the DSL's functions -----------------------------------------------------------------------

def _dsl_attrs(kernel: Any, stride: Any, padding: Any) -> dict[str, Any]:
    return {"kernel": attr_pair(kernel, "kernel", 1),
            "stride": attr_pair(kernel if stride is None else stride, "stride", 1),
            "padding": attr_pair(padding, "padding", 0)}


def max_pool2d(x: Node, kernel: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0, name: str | None = None) -> Node:
    """Max over each kernel window of an NCHW tensor; stride defaults to the kernel.

    >>> import graphflow as gf
    >>> with gf.Graph():
    ...     y = max_pool2d(gf.placeholder("x", (None, 3, 8, 8)), 3, stride=2, padding=1)
    >>> y.shape
    (None, 3, 4, 4)
    """
    return apply("max_pool2d", x, name=name, **_dsl_attrs(kernel, stride, padding))


def avg_pool2d(x: Node, kernel: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0, name: str | None = None) -> Node:
    """Mean over each kernel window of an NCHW tensor (zero padding counts, divides by kh*kw).

    >>> import graphflow as gf
    >>> with gf.Graph():
    ...     y = avg_pool2d(gf.placeholder("x", (2, 3, 8, 8)), 2)
    >>> y.shape
    (2, 3, 4, 4)
    """
    return apply("avg_pool2d", x, name=name, **_dsl_attrs(kernel, stride, padding))
