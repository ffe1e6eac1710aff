"""2-D convolution (shared weights), NCHW: im2col per sample and one BLAS gemm.

    x: (N, C, H, W)   w: (F, C, KH, KW)   y: (N, F, OH, OW)
    y[n] (F, OH*OW) = w (F, C*KH*KW) @ cols(x[n]) (C*KH*KW, OH*OW)

Zero padding is handled while building the columns; no padded copy of the input is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np
from numba import njit

from graphflow.errors import ShapeError
from graphflow.ir import Node
from graphflow.ops import registry
from graphflow.ops.blas import NT, TR, gemm
from graphflow.ops.local import add_run, copy_run, expect_known, zero_run
from graphflow.ops.registry import Spec, apply, expect_ndim, fmt, register, same_float_dtype
from graphflow.ops.window import attr_pair, geometry, out_size, pair

Grads = Sequence[Node | None]
Shape4 = tuple[int | None, ...]


# -- kernels -----------------------------------------------------------------------------------

@njit(cache=True, nogil=True, inline="always")
def _valid(o_len: int, s: int, p: int, j: int, size: int) -> tuple[int, int]:
    """Output positions [lo, hi) whose input index o * s - p + j lies inside [0, size)."""
    lo = max(0, (p - j + s - 1) // s)
    hi = min(o_len, (size - 1 + p - j) // s + 1) if size - 1 + p - j >= 0 else 0
    return lo, max(lo, hi)


@njit(cache=True, nogil=True)
def im2col(xf: np.ndarray, C: int, H: int, W: int, kh: int, kw: int, sh: int, sw: int, ph: int,
           pw: int, OH: int, OW: int, cf: np.ndarray) -> None:
    """cf (flat (C*KH*KW, OH*OW)) <- the windows of one flat (C, H, W) sample, zero outside."""
    L = OH * OW
    for c in range(C):
        for i in range(kh):
            ylo, yhi = _valid(OH, sh, ph, i, H)
            for j in range(kw):
                r = ((c * kh + i) * kw + j) * L
                xlo, xhi = _valid(OW, sw, pw, j, W)
                zero_run(cf, r, ylo * OW)
                zero_run(cf, r + yhi * OW, L - yhi * OW)
                for oh in range(ylo, yhi):
                    d = r + oh * OW
                    src = (c * H + oh * sh - ph + i) * W + xlo * sw - pw + j
                    zero_run(cf, d, xlo)
                    copy_run(cf, d + xlo, xf, src, xhi - xlo, sw)
                    zero_run(cf, d + xhi, OW - xhi)


@njit(cache=True, nogil=True)
def col2im(cf: np.ndarray, C: int, H: int, W: int, kh: int, kw: int, sh: int, sw: int, ph: int,
           pw: int, OH: int, OW: int, xf: np.ndarray) -> None:
    """flat (C, H, W) xf += the windows in flat cf (C*KH*KW, OH*OW); padding is dropped."""
    L = OH * OW
    for c in range(C):
        for i in range(kh):
            ylo, yhi = _valid(OH, sh, ph, i, H)
            for j in range(kw):
                r = ((c * kh + i) * kw + j) * L
                xlo, xhi = _valid(OW, sw, pw, j, W)
                for oh in range(ylo, yhi):
                    d = r + oh * OW + xlo
                    dst = (c * H + oh * sh - ph + i) * W + xlo * sw - pw + j
                    add_run(xf, dst, cf, d, xhi - xlo, sw)


@njit(cache=True, nogil=True)
def conv_forward(x: np.ndarray, w: np.ndarray, sh: int, sw: int, ph: int, pw: int,
                 y: np.ndarray) -> None:
    N, Fo, OH, OW = y.shape
    _, C, kh, kw = w.shape
    K, L = C * kh * kw, OH * OW
    _, H, W = x.shape[1:]
    cf = np.empty(K * L, x.dtype)
    xf, wf, yf = x.reshape(x.size), w.reshape(w.size), y.reshape(y.size)
    zero = np.zeros(1, x.dtype)
    for n in range(N):
        im2col(xf[n * C * H * W:], C, H, W, kh, kw, sh, sw, ph, pw, OH, OW, cf)
        gemm(NT, NT, Fo, L, K, wf, K, cf, L, zero, yf[n * Fo * L:], L)


@njit(cache=True, nogil=True)
def conv_grad_weight(x: np.ndarray, dy: np.ndarray, sh: int, sw: int, ph: int, pw: int,
                     dw: np.ndarray) -> None:
    N, Fo, OH, OW = dy.shape
    _, C, kh, kw = dw.shape
    K, L = C * kh * kw, OH * OW
    _, H, W = x.shape[1:]
    cf = np.empty(K * L, x.dtype)
    xf, dyf, dwf = x.reshape(x.size), dy.reshape(dy.size), dw.reshape(dw.size)
    zero, one = np.zeros(1, x.dtype), np.ones(1, x.dtype)
    if N == 0:
        dwf[:] = 0
    for n in range(N):
        im2col(xf[n * C * H * W:], C, H, W, kh, kw, sh, sw, ph, pw, OH, OW, cf)
        gemm(NT, TR, Fo, K, L, dyf[n * Fo * L:], L, cf, L, zero if n == 0 else one, dwf, K)


@njit(cache=True, nogil=True)
def conv_grad_input(w: np.ndarray, dy: np.ndarray, sh: int, sw: int, ph: int, pw: int,
                    dx: np.ndarray) -> None:
    """dx (zeroed) += col2im(w.T @ dy[n]) for every sample n."""
    N, Fo, OH, OW = dy.shape
    _, C, kh, kw = w.shape
    K, L = C * kh * kw, OH * OW
    _, H, W = dx.shape[1:]
    cf = np.empty(K * L, dx.dtype)
    wf, dyf, dxf = w.reshape(w.size), dy.reshape(dy.size), dx.reshape(dx.size)
    zero = np.zeros(1, dx.dtype)
    for n in range(N):
        gemm(TR, NT, K, L, Fo, wf, K, dyf[n * Fo * L:], L, zero, cf, L)
        col2im(cf, C, H, W, kh, kw, sh, sw, ph, pw, OH, OW, dxf[n * C * H * W:])


# -- op definitions ----------------------------------------------------------------------------

def _geo(attrs: dict[str, Any], kernel: tuple[int, int]) -> dict[str, Any]:
    return {"kernel": kernel, "stride": attrs.get("stride", 1), "padding": attrs.get("padding", 0)}


def _check_dy(dy: Shape4, n: int | None, f: int, oh: int, ow: int) -> int | None:
    if tuple(dy[1:]) != (f, oh, ow) or (None not in (n, dy[0]) and n != dy[0]):
        raise ShapeError(f"output gradient is {fmt(dy)}, expected ({'N' if n is None else n}, "
                         f"{f}, {oh}, {ow})")
    return n if n is not None else dy[0]


def _infer_conv2d(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x, w = ins
    expect_ndim(x, 4, "input", "(N, C, H, W)")
    expect_ndim(w, 4, "weight", "(F, C, KH, KW)")
    dtype = same_float_dtype(ins)
    expect_known(x.shape, (1, 2, 3), "input")
    expect_known(w.shape, range(4), "weight")
    if w.shape[1] != x.shape[1]:
        raise ShapeError(f"weight is {fmt(w.shape)} for {w.shape[1]} input channels, but the "
                         f"input {fmt(x.shape)} has {x.shape[1]}")
    oh, ow = out_size(x.shape[2], x.shape[3], _geo(attrs, w.shape[2:]))
    return Spec((x.shape[0], w.shape[0], oh, ow), dtype)


def _infer_grad_input(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    w, dy = ins
    expect_ndim(w, 4, "weight", "(F, C, KH, KW)")
    expect_ndim(dy, 4, "output gradient", "(N, F, OH, OW)")
    dtype = same_float_dtype(ins)
    expect_known(w.shape, range(4), "weight")
    h, wd = pair(attrs["input_hw"], "input_hw", 1)
    oh, ow = out_size(h, wd, _geo(attrs, w.shape[2:]))
    n = _check_dy(dy.shape, dy.shape[0], w.shape[0], oh, ow)
    return Spec((n, w.shape[1], h, wd), dtype)


def _infer_grad_weight(ins: Sequence[Spec], attrs: dict[str, Any]) -> Spec:
    x, dy = ins
    expect_ndim(x, 4, "input", "(N, C, H, W)")
    expect_ndim(dy, 4, "output gradient", "(N, F, OH, OW)")
    dtype = same_float_dtype(ins)
    expect_known(x.shape, (1, 2, 3), "input")
    kh, kw = geometry(attrs)[:2]
    oh, ow = out_size(x.shape[2], x.shape[3], attrs)
    if dy.shape[1] is None:
        raise ShapeError(f"output gradient {fmt(dy.shape)} needs a known filter count (dim 1)")
    _check_dy(dy.shape, x.shape[0], dy.shape[1], oh, ow)
    return Spec((dy.shape[1], x.shape[1], kh, kw), dtype)


def _conv2d_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, w = (np.ascontiguousarray(a) for a in ins)
    _, _, sh, sw, ph, pw = geometry(_geo(attrs, w.shape[2:]))
    oh, ow = out_size(x.shape[2], x.shape[3], _geo(attrs, w.shape[2:]))
    y = np.empty((x.shape[0], w.shape[0], oh, ow), x.dtype)
    conv_forward(x, w, sh, sw, ph, pw, y)
    return y


def _grad_input_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    w, dy = (np.ascontiguousarray(a) for a in ins)
    _, _, sh, sw, ph, pw = geometry(_geo(attrs, w.shape[2:]))
    dx = np.zeros((dy.shape[0], w.shape[1], *attrs["input_hw"]), dy.dtype)
    conv_grad_input(w, dy, sh, sw, ph, pw, dx)
    return dx


def _grad_weight_forward(ins: Sequence[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, dy = (np.ascontiguousarray(a) for a in ins)
    kh, kw, sh, sw, ph, pw = geometry(attrs)
    dw = np.empty((dy.shape[1], x.shape[1], kh, kw), x.dtype)
    conv_grad_weight(x, dy, sh, sw, ph, pw, dw)
    return dw


def _conv2d_grad(node: Node, dy: Node, wants: tuple[bool, ...]) -> Grads:
    x, w = node.inputs
    geo = {"stride": node.attrs.get("stride", 1), "padding": node.attrs.get("padding", 0)}
    return [apply("conv2d_grad_input", w, dy, input_hw=tuple(x.shape[2:]), **geo)
            if wants[0] else None,
            apply("conv2d_grad_weight", x, dy, kernel=tuple(w.shape[2:]), **geo)
            if wants[1] else None]


def _cost(weight: int, grad: int) -> registry.CostFn:
    """2 N F OH OW C KH KW flops: a dot product of C KH KW terms (w is (F, C, KH, KW)) per
    element of y or dy (N, F, OH, OW)."""
    return registry.dot_cost(weight, grad, lambda w: prod(w[1:]))


register("conv2d", _infer_conv2d, _conv2d_forward, _conv2d_grad, _cost(1, 2),
         doc="2-D convolution, NCHW: x (N, C, H, W), w (F, C, KH, KW) -> (N, F, OH, OW); "
             "attrs stride, padding")
register("conv2d_grad_input", _infer_grad_input, _grad_input_forward, None, _cost(0, 1),
         doc="gradient of conv2d wrt its input: (w, dy) -> (N, C, H, W); attrs stride, "
             "padding, input_hw")
register("conv2d_grad_weight", _infer_grad_weight, _grad_weight_forward, None, _cost(2, 1),
         doc="gradient of conv2d wrt its weight: (x, dy) -> (F, C, KH, KW); attrs kernel, "
             "stride, padding")


# -- the DSL's functions -----------------------------------------------------------------------

def conv2d(x: Node, w: Node, stride: int | tuple[int, int] = 1,
           padding: int | tuple[int, int] = 0, name: str | None = None) -> Node:
    """2-D convolution in NCHW layout with zero padding; the kernel size is w's (KH, KW).

    >>> import graphflow as gf
    >>> from graphflow.ops.conv import conv2d
    >>> with gf.Graph() as g:
    ...     x = gf.placeholder("x", (None, 3, 8, 8))
    ...     w = gf.parameter("w", (4, 3, 3, 3))
    ...     y = conv2d(x, w, stride=2, padding=1)
    >>> y.shape
    (None, 4, 4, 4)
    """
    return apply("conv2d", x, w, name=name, stride=attr_pair(stride, "stride", 1),
                 padding=attr_pair(padding, "padding", 0))
